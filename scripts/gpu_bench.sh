#!/usr/bin/env bash
# The measured run on the GPU machine, in one call: the backend tests, then the lanes
# (scripts/gpu_lanes.sh: the bracketed lane benchmark on flash-mini and the check gate), then the CPU
# side of the host (scripts/gpu_cpu_side.sh). Decode variants and profiles have scripts of their own
# (scripts/gpu_decode.sh, scripts/gpu_profile.sh). Run from the checkout with the carry folder
# (scripts/gpu_carry.sh); logs and results go to $OUT/work, packed into $OUT/results.tgz.
# Usage: scripts/gpu_bench.sh CARRY_DIR [flags] [gpu_lanes.sh flags]
#   --no-tests         skip the backend tests; --test-timeout S bounds them (default 150 s)
#   --no-lanes         skip scripts/gpu_lanes.sh
#   --no-cpu           skip scripts/gpu_cpu_side.sh; --kernels adds bench_kernels to it
#   -h, --help         this text (scripts/gpu_lanes.sh --help lists the lane flags)
# Any other flag goes to scripts/gpu_lanes.sh (e.g. --lanes host,peer,host --users 1,8).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env SKIP_TESTS --no-tests TEST_TIMEOUT --test-timeout SKIP_CPU --no-cpu KERNELS --kernels \
  DECODE "scripts/gpu_decode.sh" DECODE_BASE "scripts/gpu_decode.sh --base" VARIANTS "scripts/gpu_decode.sh --variants" \
  BREAKDOWN "scripts/gpu_profile.sh --breakdown" NCU "scripts/gpu_profile.sh --ncu"

tests=1 test_timeout=150 lanes=1 cpu=1 cpu_flags=() lane_flags=() carry_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --no-tests) tests=0 ;;
    --test-timeout) test_timeout=$(flag_value "$@") || exit 2; shift ;;
    --no-lanes) lanes=0 ;;
    --no-cpu) cpu=0 ;;
    --kernels) cpu_flags+=(--kernels) ;;
    --no-bench|--no-check|--resynth) lane_flags+=("$1") ;;
    -*) v=$(flag_value "$@") || exit 2; lane_flags+=("$1" "$v"); shift ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
carry_setup "$carry_dir"
log_machine
if [ "$tests" = 1 ]; then
  timeout "$test_timeout" "$carry/bin/tandem_backend_tests" --gtest_brief=1 > "$out/backend_tests.log" 2>&1
  log "backend tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$out/backend_tests.log" | tr '\n' ' ')"
fi
export TANDEM_GPU_NESTED=1
[ "$lanes" = 1 ] && "$here/gpu_lanes.sh" "$carry" "${lane_flags[@]}"
[ "$cpu" = 1 ] && "$here/gpu_cpu_side.sh" "$carry" "${cpu_flags[@]}"
export TANDEM_GPU_NESTED=0
carry_finish "$out"/bench-*.txt
