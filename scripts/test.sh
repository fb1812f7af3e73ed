#!/usr/bin/env bash
# The test command: builds tandem twice (release; ASan+UBSan) and runs every CTest label in both, then
# the fuzz targets briefly. Reads the repo's own fixtures (tests/fixtures); the extra set in ../shared
# (or $TANDEM_SHARED) is run too when it is there, and skipped, saying so, when not. GPU tests exit 77
# (skipped: no CUDA device) on machines without a GPU. Each stage prints passed / failed / skipped with
# why; the last line totals them. Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
summaries=()

# run_stage NAME BUILD_DIR TIMEOUT [env...]: ctest in BUILD_DIR, its JUnit summarised (a failure is fatal).
run_stage() {
  local name=$1 dir=$2 timeout=$3
  shift 3
  echo "== test.sh: $name: running the tests (ctest -j $(nproc))"
  local rc=0
  (cd "$dir" && env "$@" ctest --output-on-failure -j "$(nproc)" --timeout "$timeout" --output-junit junit.xml) || rc=$?
  python3 scripts/lib/ctest_summary.py "$dir/junit.xml" "$name" | tee "$dir/summary.txt" || rc=1
  summaries+=("$(tail -n 1 "$dir/summary.txt")")
  if [ "$rc" -ne 0 ]; then
    echo "test.sh: $name failed"
    exit "$rc"
  fi
}

echo "== test.sh: release build (build/)"
scripts/build.sh build
run_stage release build 600

# Sanitizers: no CUDA here (nvcc does not take -fsanitize), benchmarks not needed.
# -O1: sanitizer builds compile faster and still run the oracle tests in seconds.
echo "== test.sh: ASan+UBSan build (build-asan/)"
scripts/build.sh build-asan -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1"
run_stage asan build-asan 900 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

if [ -x scripts/fuzz.sh ]; then
  echo "== test.sh: fuzzing (20 s a target)"
  scripts/fuzz.sh 20
fi

# One closing line over both stages.
total=$(printf '%s\n' "${summaries[@]}" | awk -F'[:,] *' '{for (i = 2; i <= NF; i++) {split($i, a, " "); s[a[2]] += a[1]}}
  END {printf "%d passed, %d failed, %d skipped", s["passed"], s["failed"], s["skipped"]}')
echo "test.sh: all passed"
echo "tests: $total"
