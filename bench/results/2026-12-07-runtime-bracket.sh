#!/usr/bin/env bash
# One device call for issue 27: the backend tests of the new build, then the lanes of `tandem bench`
# on flash-mini with the binary from before the change (old), the new one, and old again.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/carry.sh
carry_setup .carry
corpus=$carry/shared/corpus/public.jsonl
log_machine
mkdir -p "$carry/old/bin" && xz -dc "$carry/old/tandem.xz" > "$carry/old/bin/tandem" && chmod +x "$carry/old/bin/tandem"

# The backend tests on the GPU while the CPU writes the model.
( t0=$(date +%s)
  timeout 240 "$carry/bin/tandem_backend_tests" --gtest_brief=1 > "$out/backend_tests.log" 2>&1
  echo "backend tests: exit $? in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/backend_tests.log" | tr '\n' ' ')" > "$out/backend.summary" ) &
tests_pid=$!
model=/tmp/flash-mini
synth_flash_mini "$model" 0 0 || { carry_finish; exit 1; }
"$carry/bin/bench_gpu_decode" --model "$model" --write-rowmap "$out/rowmap.json" > "$out/rowmap.log" 2>&1
log "rowmap (cold tail, bench_gpu_decode --write-rowmap): exit $?"
wait $tests_pid
log "$(cat "$out/backend.summary")"
grep -E '^\[  FAILED' "$out/backend_tests.log" | head -20 | tee -a "$out/steps.log"

run() {  # NAME BIN LIBDIR
  local name=$1 bin=$2 lib=$3 t0
  t0=$(date +%s)
  LD_LIBRARY_PATH=$lib timeout 150 "$bin" bench --model "$model" --device cuda --lanes local --users 1,32 \
    --kinds prose --corpus "$corpus" --tokens 16 --out-dir "$out" --label "$name-local" \
    > "$out/bench-$name-local.txt" 2> "$out/bench-$name-local.log"
  log "$name local: exit $? in $(( $(date +%s) - t0 )) s"
  LD_LIBRARY_PATH=$lib "$bin" peer --model "$model" --rowmap "$out/rowmap.json" --lane b27 --threads 14 \
    --spin-us 50000 --max-rows 512 > "$out/peer-$name.out" 2> "$out/peer-$name.log" &
  local pp=$!
  for _ in $(seq 600); do grep -q serving "$out/peer-$name.log" 2>/dev/null && break; sleep 0.2; done
  t0=$(date +%s)
  LD_LIBRARY_PATH=$lib timeout 200 "$bin" bench --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer b27 \
    --peer-spin-limit 2000 --lanes host,peer,host --users 1,32 --kinds prose --corpus "$corpus" --tokens 16 \
    --out-dir "$out" --label "$name-lanes" > "$out/bench-$name-lanes.txt" 2> "$out/bench-$name-lanes.log"
  log "$name host,peer,host: exit $? in $(( $(date +%s) - t0 )) s"
  kill $pp 2>/dev/null; wait $pp 2>/dev/null
}
run old1 "$carry/old/bin/tandem" "$carry/old/lib"
run new "$carry/bin/tandem" "$carry/lib"
run old2 "$carry/old/bin/tandem" "$carry/old/lib"
# The server on the peer lane (its own peer and watchdog), driven over HTTP, when time is left.
if [ $SECONDS -lt 380 ]; then
  t0=$(date +%s)
  "$T" serve --model "$model" --device cuda --lane peer --rowmap "$out/rowmap.json" --port 18080 --max-seqs 32 \
    --peer-spin-limit 2000 > "$out/serve.out" 2> "$out/serve.log" &
  sp=$!
  for _ in $(seq 900); do grep -q ': serving$' "$out/serve.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.2; done
  log "serve ready after $(( $(date +%s) - t0 )) s: $(grep -E 'memory on|probe' "$out/serve.log" | cut -c1-300 | tr '\n' ' ')"
  timeout 120 python3 bench/serve_load.py --url http://127.0.0.1:18080 --tokenizer "$model" --tandem "$T" \
    --corpus "$corpus" --kinds prose --users 1,32 --tokens 16 --prompt-tokens 64 --out "$out/serve-peer.json" \
    > "$out/serve-load.txt" 2>&1
  log "serve_load (peer lane, prose, 1 and 32 users): exit $?"
  cat "$out/serve-load.txt" | tee -a "$out/steps.log"
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  grep -E 'lane peer:' "$out/serve.log" | tail -1 | cut -c1-300 | tee -a "$out/steps.log"
else
  log "no time left for the server run ($SECONDS s used)"
fi
carry_finish "$out"/bench-*.txt
