#!/usr/bin/env bash
# The measured run on the GPU machine, in one call: backend tests, the bracketed lane benchmark on
# flash-mini (synthesised there, profiled on the public corpus, planned with 89 cold experts per
# layer), the check gate through the GPU peer lane, and the CPU-side benchmarks of the 16-core host
# (handoff round trip, CPU decode on the mid preset, kernel bandwidth). Run from a folder holding
# bin/ (binaries built on the development machine), lib/ (their shared libraries) and shared/
# (fixtures/oracle, fixtures/tokenizer, corpus). Logs and results go to $OUT.
# Usage: scripts/gpu_bench.sh CARRY_DIR
set -uo pipefail
carry=$1
final=${OUT:-$PWD/gpu-out}
out=$final/work  # packed into $final/results.tgz at the end (the device tool returns few files)
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
export TANDEM_SHARED="$carry/shared"
export TANDEM_BIN="$carry/bin/tandem"
chmod +x "$carry"/bin/*
T="$carry/bin/tandem"
model=/tmp/flash-mini
corpus="$carry/shared/corpus/public.jsonl"
skew=${SKEW:-0.05}
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }

log "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
log "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
"$carry/bin/tandem_backend_tests" --gtest_brief=1 > "$out/backend_tests.log" 2>&1
log "backend tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$out/backend_tests.log" | tr '\n' ' ')"

t0=$(date +%s)
"$T" synth --preset flash-mini --out "$model" --router-skew "$skew" \
  --tokenizer "$carry/shared/fixtures/tokenizer/tokenizer.json" --log-level warn > "$out/synth.log" 2>&1
log "synth flash-mini --router-skew $skew: exit $? in $(( $(date +%s) - t0 )) s"
"$T" info --model "$model" > "$out/info.txt" 2>&1

t0=$(date +%s)
timeout 150 "$T" profile --model "$model" --device cuda --corpus "$corpus" --max-tokens-per-kind "${PROFILE_TOKENS:-6000}" \
  --out "$out/stats.json" > "$out/profile.log" 2>&1
log "profile: exit $? in $(( $(date +%s) - t0 )) s"
"$T" plan --model "$model" --stats "$out/stats.json" --cold-per-layer 89 --out "$out/rowmap.json" > "$out/plan.txt" 2>&1
log "plan: exit $? ($(grep -i 'cold share' "$out/plan.txt" | head -1))"

start_peer() {  # a lane closes when its primary exits: each primary run gets a fresh peer
  "$T" peer --model "$model" --rowmap "$out/rowmap.json" --lane "$1" --threads "${PEER_THREADS:-14}" \
    --spin-us 1000000000 --max-rows 512 > "$out/peer-$1.out" 2> "$out/peer-$1.log" &
  peer_pid=$!
  for _ in $(seq 600); do grep -q serving "$out/peer-$1.log" 2>/dev/null && break; sleep 0.2; done
  log "peer $1: $(grep -E 'held' "$out/peer-$1.log" | tail -1)"
}
start_peer bench

t0=$(date +%s)
timeout 250 "$T" bench --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer bench --peer-spin-limit 2000 \
  --lanes host,peer,host --users 1,8,16,32 --kinds prose,code_python,code_c,json,shell --corpus "$corpus" \
  --tokens "${TOKENS:-32}" --out-dir "$out" --label flash-mini --machine "H200 box: $(nproc)-core host" \
  > "$out/bench.txt" 2> "$out/bench.log"
log "bench: exit $? in $(( $(date +%s) - t0 )) s"

kill "$peer_pid" 2>/dev/null; wait "$peer_pid" 2>/dev/null
start_peer check
t0=$(date +%s)
timeout 60 "$T" check --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer check --corpus "$corpus" \
  --max-tokens "${CHECK_TOKENS:-1024}" > "$out/check.txt" 2> "$out/check.log"
log "check: exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/check.txt")"
kill "$peer_pid" 2>/dev/null; wait "$peer_pid" 2>/dev/null

timeout 40 "$carry/bin/bench_handoff" --iters 20000 --out "$out/handoff.json" > "$out/handoff.txt" 2>&1
log "bench_handoff: exit $?"
"$T" synth --preset mid --out /tmp/mid --log-level warn > /dev/null 2>&1
timeout 60 "$carry/bin/bench_cpu_decode" --model /tmp/mid --users 1,4 --tokens 32 --out "$out/cpu_decode.json" > "$out/cpu_decode.txt" 2>&1
log "bench_cpu_decode: exit $? $(tail -2 "$out/cpu_decode.txt" | tr '\n' ' ')"
[ -n "${KERNELS:-}" ] && timeout 40 "$carry/bin/bench_kernels" --threads 16 --out "$out/kernels.json" > "$out/kernels.txt" 2>&1
log "bench_kernels: exit $?"

tar czf "$final/results.tgz" -C "$out" . && cp "$out/steps.log" "$final/" && rm -rf "$out"
echo "==== summary"
cat "$final/steps.log"
tar xzf "$final/results.tgz" -O ./bench.txt 2>/dev/null | tail -45
