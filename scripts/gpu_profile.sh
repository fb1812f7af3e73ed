#!/usr/bin/env bash
# Where a decode step's time goes, on the GPU machine (local lane of flash-mini): per-kernel GPU times
# of eager steps (bench_gpu_decode --breakdown: graphs and PDL off, each launch between two events),
# and/or Nsight Compute's own kernel times of two graph-replayed steps (ncu, clocks left alone, one
# metric pass; scripts/ncu_step.py sums them per kernel and grid). Logs under $OUT/work, packed into
# $OUT/results.tgz.
# Usage: scripts/gpu_profile.sh CARRY_DIR [flags]   (at least one of --breakdown, --ncu)
#   --breakdown N     N eager steps per cell under bench_gpu_decode's KernelProfile
#   --ncu             Nsight Compute (needs ncu on the machine)
#   --batches "B ..." sequences (default "1 8")
#   --prompts "N ..." prompt lengths (default "16 120" for --breakdown, "16" for --ncu)
#   --ncu-skip N      launches ncu skips before it measures (default 700: prefill and warm-up)
#   --model DIR       where flash-mini lives (default /tmp/flash-mini; synthesised when missing)
#   -h, --help        this text
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env BREAKDOWN --breakdown NCU --ncu NCU_BATCHES --batches NCU_PROMPTS --prompts NCU_SKIP --ncu-skip

breakdown=0 ncu=0 batches="1 8" prompts="" ncu_skip=700 model=/tmp/flash-mini carry_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --breakdown) breakdown=$(flag_value "$@") || exit 2; shift ;;
    --ncu) ncu=1 ;;
    --batches) batches=$(flag_value "$@") || exit 2; shift ;;
    --prompts) prompts=$(flag_value "$@") || exit 2; shift ;;
    --ncu-skip) ncu_skip=$(flag_value "$@") || exit 2; shift ;;
    --model) model=$(flag_value "$@") || exit 2; shift ;;
    -*) echo "error: unknown flag $1 (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
if [ "$breakdown" = 0 ] && [ "$ncu" = 0 ]; then
  echo "error: nothing to do: give --breakdown N and/or --ncu (--help)" >&2
  exit 2
fi
carry_setup "$carry_dir"
[ "${TANDEM_GPU_NESTED:-0}" = 1 ] || log_machine
synth_flash_mini "$model" 0 0 || { carry_finish; exit 1; }
bin="$carry/bin/bench_gpu_decode"

if [ "$breakdown" != 0 ]; then
  for pr in ${prompts:-16 120}; do
    timeout 120 "$bin" --model "$model" --lanes local --batches "$(echo $batches | tr ' ' ',')" --prompt "$pr" \
      --breakdown "$breakdown" --json "$out/breakdown-$pr.json" > "$out/breakdown-$pr.txt" 2>&1
    log "bench_gpu_decode --breakdown $breakdown --prompt $pr: exit $?"
  done
fi
if [ "$ncu" = 1 ]; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  [ -n "$ncu_bin" ] || { log "ncu: not found on this machine"; carry_finish; exit 1; }
  for b in $batches; do
    for pr in ${prompts:-16}; do
      timeout 200 "$ncu_bin" --clock-control none --csv --page raw --launch-skip "$ncu_skip" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread \
        "$bin" --model "$model" --lanes local --batches "$b" --prompt "$pr" --steps 2 --pdl 1 \
        > "$out/ncu-$b-$pr.csv" 2> "$out/ncu-$b-$pr.log"
      log "ncu bench_gpu_decode --batches $b --prompt $pr: exit $?"
      python3 "$here/ncu_step.py" "$out/ncu-$b-$pr.csv" 2 > "$out/ncu-$b-$pr.txt" 2>&1
    done
  done
fi
carry_finish "$out"/breakdown-*.txt "$out"/ncu-*.txt
