// A lane's plan: which routed experts of each layer are cold (off the primary's device), where the
// peer is, where the split lane cuts each cold expert, and the fingerprints both sides of the lane
// check. Made once per runtime from a rowmap (validated against the model before) or, for the host
// lane, from a stand-in placement; the engines and executors take its lists as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"

namespace tandem {

struct LanePlan {
  Lane lane = Lane::kLocal;
  // [n_layer] lists: per layer the cold expert ids, ascending (empty for non-MoE layers and the
  // local lane). Host lane: kept in pinned host memory; peer lane: computed by the peer; split: both.
  std::vector<std::vector<int32_t>> cold;
  int64_t split_column = 0;        // split lane: intermediate features [0, it) of each cold expert on the primary
  std::string peer;                // peer and split lanes: the lane name the peer serves
  std::string rowmap_fingerprint;  // "fp1:..." of the rowmap; "" for a stand-in
  bool is_stand_in = false;        // the lists are cold_tail's, not a planned rowmap's
  // Peer and split lanes: cold_weights_fingerprint of the cold experts (0 when not known) and the
  // 64-bit lane fingerprint both sides put in the shared-memory header (lane_fingerprint()).
  uint64_t weights_fp = 0;
  uint64_t lane_fp = 0;

  int64_t n_cold() const;  // over all layers

  // The local lane: nothing cold, no peer.
  static LanePlan local(int64_t n_layer);
  // `lane`'s plan from `rm`, which validate() accepted for this model (n_layer layers): its cold lists,
  // its fingerprint and, for the lanes with a peer, the lane fingerprint over rm, split_column and
  // weights_fp (what the peer computes the same way). InputError when a lane with a peer has no peer
  // name, or the split lane no cut in (0, inter).
  static LanePlan from_rowmap(Lane lane, const Rowmap& rm, int64_t n_layer, std::string peer = {},
                              int64_t split_column = 0, uint64_t weights_fp = 0);
  // The host lane without a planned rowmap: cold_tail(cfg, fraction). InputError for another lane (a
  // peer loads a rowmap, so its primary must use the same one) or a fraction outside [0, 1].
  static LanePlan from_stand_in(Lane lane, const ModelConfig& cfg, double fraction);
};

// Per layer ([n_layer] lists), the round(fraction · n_expert) highest expert ids of every MoE layer:
// a stand-in placement until a planned rowmap is given. InputError unless fraction is in [0, 1].
std::vector<std::vector<int32_t>> cold_tail(const ModelConfig& cfg, double fraction);
// The same placement as a finalized rowmap for the model with fingerprint `model_fp` (for a peer to
// load: its source says "cold-tail").
Rowmap cold_tail_rowmap(const ModelConfig& cfg, const std::string& model_fp, double fraction);

}  // namespace tandem
