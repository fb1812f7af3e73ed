# Shared by the device-side scripts (scripts/gpu_*.sh): the carry folder they run from, the output
# folder, the step log, the benchmark model and the CPU peers. Sourced, never run. The carry folder
# (scripts/gpu_carry.sh writes it on the development machine) holds bin/ (or bin.tar.xz, unpacked
# here on first use), lib/ (the binaries' shared libraries) and optionally shared/ (fixtures/oracle,
# fixtures/tokenizer, corpus). Results go under $OUT (the device tool's folder; ./gpu-out without it).

# Prints the script's usage (its leading comment, from line 2 to the first line not starting with #).
usage_from_header() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"
}

# Refuses the environment knobs the scripts read before they took flags: each set one names its flag.
# Arguments: pairs VAR "replacement".
refuse_env() {
  local bad=0
  while [ $# -ge 2 ]; do
    if [ -n "${!1:-}" ]; then
      echo "error: the environment variable $1 is no longer read: use $2" >&2
      bad=1
    fi
    shift 2
  done
  [ "$bad" = 0 ] || exit 2
}

# The value of flag $1 given as $2 ("" or another flag: an error naming the flag).
flag_value() {
  if [ $# -lt 2 ] || [ -z "$2" ] || [ "${2#--}" != "$2" ]; then
    echo "error: $1 needs a value" >&2
    exit 2
  fi
  printf '%s' "$2"
}

# carry_setup CARRY_DIR: checks the carry folder, unpacks bin.tar.xz when bin/ is missing, exports
# what the binaries and tests read, sets $carry, $T (tandem), $final ($OUT), $out ($OUT/work: the
# working files, packed into $final/results.tgz by carry_finish) and $repo (this checkout).
carry_setup() {
  if [ -z "${1:-}" ] || [ ! -d "$1" ]; then
    echo "error: carry folder '${1:-}' not found (scripts/gpu_carry.sh writes one)" >&2
    exit 2
  fi
  carry=$(cd "$1" && pwd)
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [ ! -d "$carry/bin" ] && [ -f "$carry/bin.tar.xz" ]; then
    tar xJf "$carry/bin.tar.xz" -C "$carry" || { echo "error: cannot unpack $carry/bin.tar.xz" >&2; exit 2; }
  fi
  if [ ! -x "$carry/bin/tandem" ] && [ ! -f "$carry/bin/tandem" ]; then
    echo "error: $carry/bin/tandem not found" >&2
    exit 2
  fi
  chmod +x "$carry"/bin/* "$carry"/bin/*/* 2>/dev/null
  final=${OUT:-$PWD/gpu-out}
  out=$final/work
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
  export TANDEM_SHARED="$carry/shared"
  export TANDEM_FIXTURES="$repo/tests/fixtures"
  export TANDEM_BIN="$carry/bin/tandem"
  T="$carry/bin/tandem"
}

log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }

# The machine, once per log.
log_machine() {
  log "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  log "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
}

# synth_flash_mini MODEL_DIR SKEW RESYNTH(0|1): the benchmark model (tokenizer from shared/ when
# carried); returns non-zero when there is no model afterwards.
synth_flash_mini() {
  local model=$1 skew=$2 resynth=$3 t0 rc tok=()
  if [ -f "$model/config.json" ] && [ -f "$model/model.safetensors" ] && [ "$resynth" = 0 ]; then
    log "flash-mini already at $model"
    return 0
  fi
  [ -f "$carry/shared/fixtures/tokenizer/tokenizer.json" ] && tok=(--tokenizer "$carry/shared/fixtures/tokenizer/tokenizer.json")
  t0=$(date +%s)
  "$T" synth --preset flash-mini --out "$model" --router-skew "$skew" "${tok[@]}" --log-level warn > "$out/synth.log" 2>&1
  rc=$?
  log "synth flash-mini --router-skew $skew: exit $rc in $(( $(date +%s) - t0 )) s"
  if [ ! -f "$model/model.safetensors" ]; then
    log "no model at $model: $(tail -1 "$out/synth.log")"
    return 1
  fi
}

# CPU peers: start_peer MODEL ROWMAP NAME THREADS SPIN_US WORKER_SPIN_US DEVICE [extra args] starts a
# `tandem peer` on lane NAME and waits until it serves; stop_peers ends every peer started so. A lane
# closes when its primary exits: each primary run gets fresh peers.
peer_pids=()
start_peer() {
  local model=$1 rowmap=$2 name=$3 threads=$4 spin=$5 worker_spin=$6 device=$7
  shift 7
  "$T" peer --model "$model" --rowmap "$rowmap" --lane "$name" --device "$device" --threads "$threads" \
    --spin-us "$spin" --worker-spin-us "$worker_spin" --max-rows 512 "$@" > "$out/peer-$name.out" 2> "$out/peer-$name.log" &
  peer_pids+=($!)
  for _ in $(seq 600); do grep -q serving "$out/peer-$name.log" 2>/dev/null && break; sleep 0.2; done
  log "peer $name $*: $(grep -E 'split share auto|held' "$out/peer-$name.log" | cut -d' ' -f4- | tr '\n' ' ')"
}
stop_peers() {
  local p
  for p in "${peer_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  peer_pids=()
}

# carry_finish [FILES...]: packs $out into $final/results.tgz, copies the step log, prints it and the
# tail of each named file. A script run by another (TANDEM_GPU_NESTED=1) leaves that to its caller.
carry_finish() {
  [ "${TANDEM_GPU_NESTED:-0}" = 1 ] && return 0
  tar czf "$final/results.tgz" -C "$out" . && cp "$out/steps.log" "$final/" 2>/dev/null
  echo "==== summary"
  cat "$out/steps.log" 2>/dev/null
  local f
  for f in "$@"; do [ -f "$f" ] && { echo "==== $(basename "$f")"; tail -45 "$f"; }; done
  return 0
}
