// Lane plans (see lane_plan.h).
#include "runtime/lane_plan.h"

#include <fmt/format.h>

#include "core/error.h"
#include "moe/peer_lane.h"

namespace tandem {

int64_t LanePlan::n_cold() const {
  int64_t n = 0;
  for (const auto& l : cold) n += int64_t(l.size());
  return n;
}

LanePlan LanePlan::local(int64_t n_layer) {
  LanePlan p;
  p.cold.assign(size_t(n_layer), {});
  return p;
}

LanePlan LanePlan::from_rowmap(Lane lane, const Rowmap& rm, int64_t n_layer, std::string peer, int64_t split_column,
                               uint64_t weights_fp) {
  LanePlan p = local(n_layer);
  p.lane = lane;
  if (lane == Lane::kLocal) return p;
  for (const auto& layer : rm.layers) {
    TANDEM_ASSERT(layer.layer >= 0 && layer.layer < n_layer, "rowmap layer {} of {} (validate() first)", layer.layer,
                  n_layer);
    p.cold[size_t(layer.layer)] = layer.cold;
  }
  p.rowmap_fingerprint = rm.rowmap_fingerprint;
  if (!lane_has_peer(lane)) return p;
  if (peer.empty()) fail("--lane {} needs --peer NAME and --rowmap R", lane_name(lane));
  if (lane == Lane::kSplit && split_column <= 0)
    fail("lane split: no cut of the cold experts (give --split-share F, or auto with a split peer)");
  p.peer = std::move(peer);
  p.split_column = lane == Lane::kSplit ? split_column : 0;
  p.weights_fp = weights_fp;
  p.lane_fp = lane_fingerprint(rm, p.split_column, weights_fp);
  return p;
}

LanePlan LanePlan::from_stand_in(Lane lane, const ModelConfig& cfg, double fraction) {
  if (lane != Lane::kHost)
    fail("lane {}: a stand-in placement (cold fraction {}) serves the host lane only; the lanes with a peer need "
         "the rowmap their peer serves (--rowmap R)",
         lane_name(lane), fraction);
  LanePlan p = local(cfg.n_layer);
  p.lane = lane;
  p.cold = cold_tail(cfg, fraction);
  p.is_stand_in = true;
  return p;
}

std::vector<std::vector<int32_t>> cold_tail(const ModelConfig& cfg, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) fail("cold fraction {} is outside [0, 1]", fraction);
  std::vector<std::vector<int32_t>> cold(size_t(cfg.n_layer));
  const int64_t n_cold = int64_t(fraction * double(cfg.n_expert) + 0.5);
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    if (cfg.layer_is_moe[size_t(l)])
      for (int64_t e = cfg.n_expert - n_cold; e < cfg.n_expert; ++e) cold[size_t(l)].push_back(int32_t(e));
  return cold;
}

Rowmap cold_tail_rowmap(const ModelConfig& cfg, const std::string& model_fp, double fraction) {
  const auto cold = cold_tail(cfg, fraction);
  Rowmap rm;
  rm.fingerprint = model_fp;
  rm.source.mode = "bench";
  rm.source.policy = "cold-tail";
  rm.source.budget = fmt::format("cold fraction {}", fraction);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (!cfg.layer_is_moe[size_t(l)]) continue;
    RowmapLayer layer;
    layer.layer = l;
    std::vector<bool> is_cold(size_t(cfg.n_expert), false);
    for (int32_t e : cold[size_t(l)]) is_cold[size_t(e)] = true;
    for (int64_t e = 0; e < cfg.n_expert; ++e) (is_cold[size_t(e)] ? layer.cold : layer.hot).push_back(int32_t(e));
    rm.layers.push_back(std::move(layer));
  }
  rm.finalize();
  return rm;
}

}  // namespace tandem
