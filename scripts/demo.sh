#!/usr/bin/env bash
# The main job on the built-in default: makes a small synthetic MoE model with a byte-level
# tokenizer, then generates from a prompt on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >/dev/null
work=${TANDEM_DEMO_DIR:-build/demo}
mkdir -p "$work"
[ -f "$work/model/config.json" ] || build/tandem synth --preset tiny --out "$work/model" --seed 1
build/tandem info --model "$work/model"
build/tandem generate --model "$work/model" --prompt "The sidecar computes the cold experts" --max-tokens 24
