#!/usr/bin/env bash
# docs/fp8.md, "Quantize at load": what --weights fp8 changes, per layer, on the CPU (the dev machine):
# a synthetic mid model, its routed experts quantized at load on the peer, every handed-off row
# recomputed by the check gate with the checkpoint's bf16 experts (tandem check --reference checkpoint).
# Usage: bench/results/2026-12-07-fp8-check.sh [WORK_DIR] (default /tmp/fp8-check); corpus: $TANDEM_SHARED
# or ../shared (corpus/public.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
T=build/tandem
work=${1:-/tmp/fp8-check}
corpus=${TANDEM_SHARED:-../shared}/corpus/public.jsonl
mkdir -p "$work"
[ -f "$work/mid/config.json" ] || $T synth --preset mid --out "$work/mid" --seed 1 --log-level warn
$T profile --model "$work/mid" --corpus "$corpus" --weights fp8 --max-tokens-per-kind 200 --out "$work/stats.json"
$T plan --model "$work/mid" --stats "$work/stats.json" --weights fp8 --cold-per-layer 16 --out "$work/rowmap.json"
$T peer --model "$work/mid" --rowmap "$work/rowmap.json" --weights fp8 --lane fp8check --threads 1 2> "$work/peer.log" &
until grep -q serving "$work/peer.log"; do sleep 0.2; done
# Exit 1 (FAIL at the default 0.999 bar) is the finding, not an error of the script.
$T check --model "$work/mid" --weights fp8 --lane peer --peer fp8check --rowmap "$work/rowmap.json" --corpus "$corpus" \
  --threads 1 --max-tokens 1024 --reference checkpoint || true
wait
