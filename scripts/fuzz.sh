#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp) with clang into build-fuzz and runs each for
# SECONDS seconds from its seed corpus (tests/fuzz/corpus/<name without fuzz_>/, plus <that>.dict as
# dictionary when present). Prints inputs tried and crashes per target; exits non-zero on any crash.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
dir=build-fuzz
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (needed for libFuzzer)" >&2
  exit 1
fi

targets=()
for source in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$source" .cpp)"); done
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON -DTANDEM_TESTS=ON -DTANDEM_CUDA=OFF -DTANDEM_BENCH=OFF >/dev/null
cmake --build "$dir" -j2 --target "${targets[@]}"

failed=0
for t in "${targets[@]}"; do
  seeds="tests/fuzz/corpus/${t#fuzz_}"
  work="$dir/fuzz/corpus/$t"        # grows across runs; the seeds in the repo stay untouched
  artifacts="$dir/fuzz/artifacts/$t"
  log="$dir/fuzz/$t.log"
  mkdir -p "$work" "$artifacts"
  rm -f "$artifacts"/*
  corpora=("$work")
  if [ -d "$seeds" ]; then corpora+=("$seeds"); fi
  dict=()
  if [ -f "$seeds.dict" ]; then dict=(-dict="$seeds.dict"); fi
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$dir/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${dict[@]}" "${corpora[@]}" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(find "$artifacts" -type f | wc -l)
  echo "$t: ${execs:-?} execs, $crashes crashes (log: $log)"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    tail -n 40 "$log"
    find "$artifacts" -type f -printf '  reproducer: %p\n'
  fi
done
exit "$failed"
