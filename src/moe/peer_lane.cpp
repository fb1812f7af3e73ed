// The sidecar lane on the primary (see peer_lane.h).
#include "moe/peer_lane.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "models/model.h"
#include "placement/fingerprint.h"

namespace tandem {

uint64_t lane_fingerprint(const Rowmap& rowmap, int64_t split_begin, uint64_t weights_fp) {
  Fnv1a64 h;
  h.add("tandem.lane/1:");
  h.add(rowmap.rowmap_fingerprint);
  if (split_begin > 0) h.add(fmt::format(":split={}", split_begin));
  if (weights_fp != 0) h.add(fmt::format(":weights={:016x}", weights_fp));
  return h.value();
}

uint64_t cold_weights_fingerprint(const Model& model, const Rowmap& rowmap) {
  constexpr size_t kWindows = 16, kWindowBytes = 64;
  Fnv1a64 h;
  h.add("tandem.weights/1:");
  for (const auto& layer : rowmap.layers) {
    std::vector<int32_t> cold = layer.cold;
    std::sort(cold.begin(), cold.end());
    for (int32_t e : cold) {
      TANDEM_ASSERT(layer.layer >= 0 && size_t(layer.layer) < model.layers.size() && e >= 0 &&
                        size_t(e) < model.layers[size_t(layer.layer)].experts.size(),
                    "cold expert {} of layer {} outside the model", e, layer.layer);
      const ExpertWeights& w = model.layers[size_t(layer.layer)].experts[size_t(e)];
      TANDEM_ASSERT(w.present(), "cold expert {} of layer {} is not mapped", e, layer.layer);
      h.add(fmt::format("{}/{}:", layer.layer, e));
      for (const TensorView* t : {&w.gate, &w.up, &w.down}) {
        const size_t n = t->nbytes();
        const char* bytes = static_cast<const char*>(t->data);
        h.add(fmt::format("{};", n));
        if (n <= kWindows * kWindowBytes) {
          h.add(std::string_view(bytes, n));
          continue;
        }
        for (size_t i = 0; i < kWindows; ++i)
          h.add(std::string_view(bytes + i * (n - kWindowBytes) / (kWindows - 1), kWindowBytes));
      }
    }
  }
  return h.value();
}

PeerExperts::PeerExperts(const Model& model, const Rowmap& rowmap, const PeerLaneOptions& options, ThreadPool& pool)
    : model_(model), reference_(&model), pool_(pool), options_(options) {
  const auto& c = model.cfg;
  cold_.assign(size_t(c.n_layer), std::vector<uint8_t>(size_t(c.n_expert), 0));
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (c.layer_is_moe[size_t(l)])
      for (int64_t e = 0; e < c.n_expert; ++e) cold_[size_t(l)][size_t(e)] = rowmap.is_cold(l, int32_t(e));
  peer::Geometry g;
  g.n_slots = 1;
  g.max_rows = 1;  // the least we need; requests are chunked by what the peer offers
  g.hidden = uint32_t(c.hidden_size);
  g.max_k = uint32_t(c.n_expert_used);
  peer::ClientOptions co;
  co.spin_limit_us = options.spin_limit_us;
  co.attach_timeout_s = options.attach_timeout_s;
  weights_fp_ = cold_weights_fingerprint(model, rowmap);
  co.rowmap_fingerprint = peer::fp1_value(rowmap.rowmap_fingerprint);
  co.weights_fingerprint = weights_fp_;
  spdlog::info("lane {}: expecting rowmap {} and cold-expert weights {}", options.lane, rowmap.rowmap_fingerprint,
               peer::fp1_text(weights_fp_));
  client_ = peer::PeerClient::attach(options.lane, lane_fingerprint(rowmap, 0, weights_fp_), g, co);
  handoffs_per_layer_.assign(size_t(c.n_layer), 0);
  routed_by_layer_.assign(size_t(c.n_layer), 0);
  cold_by_layer_.assign(size_t(c.n_layer), 0);
  checks_.assign(size_t(c.n_layer), LayerCheck{});
  spdlog::info("lane {}: attached (peer offers {} rows per request)", options.lane, client_->geometry().max_rows);
}

void PeerExperts::run(int64_t layer, const float* x, int64_t n_rows, const Routing& routing, float* out) {
  const int64_t k = routing.k, H = model_.cfg.hidden_size;
  const auto& cold = cold_[size_t(layer)];
  // Split every (row, slot) into the hot or the cold routing; rows with a cold slot go to the peer.
  hot_ids_.assign(routing.ids.begin(), routing.ids.end());
  cold_rows_.clear();
  cold_ids_.clear();
  cold_w_.clear();
  uint64_t n_cold = 0, n_routed = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    bool any = false;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = routing.ids[size_t(r * k + j)];
      if (e >= 0 && cold[size_t(e)]) any = true;
    }
    if (!any) continue;
    cold_rows_.push_back(r);
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = routing.ids[size_t(r * k + j)];
      bool is_cold = e >= 0 && cold[size_t(e)];
      cold_ids_.push_back(is_cold ? e : -1);
      cold_w_.push_back(is_cold ? routing.weights[size_t(r * k + j)] : 0.0f);
      if (is_cold) {
        hot_ids_[size_t(r * k + j)] = -1;
        ++n_cold;
      }
    }
  }
  for (int32_t e : routing.ids) n_routed += e >= 0;
  routed_slots_ += n_routed;
  cold_slots_ += n_cold;
  routed_by_layer_[size_t(layer)] += n_routed;
  cold_by_layer_[size_t(layer)] += n_cold;
  const int64_t m = int64_t(cold_rows_.size());
  cold_x_.resize(size_t(m * H));
  cold_out_.resize(size_t(m * H));
  for (int64_t i = 0; i < m; ++i) std::copy(x + cold_rows_[size_t(i)] * H, x + (cold_rows_[size_t(i)] + 1) * H, cold_x_.begin() + i * H);

  // Hand the cold rows over in chunks the peer can take; the first chunk's compute overlaps ours.
  const int64_t cap = int64_t(client_->geometry().max_rows);
  int64_t sent = 0;
  auto submit_next = [&] {
    int64_t count = std::min(cap, m - sent);
    client_->submit(0, int(layer), cold_x_.data() + sent * H, count, cold_ids_.data() + sent * k,
                    cold_w_.data() + sent * k, k);
    return count;
  };
  int64_t in_flight = m > 0 ? submit_next() : 0;
  run_experts_cpu(model_.layers[size_t(layer)].experts, x, n_rows, H, hot_ids_.data(), routing.weights.data(), k, out,
                  pool_);
  while (in_flight > 0) {
    client_->wait(0, cold_out_.data() + sent * H);  // no deadline: dark beats wrong
    sent += in_flight;
    rows_sent_ += uint64_t(in_flight);
    in_flight = sent < m ? submit_next() : 0;
  }
  for (int64_t i = 0; i < m; ++i) {
    float* o = out + cold_rows_[size_t(i)] * H;
    const float* p = cold_out_.data() + i * H;
    for (int64_t h = 0; h < H; ++h) o[h] += p[h];
  }
  if (m == 0) return;
  // Check gate: every Nth handoff of this layer, recompute the cold rows here and compare.
  int64_t nth = handoffs_per_layer_[size_t(layer)]++;
  if (options_.check_every <= 0 || nth % options_.check_every != 0) return;
  ref_out_.resize(size_t(m * H));
  run_experts_cpu(reference_->layers[size_t(layer)].experts, cold_x_.data(), m, H, cold_ids_.data(), cold_w_.data(),
                  k, ref_out_.data(), pool_);
  auto& chk = checks_[size_t(layer)];
  for (int64_t i = 0; i < m; ++i)
    check_row(chk, cold_out_.data() + i * H, ref_out_.data() + i * H, H, options_.check_min, *client_, layer,
              cold_rows_[size_t(i)]);
}

void PeerExperts::set_check_reference(const Model& reference) {
  const ModelConfig &a = model_.cfg, &b = reference.cfg;
  if (a.n_layer != b.n_layer || a.n_expert != b.n_expert || a.hidden_size != b.hidden_size ||
      a.moe_intermediate_size != b.moe_intermediate_size || a.layer_is_moe != b.layer_is_moe)
    fail("the check gate's reference model has other shapes than the lane's ({} layers, {} experts, hidden {}, "
         "expert width {} against {}, {}, {}, {})",
         b.n_layer, b.n_expert, b.hidden_size, b.moe_intermediate_size, a.n_layer, a.n_expert, a.hidden_size,
         a.moe_intermediate_size);
  reference_ = &reference;
}

double row_cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t h = 0; h < n; ++h) {
    ab += double(a[h]) * b[h];
    aa += double(a[h]) * a[h];
    bb += double(b[h]) * b[h];
  }
  const double cos = (aa == 0 && bb == 0) ? 1.0 : (aa == 0 || bb == 0) ? 0.0 : ab / std::sqrt(aa * bb);
  return std::isfinite(cos) ? cos : -1.0;
}

void check_row(LayerCheck& chk, const float* got, const float* want, int64_t n, double bar, peer::PeerClient& client,
               int64_t layer, int64_t row) {
  const double cos = row_cosine(got, want, n);
  chk.min_cosine = std::min(chk.min_cosine, cos);
  chk.sum_cosine += cos;
  ++chk.checks;
  // The gate is a gate: a row this wrong must not become a token.
  if (cos < bar)
    client.trip(peer::TripCause::kCheck,
                fmt::format("primary: check gate: layer {} row {} cosine {:.6f} is below the bar {} (--check-min)", layer,
                            row, cos, bar));
}

}  // namespace tandem
