// The sidecar lane on the primary: per MoE layer and step, rows routed to cold experts go to the peer
// (with their cold expert ids and gate weights; hot slots masked to -1) while the hot experts run
// here; the peer's weighted rows are then added in. run() returns only with every row complete — a
// peer that does not answer keeps it waiting (spin, then block, no deadline); a tripped lane or an
// error status throws, failing the request. The check gate recomputes every Nth handoff per layer on
// the primary's own reference path and records the per-row cosine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moe/executor.h"
#include "peer/client.h"
#include "placement/rowmap.h"

namespace tandem {

// The 64-bit fingerprint both sides of a lane put in the shared-memory header: a hash of the rowmap's
// fingerprint, which itself covers the model fingerprint and every hot/cold list, and of the split
// column of the split lane (0: the peer computes whole experts), so a peer and a primary that split
// the experts differently refuse each other.
// weights_fp (cold_weights_fingerprint) joins it when not 0, so a peer holding other weights of the
// same shapes is refused too.
uint64_t lane_fingerprint(const Rowmap& rowmap, int64_t split_begin = 0, uint64_t weights_fp = 0);

// A fingerprint of the content of the rowmap's cold experts as `model` maps them: for each MoE layer
// and cold expert (ascending), for each of gate, up and down, the tensor's byte size and 16 windows of
// 64 bytes spread evenly over its bytes (first and last included), FNV-1a 64. Sampled, not a full hash:
// the primary maps but never reads its cold experts otherwise (a GPU primary, a 600 GB checkpoint),
// and 3 KB per expert keeps the cost at a few page reads per tensor whatever the checkpoint's size.
// Other weights of the same shapes (another seed, another fine-tune) differ in every window; a damage
// between windows is what the check gate is for. The model must hold every cold expert (asserted).
uint64_t cold_weights_fingerprint(const Model& model, const Rowmap& rowmap);

struct PeerLaneOptions {
  std::string lane;              // --peer NAME
  uint64_t spin_limit_us = 50;   // --peer-spin-limit
  int64_t check_every = 0;       // --peer-check N: 0 = off
  // --check-min: a checked row whose cosine is below this trips the lane (cause check_failed): the
  // request fails, no further token. Below -1: record only (tandem check gives its own verdict).
  double check_min = 0.999;
  double attach_timeout_s = 30;  // --peer-wait
};

struct LayerCheck {
  int64_t checks = 0;        // rows compared
  double min_cosine = 1.0;
  double sum_cosine = 0.0;   // of every row compared (mean = sum_cosine / checks)
};

// The cosine of rows a and b [n], in f64: 1 when both are zero, 0 when one is, -1 when not finite.
double row_cosine(const float* a, const float* b, int64_t n);

// The check gate on one row, for every primary (CPU or GPU): the cosine of the peer's row `got` [n]
// against the primary's reference `want` [n] (1 when both are zero, 0 when one is, -1 when not finite)
// joins `chk`; below `bar` the lane trips (cause check_failed) and this throws LaneTripped, so the row
// never becomes a token.
void check_row(LayerCheck& chk, const float* got, const float* want, int64_t n, double bar, peer::PeerClient& client,
               int64_t layer, int64_t row);

class PeerExperts final : public ExpertExecutor {
 public:
  // rowmap must already be validated against model. Throws InputError when the lane can't be attached.
  PeerExperts(const Model& model, const Rowmap& rowmap, const PeerLaneOptions& options, ThreadPool& pool);
  void run(int64_t layer, const float* x, int64_t n_rows, const Routing& routing, float* out) override;

  peer::ClientStats stats() const { return client_->stats(); }
  uint64_t rows_sent() const { return rows_sent_; }
  uint64_t routed_slots() const { return routed_slots_; }  // (row, expert) pairs routed, hot + cold
  uint64_t cold_slots() const { return cold_slots_; }
  const std::vector<uint64_t>& routed_slots_by_layer() const { return routed_by_layer_; }  // [n_layer]
  const std::vector<uint64_t>& cold_slots_by_layer() const { return cold_by_layer_; }      // [n_layer]
  const std::vector<LayerCheck>& checks() const { return checks_; }  // [n_layer]
  void close() { client_->close(); }
  uint64_t weights_fingerprint() const { return weights_fp_; }
  // The model whose experts the check gate recomputes the cold rows with, instead of the lane's own
  // (`tandem check --reference checkpoint`: the checkpoint as stored, against a lane that quantized its
  // experts at load, measures what the quantization changes). It must be the same architecture and
  // shapes (InputError otherwise) and outlive this lane.
  void set_check_reference(const Model& reference);

 private:
  const Model& model_;
  const Model* reference_;  // the check gate's experts: model_ unless set_check_reference
  ThreadPool& pool_;
  PeerLaneOptions options_;
  std::vector<std::vector<uint8_t>> cold_;  // [layer][expert] 1 = on the peer
  uint64_t weights_fp_ = 0;
  std::unique_ptr<peer::PeerClient> client_;
  std::vector<int64_t> handoffs_per_layer_;
  std::vector<LayerCheck> checks_;
  uint64_t rows_sent_ = 0, routed_slots_ = 0, cold_slots_ = 0;
  std::vector<uint64_t> routed_by_layer_, cold_by_layer_;
  // Scratch, grown once.
  std::vector<int32_t> hot_ids_, cold_ids_;
  std::vector<float> cold_w_, cold_x_, cold_out_, ref_out_;
  std::vector<int64_t> cold_rows_;
};

}  // namespace tandem
