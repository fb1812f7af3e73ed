#!/usr/bin/env bash
# The measured run on the GPU machine, in one call: backend tests, the bracketed lane benchmark on
# flash-mini (synthesised there, profiled on the public corpus, planned with 89 cold experts per
# layer), the check gate through the GPU peer and split lanes, and the CPU-side benchmarks of the
# 16-core host (handoff round trip, CPU decode on the mid preset, kernel bandwidth). Run from a folder
# holding bin/ (binaries built on the development machine), lib/ (their shared libraries) and shared/
# (fixtures/oracle, fixtures/tokenizer, corpus). Logs and results go to $OUT.
# Usage: scripts/gpu_bench.sh CARRY_DIR
# Knobs (environment): SKEW (router skew, default 0), LANES (default host,peer,split,host; on a GPU of
# less than 100 GB a list with both peer and split runs as two bracketed runs, A,peer,A and A,split,A:
# three engines of flash-mini do not fit 80 GB), SPLIT (the
# split lane's link share: default auto, the split peer's `--split-share auto` weighing the link it
# measures from GPU 0 against its DRAM; or a share such as 0.4), USERS, KINDS, TOKENS, SWEEP ("0.3 0.5": extra host,split,host
# runs at those splits, 1 and 32 users, prose), DECODE (1: bench_gpu_decode, local lane), PDL (passed
# to bench_gpu_decode --pdl: 0, 1 or both), DECODE_PROMPTS (its prompt lengths, default 16), BREAKDOWN (N: bench_gpu_decode --breakdown N, the local lane's
# GPU time per kernel at 1 and 8 sequences, 16- and 120-token prompts), NCU (1: Nsight Compute's own
# kernel times of two decode steps at NCU_BATCHES sequences, default "1 8", 16-token prompts, summed
# per kernel by scripts/ncu_step.py),
# VARIANTS ("V1,V2,...;W1,W2,...": each ';'-separated list one bench_gpu_decode --variants run,
# configurations timed in turn on one engine, e.g. "base,rows8,mma0,base" or "base,x2:attention_mla,base"
# for a kernel's share of the step; run i takes item i of VARIANT_LANES (default local), VARIANT_BATCHES
# (default 1,8,16,32), each ';'-separated, the last item standing for the rest, and VARIANT_PROMPT
# (default 16); a host lane uses this run's rowmap when there is one, else the stand-in cold tail),
# DECODE_REPS (DECODE's runs, default 1), DECODE_BASE (a second bench_gpu_decode, e.g. built from the tree
# before a change: each DECODE run then times it first and this tree's right after, on the same box),
# ROWMAP (a rowmap from an earlier run on this box: used as is, no profile and plan), HOST_WAIT (tandem
# bench's --host-wait: auto, the default — the peer and split lanes' primary sleeps, local and host spin —
# spin or sleep), SKIP_CHECK (no check gate after the benchmark),
# PEER_DEVICE (the peers' --device: cpu, or cuda:1 for a second GPU as the peer — on a two-GPU box,
# LANES=host,peer,local,host gives issue 6's comparison), PEER_THREADS (default 14, with the peer
# lanes' primary sleeping (HOST_WAIT auto): 14 behind a spinning primary left the 16 cores fully
# subscribed and the peer cells erratic, so 12 went with spin; bench/RESULTS.md, "Host wait"),
# PEER_SPIN_US (the peers' --spin-us, default 50000: the engine rings a napping peer before each step,
# so the peer of the lane not being measured naps instead of holding a core), PEER_WORKER_SPIN_US (their
# --worker-spin-us, default 50000: compute threads stay awake between the passes of a step),
# TEST_TIMEOUT (s, default 150), SKIP_TESTS, SKIP_BENCH, SKIP_CPU (the CPU-side benchmarks).
set -uo pipefail
carry=$1
final=${OUT:-$PWD/gpu-out}
out=$final/work  # packed into $final/results.tgz at the end (the device tool returns few files)
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
export TANDEM_SHARED="$carry/shared"
export TANDEM_FIXTURES="$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures"
export TANDEM_BIN="$carry/bin/tandem"
chmod +x "$carry"/bin/*
T="$carry/bin/tandem"
model=/tmp/flash-mini
corpus="$carry/shared/corpus/public.jsonl"
skew=${SKEW:-0}
split=${SPLIT:-auto}
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }

log "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
log "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-150}" "$carry/bin/tandem_backend_tests" --gtest_brief=1 > "$out/backend_tests.log" 2>&1
  log "backend tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$out/backend_tests.log" | tr '\n' ' ')"
fi

t0=$(date +%s)
[ -f "$model/config.json" ] && [ -z "${RESYNTH:-}" ] && log "flash-mini already at $model" || \
"$T" synth --preset flash-mini --out "$model" --router-skew "$skew" \
  --tokenizer "$carry/shared/fixtures/tokenizer/tokenizer.json" --log-level warn > "$out/synth.log" 2>&1
rc=$?
log "synth flash-mini --router-skew $skew: exit $rc in $(( $(date +%s) - t0 )) s"
if [ ! -f "$model/model.safetensors" ]; then  # nothing below can run without the model: stop, say why
  log "no model at $model: $(tail -1 "$out/synth.log")"
  tar czf "$final/results.tgz" -C "$out" . && cp "$out/steps.log" "$final/steps.log"
  exit 1
fi
"$T" info --model "$model" > "$out/info.txt" 2>&1

if [ -n "${ROWMAP:-}" ]; then
  cp "$ROWMAP" "$out/rowmap.json"
  log "rowmap: $ROWMAP (not profiled again)"
elif [ -z "${SKIP_BENCH:-}" ]; then
t0=$(date +%s)
timeout 150 "$T" profile --model "$model" --device cuda --corpus "$corpus" --max-tokens-per-kind "${PROFILE_TOKENS:-6000}" \
  --out "$out/stats.json" > "$out/profile.log" 2>&1
log "profile: exit $? in $(( $(date +%s) - t0 )) s"
"$T" plan --model "$model" --stats "$out/stats.json" --cold-per-layer 89 --out "$out/rowmap.json" > "$out/plan.txt" 2>&1
log "plan: exit $? ($(grep -i 'cold share' "$out/plan.txt" | head -1))"
fi

peer_pids=()
start_peer() {  # NAME [extra args]. A lane closes when its primary exits: each primary run gets fresh peers
  local name=$1
  shift
  "$T" peer --model "$model" --rowmap "$out/rowmap.json" --lane "$name" --device "${PEER_DEVICE:-cpu}" --threads "${PEER_THREADS:-14}" \
    --spin-us "${PEER_SPIN_US:-50000}" --worker-spin-us "${PEER_WORKER_SPIN_US:-50000}" --max-rows 512 "$@" > "$out/peer-$name.out" 2> "$out/peer-$name.log" &
  peer_pids+=($!)
  for _ in $(seq 600); do grep -q serving "$out/peer-$name.log" 2>/dev/null && break; sleep 0.2; done
  log "peer $name $*: $(grep -E 'split share auto|held' "$out/peer-$name.log" | cut -d' ' -f4- | tr '\n' ' ')"
}
stop_peers() {
  for p in "${peer_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  peer_pids=()
}
bench_run() {  # LABEL SPLIT LANES USERS KINDS TIMEOUT
  local label=$1 sp=$2 lanes=$3 users=$4 kinds=$5 limit=$6
  case ",$lanes," in *,peer,*) start_peer bench ;; esac
  case ",$lanes," in *,split,*) start_peer bench-split --split-share "$sp" ;; esac
  local t0=$(date +%s)
  timeout "$limit" "$T" bench --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer bench \
    --split-peer bench-split --split-share "$sp" --peer-spin-limit 2000 --host-wait "${HOST_WAIT:-auto}" \
    --lanes "$lanes" --users "$users" --kinds "$kinds" \
    --corpus "$corpus" --tokens "${TOKENS:-24}" --out-dir "$out" --label "$label" \
    --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) box: $(nproc)-core host" > "$out/bench-$label.txt" 2> "$out/bench-$label.log"
  log "bench $label (lanes $lanes, split $sp): exit $? in $(( $(date +%s) - t0 )) s"
  stop_peers
}

if [ -n "${DECODE:-}" ]; then
  for pr in ${DECODE_PROMPTS:-16}; do
    for rep in $(seq "${DECODE_REPS:-1}"); do
      for v in ${DECODE_BASE:+base} new; do
        bin="$carry/bin/bench_gpu_decode"
        [ "$v" = base ] && bin=$DECODE_BASE
        timeout 120 "$bin" --model "$model" --lanes local --batches 1,8,16,32 --prompt "$pr" \
          ${PDL:+--pdl "$PDL"} --json "$out/gpu_decode-$pr-$v-$rep.json" > "$out/gpu_decode-$pr-$v-$rep.txt" 2>&1
        log "bench_gpu_decode ($v, run $rep) --prompt $pr: exit $? $(grep -E '^local +1 ' "$out/gpu_decode-$pr-$v-$rep.txt" | head -1)"
      done
    done
  done
fi
if [ -n "${VARIANTS:-}" ]; then
  IFS=';' read -ra variant_runs <<< "$VARIANTS"
  IFS=';' read -ra variant_lanes <<< "${VARIANT_LANES:-local}"
  IFS=';' read -ra variant_batches <<< "${VARIANT_BATCHES:-1,8,16,32}"
  rowmap_arg=()
  [ -f "$out/rowmap.json" ] && rowmap_arg=(--rowmap "$out/rowmap.json")
  for i in "${!variant_runs[@]}"; do
    vl=${variant_lanes[$(( i < ${#variant_lanes[@]} ? i : ${#variant_lanes[@]} - 1 ))]}
    vb=${variant_batches[$(( i < ${#variant_batches[@]} ? i : ${#variant_batches[@]} - 1 ))]}
    timeout 300 "$carry/bin/bench_gpu_decode" --model "$model" --lanes "$vl" --batches "$vb" "${rowmap_arg[@]}" \
      --prompt "${VARIANT_PROMPT:-16}" --variants "${variant_runs[$i]}" --json "$out/variants-$i.json" > "$out/variants-$i.txt" 2>&1
    log "bench_gpu_decode --lanes $vl --batches $vb --variants ${variant_runs[$i]}: exit $?"
  done
fi
if [ -n "${BREAKDOWN:-}" ]; then
  for pr in 16 120; do
    timeout 120 "$carry/bin/bench_gpu_decode" --model "$model" --lanes local --batches 1,8 --prompt "$pr" \
      --breakdown "$BREAKDOWN" --json "$out/breakdown-$pr.json" > "$out/breakdown-$pr.txt" 2>&1
    log "bench_gpu_decode --breakdown $BREAKDOWN --prompt $pr: exit $?"
  done
fi
if [ -n "${NCU:-}" ]; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  here=$(cd "$(dirname "$0")" && pwd)
  for b in ${NCU_BATCHES:-1 8}; do
    for pr in ${NCU_PROMPTS:-16}; do
      timeout 200 "$ncu_bin" --clock-control none --csv --page raw --launch-skip "${NCU_SKIP:-700}" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread \
        "$carry/bin/bench_gpu_decode" --model "$model" --lanes local --batches "$b" --prompt "$pr" --steps 2 --pdl 1 \
        > "$out/ncu-$b-$pr.csv" 2> "$out/ncu-$b-$pr.log"
      log "ncu bench_gpu_decode --batches $b --prompt $pr: exit $?"
      python3 "$here/ncu_step.py" "$out/ncu-$b-$pr.csv" 2 > "$out/ncu-$b-$pr.txt" 2>&1
    done
  done
fi
for sp in ${SWEEP:-}; do
  bench_run "sweep-split$sp" "$sp" host,split,host 1,32 prose 120
done
if [ -z "${SKIP_BENCH:-}" ]; then
  lanes=${LANES:-host,peer,split,host}
  users=${USERS:-1,8,16,32}
  kinds=${KINDS:-prose,code_python,code_c,json,shell}
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
fi
if [ -z "${SKIP_BENCH:-}" ] && [ -z "${SKIP_CHECK:-}" ]; then
  start_peer check-split --split-share "$split"
  t0=$(date +%s)
  timeout 60 "$T" check --model "$model" --device cuda --rowmap "$out/rowmap.json" --lane split --peer check-split \
    --split-share "$split" --corpus "$corpus" --max-tokens "${CHECK_TOKENS:-1024}" > "$out/check.txt" 2> "$out/check.log"
  log "check (split lane): exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/check.txt")"
  stop_peers
fi
[ -n "${SKIP_CPU:-}" ] && { tar czf "$final/results.tgz" -C "$out" . && cp "$out/steps.log" "$final/"; \
  echo "==== summary"; cat "$final/steps.log"; for f in "$out"/bench-*.txt "$out"/gpu_decode-*.txt "$out"/variants-*.txt "$out"/breakdown-*.txt "$out"/ncu-*.txt; do [ -f "$f" ] && tail -45 "$f"; done; exit 0; }

timeout 40 "$carry/bin/bench_handoff" --iters 20000 --out "$out/handoff.json" > "$out/handoff.txt" 2>&1
log "bench_handoff: exit $?"
"$T" synth --preset mid --out /tmp/mid --log-level warn > /dev/null 2>&1
timeout 60 "$carry/bin/bench_cpu_decode" --model /tmp/mid --users 1,4 --tokens 32 --out "$out/cpu_decode.json" > "$out/cpu_decode.txt" 2>&1
log "bench_cpu_decode: exit $? $(tail -2 "$out/cpu_decode.txt" | tr '\n' ' ')"
[ -n "${KERNELS:-}" ] && timeout 40 "$carry/bin/bench_kernels" --threads 16 --out "$out/kernels.json" > "$out/kernels.txt" 2>&1
log "bench_kernels: exit $?"

tar czf "$final/results.tgz" -C "$out" . && cp "$out/steps.log" "$final/"
echo "==== summary"
cat "$final/steps.log"
for f in "$out"/bench-*.txt; do tail -30 "$f"; done
