#!/usr/bin/env bash
# The main job on the built-in default: a small synthetic MoE model (deepseek_v3 shape, made here), its
# expert traffic profiled on real text, a hot/cold rowmap planned from it, a peer serving the cold
# experts and a watchdog guarding the lane, then generation through the peer lane with the check gate
# on every handoff. Prints what happened: tokens/s, handoffs, wait p50/p99, overruns, min cosine per layer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >/dev/null
T=build/tandem
work=${TANDEM_DEMO_DIR:-build/demo}
lane=demo-$$
mkdir -p "$work"

echo "== 1. model: tandem synth --preset tiny"
[ -f "$work/model/config.json" ] || $T synth --preset tiny --out "$work/model" --seed 1 --log-level warn
$T info --model "$work/model"

echo "== 2. corpus"
corpus=../shared/corpus/public.jsonl
if [ ! -f "$corpus" ]; then
  # No shared corpus beside the checkout: use the project's own text (docs, sources, scripts, configs).
  corpus="$work/own-corpus.jsonl"
  python3 - "$corpus" <<'PY'
import glob, json, sys
kinds = {"prose": "docs/*.md", "code_c": "src/*/*.h", "shell": "scripts/*.sh", "json": "tests/fuzz/corpus/config/*"}
with open(sys.argv[1], "w") as out:
    for kind, pattern in kinds.items():
        for path in sorted(glob.glob(pattern)):
            text = open(path, encoding="utf-8", errors="replace").read()
            out.write(json.dumps({"kind": kind, "name": path, "text": text}) + "\n")
PY
fi
echo "$corpus"

echo "== 3. profile: which experts real text routes to"
$T profile --model "$work/model" --corpus "$corpus" --max-tokens-per-kind 1500 --out "$work/stats.json" --log-level warn

echo "== 4. plan: 8 of 32 experts per layer cold (on the peer)"
$T plan --model "$work/model" --stats "$work/stats.json" --cold-per-layer 8 --out "$work/rowmap.json"

echo "== 5. peer + watchdog on lane $lane"
$T peer --model "$work/model" --rowmap "$work/rowmap.json" --lane "$lane" --threads 1 2>"$work/peer.log" &
peer_pid=$!
trap 'kill $peer_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q serving "$work/peer.log" && break; sleep 0.1; done
grep -E "held|serving" "$work/peer.log" | sed 's/^/   peer: /'
$T watchdog --lane "$lane" --stall 2 --mode enforce >"$work/watchdog.log" 2>&1 &
wd_pid=$!

echo "== 6. generate through the peer lane, check gate on every handoff"
$T generate --model "$work/model" --lane peer --peer "$lane" --rowmap "$work/rowmap.json" \
  --prompt "The sidecar computes the cold experts while the primary runs the hot ones." \
  --max-tokens 48 --ignore-eos --peer-check 1 --log-level warn
wait $peer_pid || true
wait $wd_pid || true
trap - EXIT
echo "== lane closed: peer exited, segment removed ($(ls /dev/shm/tandem-$lane 2>/dev/null || echo gone))"
