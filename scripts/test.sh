#!/usr/bin/env bash
# The test command: builds tandem twice (release; ASan+UBSan) and runs every CTest label in both,
# then the fuzz targets briefly. GPU tests exit 77 (skipped) on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)
# Sanitizers: no CUDA here (nvcc does not take -fsanitize), benchmarks not needed.
# -O1: sanitizer builds compile faster and still run the oracle tests in seconds.
scripts/build.sh build-asan -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$(nproc)" --timeout 900)
if [ -x scripts/fuzz.sh ]; then scripts/fuzz.sh 20; fi
echo "test.sh: all passed"
