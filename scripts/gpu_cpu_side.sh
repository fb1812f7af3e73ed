#!/usr/bin/env bash
# The CPU side of the GPU machine's host (where the CPU peer runs): the handoff round trip through
# shared memory (bench_handoff), CPU decode on the mid preset (bench_cpu_decode) and, with --kernels,
# the CPU kernels' bandwidth (bench_kernels). Logs and JSON under $OUT/work, packed into
# $OUT/results.tgz.
# Usage: scripts/gpu_cpu_side.sh CARRY_DIR [--kernels] [--threads N]
#   --kernels     also bench_kernels
#   --threads N   bench_kernels' threads (default: the machine's cores)
#   -h, --help    this text
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env KERNELS --kernels SKIP_CPU "scripts/gpu_bench.sh --no-cpu"

kernels=0 threads=$(nproc) carry_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --kernels) kernels=1 ;;
    --threads) threads=$(flag_value "$@") || exit 2; shift ;;
    -*) echo "error: unknown flag $1 (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
carry_setup "$carry_dir"
[ "${TANDEM_GPU_NESTED:-0}" = 1 ] || log_machine

timeout 40 "$carry/bin/bench_handoff" --iters 20000 --out "$out/handoff.json" > "$out/handoff.txt" 2>&1
log "bench_handoff: exit $?"
"$T" synth --preset mid --out /tmp/mid --log-level warn > /dev/null 2>&1
timeout 60 "$carry/bin/bench_cpu_decode" --model /tmp/mid --users 1,4 --tokens 32 --out "$out/cpu_decode.json" \
  > "$out/cpu_decode.txt" 2>&1
log "bench_cpu_decode: exit $? $(tail -2 "$out/cpu_decode.txt" | tr '\n' ' ')"
if [ "$kernels" = 1 ]; then
  timeout 40 "$carry/bin/bench_kernels" --threads "$threads" --out "$out/kernels.json" > "$out/kernels.txt" 2>&1
  log "bench_kernels: exit $?"
fi
carry_finish "$out/handoff.txt" "$out/cpu_decode.txt" "$out/kernels.txt"
