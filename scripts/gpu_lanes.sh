#!/usr/bin/env bash
# The lanes on the GPU machine: `tandem bench` of flash-mini (synthesised there, profiled on the
# public corpus, planned with 89 cold experts per layer, unless --rowmap), the first lane run before
# and after the others, then the check gate through the split lane. Logs and JSON under $OUT/work,
# packed into $OUT/results.tgz.
# Usage: scripts/gpu_lanes.sh CARRY_DIR [flags]
#   --lanes LIST         lanes in order, the first bracketing the others (default host,peer,split,host);
#                        on a GPU under 100 GB a list with both peer and split runs as A,peer,A and
#                        A,split,A: three engines of flash-mini do not fit 80 GB
#   --users LIST         users per cell (default 1,8,16,32)
#   --kinds LIST         corpus kinds (default prose,code_python,code_c,json,shell)
#   --tokens N           decode tokens per user (default 24)
#   --split SHARE        the split lane's link share: auto (default: the split peer weighs the link it
#                        measures from GPU 0 against its DRAM) or a share such as 0.4
#   --sweep "S1 S2"      extra host,split,host runs at these shares, 1 and 32 users, prose
#   --rowmap FILE        a rowmap from an earlier run on this box: used as is (no profile, no plan)
#   --profile-tokens N   tokens per kind of the profile (default 6000)
#   --skew X             flash-mini's router skew (default 0); --resynth makes the model again
#   --host-wait MODE     tandem bench's --host-wait: auto (default), spin or sleep
#   --peer-device DEV    the peers' --device: cpu (default) or cuda:1 (a second GPU as the peer)
#   --peer-threads N     the peers' --threads (default 14, with the peer lanes' primary sleeping)
#   --peer-spin-us US    the peers' --spin-us (default 50000: the peer of the lane not measured naps)
#   --peer-worker-spin-us US  the peers' --worker-spin-us (default 50000)
#   --no-bench           only the model (and the rowmap); --no-check: no check gate afterwards
#   --check-tokens N     the check gate's --max-tokens (default 1024)
#   --model DIR          where flash-mini lives (default /tmp/flash-mini)
#   -h, --help           this text
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/carry.sh"
refuse_env LANES --lanes USERS --users KINDS --kinds TOKENS --tokens SPLIT --split SWEEP --sweep ROWMAP --rowmap \
  PROFILE_TOKENS --profile-tokens SKEW --skew RESYNTH --resynth HOST_WAIT --host-wait PEER_DEVICE --peer-device \
  PEER_THREADS --peer-threads PEER_SPIN_US --peer-spin-us PEER_WORKER_SPIN_US --peer-worker-spin-us \
  SKIP_BENCH --no-bench SKIP_CHECK --no-check CHECK_TOKENS --check-tokens

lanes=host,peer,split,host users=1,8,16,32 kinds=prose,code_python,code_c,json,shell tokens=24 split=auto sweep=""
rowmap="" profile_tokens=6000 skew=0 resynth=0 host_wait=auto peer_device=cpu peer_threads=14 peer_spin=50000
peer_worker_spin=50000 bench=1 check=1 check_tokens=1024 model=/tmp/flash-mini carry_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage_from_header "$0"; exit 0 ;;
    --lanes) lanes=$(flag_value "$@") || exit 2; shift ;;
    --users) users=$(flag_value "$@") || exit 2; shift ;;
    --kinds) kinds=$(flag_value "$@") || exit 2; shift ;;
    --tokens) tokens=$(flag_value "$@") || exit 2; shift ;;
    --split) split=$(flag_value "$@") || exit 2; shift ;;
    --sweep) sweep=$(flag_value "$@") || exit 2; shift ;;
    --rowmap) rowmap=$(flag_value "$@") || exit 2; shift ;;
    --profile-tokens) profile_tokens=$(flag_value "$@") || exit 2; shift ;;
    --skew) skew=$(flag_value "$@") || exit 2; shift ;;
    --resynth) resynth=1 ;;
    --host-wait) host_wait=$(flag_value "$@") || exit 2; shift ;;
    --peer-device) peer_device=$(flag_value "$@") || exit 2; shift ;;
    --peer-threads) peer_threads=$(flag_value "$@") || exit 2; shift ;;
    --peer-spin-us) peer_spin=$(flag_value "$@") || exit 2; shift ;;
    --peer-worker-spin-us) peer_worker_spin=$(flag_value "$@") || exit 2; shift ;;
    --no-bench) bench=0 ;;
    --no-check) check=0 ;;
    --check-tokens) check_tokens=$(flag_value "$@") || exit 2; shift ;;
    --model) model=$(flag_value "$@") || exit 2; shift ;;
    -*) echo "error: unknown flag $1 (--help lists them)" >&2; exit 2 ;;
    *) [ -z "$carry_dir" ] || { echo "error: one carry folder, got '$carry_dir' and '$1'" >&2; exit 2; }
       carry_dir=$1 ;;
  esac
  shift
done
carry_setup "$carry_dir"
corpus="$carry/shared/corpus/public.jsonl"
[ "${TANDEM_GPU_NESTED:-0}" = 1 ] || log_machine
synth_flash_mini "$model" "$skew" "$resynth" || { carry_finish; exit 1; }
"$T" info --model "$model" > "$out/info.txt" 2>&1

if [ -n "$rowmap" ]; then
  cp "$rowmap" "$out/rowmap.json"
  log "rowmap: $rowmap (not profiled again)"
else
  t0=$(date +%s)
  timeout 150 "$T" profile --model "$model" --device cuda --corpus "$corpus" --max-tokens-per-kind "$profile_tokens" \
    --out "$out/stats.json" > "$out/profile.log" 2>&1
  log "profile: exit $? in $(( $(date +%s) - t0 )) s"
  "$T" plan --model "$model" --stats "$out/stats.json" --cold-per-layer 89 --out "$out/rowmap.json" > "$out/plan.txt" 2>&1
  log "plan: exit $? ($(grep -i 'cold share' "$out/plan.txt" | head -1))"
fi

peer() {  # NAME [extra args]
  local name=$1
  shift
  start_peer "$model" "$out/rowmap.json" "$name" "$peer_threads" "$peer_spin" "$peer_worker_spin" "$peer_device" "$@"
}
bench_run() {  # LABEL SPLIT LANES USERS KINDS TIMEOUT
  local label=$1 sp=$2 bl=$3 bu=$4 bk=$5 limit=$6 t0
  case ",$bl," in *,peer,*) peer bench ;; esac
  case ",$bl," in *,split,*) peer bench-split --split-share "$sp" ;; esac
  t0=$(date +%s)
  timeout "$limit" "$T" bench --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer bench \
    --split-peer bench-split --split-share "$sp" --peer-spin-limit 2000 --host-wait "$host_wait" \
    --lanes "$bl" --users "$bu" --kinds "$bk" --corpus "$corpus" --tokens "$tokens" --out-dir "$out" --label "$label" \
    --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) box: $(nproc)-core host" \
    > "$out/bench-$label.txt" 2> "$out/bench-$label.log"
  log "bench $label (lanes $bl, split $sp): exit $? in $(( $(date +%s) - t0 )) s"
  stop_peers
}

if [ "$bench" = 1 ]; then
  for sp in $sweep; do
    bench_run "sweep-split$sp" "$sp" host,split,host 1,32 prose 120
  done
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  a=${lanes%%,*}
  case ",$lanes," in
    *,peer,*split,*|*,split,*peer,*)
      if [ "${gpu_mib:-0}" -lt 100000 ]; then
        # Each lane's engine holds its own copy of the hot weights: three engines of flash-mini do
        # not fit an 80 GB card, so the peer and the split lane each get a bracketed run of their own.
        log "GPU has ${gpu_mib} MiB: lanes $lanes as $a,peer,$a and $a,split,$a"
        bench_run flash-mini-peer "$split" "$a,peer,$a" "$users" "$kinds" 400
        bench_run flash-mini-split "$split" "$a,split,$a" "$users" "$kinds" 400
        lanes=""
      fi ;;
  esac
  [ -n "$lanes" ] && bench_run flash-mini "$split" "$lanes" "$users" "$kinds" 400
  if [ "$check" = 1 ]; then
    peer check-split --split-share "$split"
    t0=$(date +%s)
    timeout 60 "$T" check --model "$model" --device cuda --rowmap "$out/rowmap.json" --lane split --peer check-split \
      --split-share "$split" --corpus "$corpus" --max-tokens "$check_tokens" > "$out/check.txt" 2> "$out/check.log"
    log "check (split lane): exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/check.txt")"
    stop_peers
  fi
fi
carry_finish "$out"/bench-*.txt
