#!/usr/bin/env bash
# Device side of the CUDA backend's checks, run on the GPU machine from the checkout with the carry
# folder (scripts/gpu_carry.sh: bin/ or bin.tar.xz, lib/, optionally shared/fixtures/oracle; the
# tests read the checkout's tests/fixtures). Logs go to $OUT (or ./gpu-out).
# Usage: scripts/gpu_run.sh [basic|bench|lanes|profile|all] [CARRY_DIR] [flags]
#   basic    nvidia-smi, the backend tests (ops vs the CPU reference, engine vs the oracle fixtures)
#   bench    scripts/gpu_decode.sh on flash-mini: --lanes (default local,host,peer) at --batches
#            (default 1,8,16,32), --pdl (default both: off, on, off per batch size); with --base BIN
#            each run is bracketed by another build's bench_gpu_decode (base, this, base)
#   lanes    scripts/gpu_lanes.sh: `tandem bench` of the lanes on flash-mini and the check gate
#   profile  scripts/gpu_profile.sh --ncu at one sequence
#   all      basic and bench (the default)
# CARRY_DIR defaults to the checkout. Flags other than the step go to the step's script (bench:
# scripts/gpu_decode.sh --lanes, --batches, --steps, --pdl, --base, ...; lanes: scripts/gpu_lanes.sh
# --lanes, --users, --split, ...; each script's --help lists its own).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env MODEL_DIR --model LANES --lanes PEER_THREADS --peer-threads SPIN_LIMIT --spin-limit BATCHES --batches \
  STEPS --steps PDL --pdl
step=all carry_dir="" step_flags=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    basic|bench|lanes|profile|all) step=$1 ;;
    --no-bench|--no-check|--resynth) step_flags+=("$1") ;;
    -*) v=$(flag_value "$@") || exit 2; step_flags+=("$1" "$v"); shift ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
carry_setup "${carry_dir:-$(cd "$here/.." && pwd)}"
summary=()

if [[ $step == basic || $step == all ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$final/nvidia-smi.txt"
  t0=$(date +%s.%N)
  "$carry/bin/tandem_backend_tests" --gtest_brief=1 2>&1 | tee "$final/backend_tests.log"
  rc=${PIPESTATUS[0]}
  summary+=("backend tests: exit $rc ($(grep -c 'OK \]' "$final/backend_tests.log" || true) ok lines; $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$t0}") s)")
  summary+=("$(grep -E '^\[  (PASSED|FAILED)' "$final/backend_tests.log" | tr '\n' ' ')")
fi
if [[ $step == bench || $step == all ]]; then
  TANDEM_GPU_NESTED=1 "$here/gpu_decode.sh" "$carry" --lanes local,host,peer --pdl both "${step_flags[@]}"
  summary+=("bench: exit $? (logs in $out)")
  for f in "$out"/decode-*.txt; do [ -f "$f" ] && summary+=("== $(basename "$f")" "$(tail -20 "$f")"); done
fi
if [[ $step == lanes ]]; then
  TANDEM_GPU_NESTED=1 "$here/gpu_lanes.sh" "$carry" "${step_flags[@]}"
  summary+=("lanes: exit $? (logs in $out)")
  for f in "$out"/bench-*.txt; do [ -f "$f" ] && summary+=("== $(basename "$f")" "$(tail -20 "$f")"); done
fi
if [[ $step == profile ]]; then
  TANDEM_GPU_NESTED=1 "$here/gpu_profile.sh" "$carry" --ncu --batches 1 "${step_flags[@]}"
  summary+=("profile: exit $? (logs in $out)")
fi
tar czf "$final/results.tgz" -C "$out" . 2>/dev/null
echo "==== summary"
printf '%s\n' "${summary[@]}"
exit 0
