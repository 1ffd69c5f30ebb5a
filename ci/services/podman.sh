# shellcheck shell=bash
# Podman for the container backend's integration tests, on a fresh Debian/Ubuntu CI machine.
# Sourced by ci/test.sh (it exports CONTAINERS_CONF); idempotent, so running it again changes nothing.
#
#   - apt-installs podman, runc, catatonit (what `podman run --init` runs) and debootstrap when missing;
#   - writes a containers.conf: the runc runtime (crun fails on hybrid cgroups) and ulimits root may set;
#   - creates the base image localhost/bookworm-base with debootstrap when it does not exist: no container
#     registry is reachable from CI, so the base comes from the distribution mirror this machine's apt uses.
#
# Settings (environment): SERVEMATRIX_CI_DIR (where the config lives; default .servematrix/ci),
# SERVEMATRIX_BASE_IMAGE (default localhost/bookworm-base), SERVEMATRIX_APT_MIRROR (default: read from
# /etc/apt/sources.list.d/ and /etc/apt/sources.list).

_servematrix_podman_main() {
  local sudo="" ci_dir conf base suite mirror rootfs
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  ci_dir="${SERVEMATRIX_CI_DIR:-$PWD/.servematrix/ci}"
  conf="$ci_dir/containers.conf"
  base="${SERVEMATRIX_BASE_IMAGE:-localhost/bookworm-base}"

  local packages=(podman runc catatonit debootstrap) missing=() pkg
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "podman: installing ${missing[*]}"
    $sudo apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null || return 1
  fi

  mkdir -p "$ci_dir" || return 1
  local wanted
  wanted='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
'
  if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$(printf '%s' "$wanted")" ]; then
    printf '%s' "$wanted" >"$conf" || return 1
  fi
  export CONTAINERS_CONF="$conf"
  echo "podman: export CONTAINERS_CONF=$CONTAINERS_CONF"

  if ! podman image exists "$base"; then
    suite="$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release | tr -d '"')"
    if [ -z "$suite" ]; then
      echo "podman: cannot tell the distribution's codename from /etc/os-release" >&2
      return 1
    fi
    mirror="${SERVEMATRIX_APT_MIRROR:-$(_servematrix_apt_mirror "$suite")}"
    if [ -z "$mirror" ]; then
      echo "podman: no apt source for suite $suite in /etc/apt; set SERVEMATRIX_APT_MIRROR" >&2
      return 1
    fi
    rootfs="$(mktemp -d)"
    echo "podman: debootstrap $suite from $mirror into $base"
    if ! $sudo debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$ci_dir/debootstrap.log" 2>&1; then
      tail -n 20 "$ci_dir/debootstrap.log" >&2
      $sudo rm -rf "$rootfs"
      return 1
    fi
    $sudo tar -C "$rootfs" -c . | podman import --quiet - "$base" >/dev/null || {
      $sudo rm -rf "$rootfs"
      return 1
    }
    $sudo rm -rf "$rootfs"
  fi
  echo "podman: base image $base $(podman image inspect --format '{{.Id}}' "$base" | cut -c1-12)"
}

# The first mirror (URI) that serves the suite itself, not its -updates/-security parts, from the apt sources
# in deb822 (*.sources) or one-line (*.list) format.
_servematrix_apt_mirror() {
  local suite="$1" file
  for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -f "$file" ] || continue
    case "$file" in
      *.sources)
        awk -v suite="$suite" '
          function flush() { if (uri != "" && found && deb) { print uri; exit } uri = ""; found = 0; deb = 0 }
          /^[[:space:]]*$/ { flush(); next }
          /^[[:space:]]*#/ { next }
          tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
          tolower($1) == "uris:" { uri = $2 }
          tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) found = 1 }
          END { if (uri != "" && found && deb) print uri }
        ' "$file" | head -n 1
        ;;
      *)
        awk -v suite="$suite" '
          $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == suite) { print $i; exit }
          }
        ' "$file"
        ;;
    esac
  done | head -n 1
}

_servematrix_podman_main || {
  echo "podman: setup failed" >&2
  false
}
