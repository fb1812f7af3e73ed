#!/usr/bin/env bash
# Device side of the CUDA backend's checks: run on the GPU machine from a folder holding the binaries
# built elsewhere (bin/), the shared libraries they need (lib/) and, optionally, the extra fixture set
# (shared/fixtures/oracle); the tests read the repo's own fixtures (tests/fixtures) from the checkout. Logs go to $OUT (or ./gpu-out). Steps (first argument):
#   basic  nvidia-smi, the backend tests (ops vs the CPU reference, engine vs the oracle fixtures)
#   bench  synthesise flash-mini (timed) into $MODEL_DIR and run bench_gpu_decode on the lanes in
#          $LANES (default local,host,peer; for peer it writes the cold-tail rowmap, starts
#          `tandem peer --threads $PEER_THREADS --spin-us 1e9` on it and stops it afterwards); $PDL
#          (default both: off, on, off per batch size) is bench_gpu_decode's --pdl
#   profile  per-kernel GPU times of decode steps (ncu, clocks left alone) for the local lane, 1 sequence
#   all    basic and bench
# Usage: scripts/gpu_run.sh [basic|bench|all] [CARRY_DIR]
set -uo pipefail
step=${1:-all}
carry=${2:-$(cd "$(dirname "$0")/.." && pwd)}
out=${OUT:-$PWD/gpu-out}
model_dir=${MODEL_DIR:-/tmp/flash-mini}
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
export TANDEM_SHARED="$carry/shared"
export TANDEM_FIXTURES="$(cd "$(dirname "$0")/.." && pwd)/tests/fixtures"
export TANDEM_BIN="$carry/bin/tandem"
chmod +x "$carry"/bin/* 2>/dev/null
summary=()

if [[ $step == basic || $step == all ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/nvidia-smi.txt"
  t0=$(date +%s.%N)
  "$carry/bin/tandem_backend_tests" --gtest_brief=1 2>&1 | tee "$out/backend_tests.log"
  rc=${PIPESTATUS[0]}
  summary+=("backend tests: exit $rc ($(grep -c '^\[       OK \]\|OK \]' "$out/backend_tests.log" || true) ok lines; $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N)-$t0}") s)")
  summary+=("$(grep -E '^\[  (PASSED|FAILED)' "$out/backend_tests.log" | tr '\n' ' ')")
fi

if [[ $step == bench || $step == all ]]; then
  if [[ ! -f $model_dir/model.safetensors ]]; then
    t0=$(date +%s)
    "$carry/bin/tandem" synth --preset flash-mini --out "$model_dir" 2>&1 | tail -3 | tee "$out/synth.log"
    summary+=("synth flash-mini: $(( $(date +%s) - t0 )) s, $(du -sh "$model_dir" | cut -f1)")
  fi
  lanes=${LANES:-local,host,peer}
  peer_args=()
  peer_pid=
  if [[ ,$lanes, == *,peer,* ]]; then
    rowmap=$model_dir.rowmap.json
    "$carry/bin/bench_gpu_decode" --model "$model_dir" --write-rowmap "$rowmap" 2>> "$out/bench.log"
    "$carry/bin/tandem" peer --model "$model_dir" --rowmap "$rowmap" --lane gpubench --threads "${PEER_THREADS:-14}" \
      --spin-us 1000000000 --max-rows 256 > "$out/peer.out" 2> "$out/peer.log" &
    peer_pid=$!
    for _ in $(seq 600); do grep -q serving "$out/peer.log" 2>/dev/null && break; sleep 0.2; done
    peer_args=(--peer gpubench --rowmap "$rowmap" --peer-spin-limit "${SPIN_LIMIT:-2000}")
  fi
  "$carry/bin/bench_gpu_decode" --model "$model_dir" --lanes "$lanes" --batches "${BATCHES:-1,8,16,32}" \
    --steps "${STEPS:-64}" --pdl "${PDL:-both}" --json "$out/bench_gpu_decode.json" "${peer_args[@]}" \
    2>> "$out/bench.log" \
    | tee "$out/bench_table.txt"
  summary+=("bench exit ${PIPESTATUS[0]}")
  if [[ -n $peer_pid ]]; then
    kill "$peer_pid" 2>/dev/null
    wait "$peer_pid"
    summary+=("peer: $(grep -E 'cold experts|ended' "$out/peer.log" | tr '\n' ' ')")
  fi
fi

if [[ $step == profile ]]; then
  [[ -f $model_dir/model.safetensors ]] || "$carry/bin/tandem" synth --preset flash-mini --out "$model_dir" > /dev/null 2>&1
  ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$carry/bin/bench_gpu_decode" --model "$model_dir" --lanes local --batches "${BATCHES:-1}" --steps 4 \
    > "$out/ncu.txt" 2>&1
  summary+=("ncu exit $? ($(wc -l < "$out/ncu.txt") lines)")
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
[[ -f $out/bench_table.txt ]] && cat "$out/bench_table.txt"
exit 0
