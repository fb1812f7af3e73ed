#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian 12 (run as root or with sudo), and says what.
# Idempotent: does nothing when every package is already there.
# The end-to-end tests of `tandem serve` (tests/e2e) also need node with npm (Debian's nodejs and npm,
# unless a node is already installed from elsewhere), chromium, haproxy, and the npm packages pinned in
# tests/e2e/package-lock.json (installed there with `npm ci`; again only when the lock file changed).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(build-essential cmake ninja-build pkg-config git
          nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libfmt-dev libspdlog-dev libpcre2-dev libutf8proc-dev
          libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev python3
          chromium haproxy)
# node and npm: Debian's, unless a node is already there (e.g. one from nodesource, which bundles npm
# and conflicts with Debian's npm package).
if ! command -v node >/dev/null; then
  packages+=(nodejs npm)
elif ! command -v npm >/dev/null; then
  if dpkg-query -W -f='${Version}' nodejs 2>/dev/null | grep -q nodesource; then
    echo "setup: node $(node --version) is installed from nodesource but npm is missing; reinstall that nodejs" >&2
    exit 1
  fi
  packages+=(npm)
fi
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
echo "setup: node $(node --version), npm $(npm --version)"

# The e2e tests' npm packages (the official openai client, ws), exactly as the lock file pins them.
e2e=tests/e2e
lock_sum=$(sha256sum "$e2e/package-lock.json" | cut -d' ' -f1)
stamp="$e2e/node_modules/.tandem-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_sum" ]; then
  echo "setup: $e2e/node_modules matches package-lock.json"
else
  echo "setup: npm ci in $e2e (the packages pinned in package-lock.json, from the npm registry)"
  (cd "$e2e" && npm ci --no-audit --no-fund)
  echo "$lock_sum" >"$stamp"
fi
