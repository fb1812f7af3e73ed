// A model with its engine on a device and a lane: what every command, benchmark and the server run.
// Runtime::open checks every option that needs no model first (device, split share, lane names, the
// lane's needs), so a typo never costs a model load; then loads the model, plans the lane (rowmap or
// stand-in), attaches the peer and builds the engine (CpuEngine or the CUDA engine).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/model.h"
#include "moe/peer_lane.h"
#include "peer/client.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"
#include "runtime/lane_plan.h"

namespace tandem {

struct RuntimeOptions {
  std::string model_dir;               // config.json + safetensors
  int threads = 0;                     // CPU threads (0: all hardware threads)
  int64_t max_ctx = 0;                 // context limit per sequence (0: the engine's default for the model)
  Device device;                       // parse_device
  Lane lane = Lane::kLocal;            // parse_lane
  std::string peer;                    // peer and split lanes: the lane name of the peer
  std::string split_peer;              // split lane: its peer's name when it differs from `peer`
  std::optional<double> split_share;   // split lane: share in (0, 1) over PCIe; nullopt: the cut its peer published
  std::string rowmap;                  // host, peer and split lanes: the rowmap's path
  // Host lane without a rowmap: a stand-in placement (cold_tail of this fraction) instead (ignored by
  // the local lane; refused by the lanes with a peer, which must use the rowmap their peer serves).
  std::optional<double> stand_in_cold;
  uint64_t peer_spin_limit_us = 50;    // µs to spin on the peer's answer before blocking (counted as an overrun)
  int64_t peer_check = 0;              // check gate: every Nth handoff per layer recomputed here (0: off)
  double check_min = 0.999;            // a checked row below it trips the lane (below -1: record only)
  double peer_wait_s = 30;             // seconds to wait for the peer to appear and accept this primary
  HostWait host_wait = HostWait::kAuto;  // CUDA: how the host thread waits for each step
  std::string weights = "checkpoint";  // apply_weights_option: checkpoint or fp8
  int64_t max_seqs = 64;               // sequences live at once
  int64_t kv_block = 16;               // EngineOptions pass-through (the CPU engine's paged KV cache)
  int64_t kv_tokens = 0;
  // The CPU engine's KV rows: f32 (the oracle fixtures' precision; the commands that check against
  // them) or bf16 (half the bytes: the server).
  DType kv_dtype = DType::kF32;
};

// The lane name of the peer `o` attaches: --split-peer on the split lane when given, else --peer ("" on
// the lanes without a peer).
std::string peer_lane_name(const RuntimeOptions& o);
// InputError unless the peer of `o`'s lane is being served now (its segment exists), naming the
// command that starts it: for a caller that must not wait --peer-wait for it (a benchmark).
void require_peer_served(const RuntimeOptions& o);

// The rowmap at `path`, validated against `model` (its fingerprint, layers and experts): the one load
// of a rowmap for a model a runtime holds. InputError naming the file and what does not match.
std::unique_ptr<Rowmap> load_rowmap_for(const Model& model, const std::string& path);

// The q-quantile of a lane's wait histogram (peer::kWaitBuckets buckets, bucket i: [2^(i-1), 2^i) µs)
// as text: "<1 us", "<N us", or "-" when it holds no wait. For summaries and `tandem lane`.
std::string wait_percentile(std::span<const uint64_t> hist, double q);

// A peer lane's counters (CPU primary: its executor's; CUDA primary: the engine's lane).
struct LaneCounters {
  peer::ClientStats client;  // handoffs, overruns, waits (from the lane header)
  uint64_t rows_sent = 0, routed_slots = 0, cold_slots = 0;
  std::vector<uint64_t> routed_slots_by_layer, cold_slots_by_layer;  // [n_layer] (0 on dense layers)
  std::vector<LayerCheck> checks;  // [n_layer] the check gate
};

// What Runtime::probe saw.
struct ProbeResult {
  bool passed = false;
  double cosine = 0;      // of the last logits, lane against every expert on this host
  uint64_t handoffs = 0;  // handoffs to the peer during the probe
  std::string why;        // "" when it passed
};

struct Runtime {
  // Members in construction order: the engine and the peer lane refer to the model and the rowmap.
  std::unique_ptr<Model> model;
  std::unique_ptr<Rowmap> rowmap;     // the lanes with cold experts, when planned from a rowmap
  LanePlan plan;                      // lane, cold lists, split column, peer, fingerprints
  std::unique_ptr<PeerExperts> peer;  // the peer lane on a CPU primary
  std::unique_ptr<Engine> engine;
  Device device;
  int64_t max_seqs = 0;

  // Builds a runtime (see the file comment). InputError for bad options (naming the flag), a model
  // that does not load, a rowmap for another model, a peer that can't be attached or serves another
  // fingerprint; OutOfMemoryError where the device says so. Warns when max_ctx exceeds the model's
  // max_position_embeddings.
  static Runtime open(const RuntimeOptions& options);

  Lane lane() const { return plan.lane; }
  int64_t split_column() const { return plan.split_column; }
  // The peer lane's counters (syncs a GPU); nullopt on the lanes without a peer.
  std::optional<LaneCounters> lane_counters() const;
  // One line of the lane's counters (and the check gate's per-layer minimum), for a closing summary;
  // "" for the lanes without a peer.
  std::string lane_summary() const;
  // The check gate's per-layer results of a peer lane; null for other lanes. Valid until the next call.
  const std::vector<LayerCheck>* lane_checks() const;
  // The probe a lane passes before it serves (the server, after a start or a restart): a fixed 8-token
  // prompt through this runtime's engine and through every expert on this host (a CpuEngine of the
  // same model, no lane); their last logits must agree to a cosine of at least `bar`, and a lane with a
  // peer must have handed off at least once on the way. Uses one sequence of the engine and frees it.
  ProbeResult probe(double bar);
  // The state of the peer's lane as its shared-memory header says now ("starting", "serving",
  // "tripped", "refused", "stopped"; "gone" when the segment is no longer there); "" without a peer.
  std::string lane_state() const;

 private:
  mutable std::vector<LayerCheck> checks_;
};

}  // namespace tandem
