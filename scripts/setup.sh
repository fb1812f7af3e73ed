#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian 12 (run as root or with sudo), and says what.
# Idempotent: does nothing when every package is already there.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config git
          nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libfmt-dev libspdlog-dev libpcre2-dev libutf8proc-dev
          libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: ${#missing[@]} of ${#packages[@]} packages to install: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: apt-get update"
  $SUDO apt-get update -q
  echo "setup: apt-get install (with their dependencies; a minute or a few on a fresh machine)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "setup: all ${#packages[@]} packages present (${packages[*]})"
