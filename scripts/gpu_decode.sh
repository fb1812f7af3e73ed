#!/usr/bin/env bash
# Decode step times of the CUDA engine on the GPU machine (bench_gpu_decode on flash-mini): the lanes
# at each batch size, optionally bracketed against another build's bench_gpu_decode (base, this,
# base on the same box, for a before/after), or kernel variants timed in turn on one engine. The peer
# lane gets a fresh `tandem peer` (the carry's tandem) per run, on --rowmap or on the stand-in cold
# tail that bench_gpu_decode writes. Logs and JSON under $OUT/work, packed into $OUT/results.tgz.
# Usage: scripts/gpu_decode.sh CARRY_DIR [flags]
#   --lanes LIST       local, host, peer (default local)
#   --batches LIST     sequences per step (default 1,8,16,32)
#   --prompts "N ..."  prompt lengths, one run each (default 16)
#   --steps N          timed steps per cell (default 64)
#   --pdl 0|1|both     bench_gpu_decode --pdl (default 1)
#   --reps N           runs per prompt length (default 1)
#   --base BIN         another bench_gpu_decode (e.g. the carry's bin/base/bench_gpu_decode): each rep
#                      runs it, then this carry's, then it again (the A/B/A bracket)
#   --variants "V1,V2;W1,W2"  instead: one bench_gpu_decode --variants run per ';'-separated list
#                      (configurations timed in turn on one engine, e.g. "base,rows8,mma0,base" or
#                      "base,x2:attention_mla,base"); run i takes item i of --variant-lanes and
#                      --variant-batches (';'-separated, the last item standing for the rest)
#   --variant-lanes L  (default local); --variant-batches B (default 1,8,16,32)
#   --rowmap FILE      cold lists for host and peer (default: the stand-in cold tail, 89/384 cold)
#   --peer-threads N   the peer's --threads (default 14)
#   --spin-limit US    the primary's --peer-spin-limit (default 2000)
#   --model DIR        where flash-mini lives (default /tmp/flash-mini; synthesised when missing)
#   -h, --help         this text
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env DECODE "scripts/gpu_decode.sh" DECODE_PROMPTS --prompts DECODE_REPS --reps DECODE_BASE --base PDL --pdl \
  VARIANTS --variants VARIANT_LANES --variant-lanes VARIANT_BATCHES --variant-batches VARIANT_PROMPT --prompts

lanes=local batches=1,8,16,32 prompts=16 steps=64 pdl=1 reps=1 base="" variants="" variant_lanes=local
variant_batches=1,8,16,32 rowmap="" peer_threads=14 spin_limit=2000 model=/tmp/flash-mini carry_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --lanes) lanes=$(flag_value "$@") || exit 2; shift ;;
    --batches) batches=$(flag_value "$@") || exit 2; shift ;;
    --prompts) prompts=$(flag_value "$@") || exit 2; shift ;;
    --steps) steps=$(flag_value "$@") || exit 2; shift ;;
    --pdl) pdl=$(flag_value "$@") || exit 2; shift ;;
    --reps) reps=$(flag_value "$@") || exit 2; shift ;;
    --base) base=$(flag_value "$@") || exit 2; shift ;;
    --variants) variants=$(flag_value "$@") || exit 2; shift ;;
    --variant-lanes) variant_lanes=$(flag_value "$@") || exit 2; shift ;;
    --variant-batches) variant_batches=$(flag_value "$@") || exit 2; shift ;;
    --rowmap) rowmap=$(flag_value "$@") || exit 2; shift ;;
    --peer-threads) peer_threads=$(flag_value "$@") || exit 2; shift ;;
    --spin-limit) spin_limit=$(flag_value "$@") || exit 2; shift ;;
    --model) model=$(flag_value "$@") || exit 2; shift ;;
    -*) echo "error: unknown flag $1 (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
carry_setup "$carry_dir"
if [ -n "$base" ]; then
  [ -x "$base" ] || chmod +x "$base" 2>/dev/null
  [ -f "$base" ] && [ -x "$base" ] || { echo "error: --base $base: not an executable file ($(ls -l "$base" 2>&1))" >&2; exit 2; }
fi
[ "${TANDEM_GPU_NESTED:-0}" = 1 ] || log_machine
synth_flash_mini "$model" 0 0 || { carry_finish; exit 1; }
new_bin="$carry/bin/bench_gpu_decode"

# Cold lists for the host and peer lanes: --rowmap, or the stand-in cold tail (written once).
if [ -z "$rowmap" ]; then
  rowmap="$out/cold-tail-rowmap.json"
  "$new_bin" --model "$model" --write-rowmap "$rowmap" 2>> "$out/decode.log"
  log "rowmap: the stand-in cold tail ($rowmap)"
fi

# decode_run BIN LABEL LANES BATCHES PROMPT [extra bench_gpu_decode flags]: one bench_gpu_decode run,
# with a fresh peer when its lanes include peer.
decode_run() {
  local bin=$1 label=$2 dl=$3 db=$4 pr=$5 peer_args=()
  shift 5
  if [[ ,$dl, == *,peer,* ]]; then
    start_peer "$model" "$rowmap" gpubench "$peer_threads" 1000000000 50000 cpu
    peer_args=(--peer gpubench --peer-spin-limit "$spin_limit")
  fi
  timeout 600 "$bin" --model "$model" --lanes "$dl" --batches "$db" --prompt "$pr" --steps "$steps" --rowmap "$rowmap" \
    "${peer_args[@]}" --json "$out/$label.json" "$@" > "$out/$label.txt" 2>&1
  log "bench_gpu_decode $label (lanes $dl, batches $db, prompt $pr): exit $? $(grep -E '^local +1 ' "$out/$label.txt" | head -1)"
  stop_peers
}

if [ -n "$variants" ]; then
  IFS=';' read -ra variant_runs <<< "$variants"
  IFS=';' read -ra vlanes <<< "$variant_lanes"
  IFS=';' read -ra vbatches <<< "$variant_batches"
  for i in "${!variant_runs[@]}"; do
    vl=${vlanes[$(( i < ${#vlanes[@]} ? i : ${#vlanes[@]} - 1 ))]}
    vb=${vbatches[$(( i < ${#vbatches[@]} ? i : ${#vbatches[@]} - 1 ))]}
    for pr in $prompts; do
      decode_run "$new_bin" "variants-$i-$pr" "$vl" "$vb" "$pr" --variants "${variant_runs[$i]}"
    done
  done
  carry_finish "$out"/variants-*.txt
  exit 0
fi
for pr in $prompts; do
  for rep in $(seq "$reps"); do
    if [ -n "$base" ]; then
      decode_run "$base" "decode-$pr-base-$rep-a" "$lanes" "$batches" "$pr" --pdl "$pdl"
      decode_run "$new_bin" "decode-$pr-new-$rep" "$lanes" "$batches" "$pr" --pdl "$pdl"
      decode_run "$base" "decode-$pr-base-$rep-b" "$lanes" "$batches" "$pr" --pdl "$pdl"
    else
      decode_run "$new_bin" "decode-$pr-new-$rep" "$lanes" "$batches" "$pr" --pdl "$pdl"
    fi
  done
done
carry_finish "$out"/decode-*.txt
