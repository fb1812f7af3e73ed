#!/usr/bin/env bash
# One device call for issue 28: the server on the host and peer lanes (host, peer, host), driven over
# HTTP by bench/serve_load.py, then `tandem bench` on the same lanes, users and lengths.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/carry.sh
carry_setup .carry
corpus=$carry/shared/corpus/public.jsonl
log_machine
model=/tmp/flash-mini
synth_flash_mini "$model" 0 0 || { carry_finish; exit 1; }
"$carry/bin/bench_gpu_decode" --model "$model" --write-rowmap "$out/rowmap.json" > "$out/rowmap.log" 2>&1
users=1,8,32 tokens=64
serve_run() {  # NAME LANE
  local name=$1 lane=$2 t0 sp
  t0=$(date +%s)
  "$T" serve --model "$model" --device cuda --lane "$lane" --rowmap "$out/rowmap.json" --port 18080 --max-seqs 32 \
    --prefill-chunk 4096 --peer-spin-limit 2000 > "$out/serve-$name.out" 2> "$out/serve-$name.log" &
  sp=$!
  for _ in $(seq 900); do grep -q ': serving$' "$out/serve-$name.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.2; done
  log "serve $name ($lane) ready after $(( $(date +%s) - t0 )) s"
  timeout 150 python3 bench/serve_load.py --url http://127.0.0.1:18080 --tokenizer "$model" --tandem "$T" \
    --corpus "$corpus" --kinds prose --users $users --tokens $tokens --prompt-tokens 64 --label "serve-$name" \
    --out "$out/serve-$name.json" > "$out/serve-$name.txt" 2>&1
  log "serve_load $name: exit $?"
  grep -E '^prose' "$out/serve-$name.txt" | sed "s/^/$name /" | tee -a "$out/steps.log"
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  grep -E 'lane peer:' "$out/serve-$name.log" | tail -1 | cut -c1-250 | tee -a "$out/steps.log"
}
serve_run host1 host
serve_run peer peer
serve_run host2 host
"$T" peer --model "$model" --rowmap "$out/rowmap.json" --lane b28 --threads 14 --spin-us 50000 --max-rows 512 \
  > "$out/peer.out" 2> "$out/peer.log" &
pp=$!
for _ in $(seq 600); do grep -q serving "$out/peer.log" 2>/dev/null && break; sleep 0.2; done
t0=$(date +%s)
timeout 150 "$T" bench --model "$model" --device cuda --rowmap "$out/rowmap.json" --peer b28 --peer-spin-limit 2000 \
  --lanes host,peer,host --users $users --kinds prose --corpus "$corpus" --tokens $tokens --prompt-tokens 64 \
  --out-dir "$out" --label bench-lanes > "$out/bench-lanes.txt" 2> "$out/bench-lanes.log"
log "bench host,peer,host: exit $? in $(( $(date +%s) - t0 )) s"
kill $pp 2>/dev/null; wait $pp 2>/dev/null
grep -E '^\| prose' "$out/bench-lanes.txt" | tee -a "$out/steps.log"
carry_finish
