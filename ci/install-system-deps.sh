#!/usr/bin/env bash
# System packages and Python tools the test suite needs, on a fresh Debian/Ubuntu machine (as root, or
# with sudo). Idempotent: safe to run again. Python packages of the suite itself are installed by nox.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  git
  procps
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# nox drives the sessions; uv builds nox's venvs and every cell environment.
python3 -m pip install --quiet --disable-pip-version-check "nox>=2024.4.15" "uv>=0.5"
