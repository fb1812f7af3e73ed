#!/usr/bin/env bash
# Configures and builds into build/ (release) or the folder given as $1 with extra CMake args after it.
# $TANDEM_TARGETS (e.g. "tandem") builds only those targets; $TANDEM_JOBS sets the parallel jobs.
# Prints what it does; ninja's [done/total] counter shows the progress (a first build takes minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=${TANDEM_JOBS:-$(nproc)}
targets=()
for t in ${TANDEM_TARGETS:-}; do targets+=(--target "$t"); done
mkdir -p "$dir"
echo "build: configuring $dir with CMake (Release${*:+ $*}; log: $dir/configure.log)"
if ! cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$dir/configure.log" 2>&1; then
  cat "$dir/configure.log"
  echo "build: CMake failed (above); scripts/setup.sh installs what tandem builds with" >&2
  exit 1
fi
echo "build: compiling ${TANDEM_TARGETS:-every target} with $jobs jobs; [done/total] counts the steps" \
     "(a first build takes a few minutes per core, a rebuild seconds)"
start=$SECONDS
cmake --build "$dir" -j "$jobs" "${targets[@]}"
echo "build: $dir up to date in $((SECONDS - start)) s"
