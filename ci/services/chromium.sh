# shellcheck shell=bash
# Headless Chromium (Debian's `chromium` package) for the test that loads the published HTML page.
# Sourced by ci/test.sh; idempotent: installs the package only when it is missing, and exports
# SERVEMATRIX_CHROMIUM with the browser's path. On failure it exports SERVEMATRIX_CHROMIUM_ERROR instead and
# returns 0, so the other tests still run and the browser test fails with that message.

_servematrix_chromium_main() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
    echo "chromium: installing"
    $sudo apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null || return 1
  fi
  local browser
  browser="$(command -v chromium || true)"
  if [ -z "$browser" ]; then
    echo "chromium: the package is installed but no chromium is on PATH" >&2
    return 1
  fi
  export SERVEMATRIX_CHROMIUM="$browser"
  echo "chromium: export SERVEMATRIX_CHROMIUM=$SERVEMATRIX_CHROMIUM ($("$browser" --version 2>/dev/null | head -n 1))"
}

unset SERVEMATRIX_CHROMIUM_ERROR
_servematrix_chromium_main || {
  export SERVEMATRIX_CHROMIUM_ERROR="chromium setup failed (ci/services/chromium.sh); see its output above"
  echo "chromium: $SERVEMATRIX_CHROMIUM_ERROR" >&2
}
