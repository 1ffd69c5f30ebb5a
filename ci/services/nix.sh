# shellcheck shell=bash
# Nix for the flake checks (tests/integration/test_flake_eval.py), on a fresh Debian/Ubuntu CI machine.
# Sourced by ci/test.sh; idempotent, so running it again changes nothing.
#
#   - apt-installs nix-bin when `nix` is missing (Debian's Nix; as root it uses /nix/store directly and needs
#     no daemon);
#   - exports NIX_CONFIG with flakes on and no binary cache: none is reachable from CI, and a substituter
#     that cannot be reached only adds timeouts. Nothing here fetches nixpkgs: the tests evaluate the flake
#     against nix/stub-nixpkgs and build only its input-less part.

_servematrix_nix_main() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  if ! command -v nix >/dev/null 2>&1; then
    echo "nix: installing nix-bin"
    $sudo apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nix-bin >/dev/null || return 1
  fi
  export NIX_CONFIG=$'experimental-features = nix-command flakes\nsubstituters ='
  echo "nix: $(nix --version) (NIX_CONFIG: flakes on, no substituters)"
}

_servematrix_nix_main || {
  echo "nix: setup failed" >&2
  false
}
