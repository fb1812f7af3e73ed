// The memory bound of a decode step (see bound.h).
#include "bench/bound.h"

#include <algorithm>

#include "core/bandwidth.h"
#include "core/error.h"
#include "core/thread_pool.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem::bench {

Probe probe_routing(Engine& engine, const Rowmap* rowmap, std::vector<GenerateRequest> reqs, int64_t tokens) {
  const Model& model = engine.model();
  const auto& cfg = model.cfg;
  std::vector<std::vector<uint8_t>> cold(size_t(cfg.n_layer), std::vector<uint8_t>(size_t(cfg.n_expert), 0));
  if (rowmap)
    for (const auto& l : rowmap->layers)
      for (int32_t e : l.cold) cold[size_t(l.layer)][size_t(e)] = 1;
  for (auto& r : reqs) r.max_tokens = tokens;
  Probe p;
  uint64_t routed = 0, cold_slots = 0;
  size_t chosen = 0;
  bool decoding = false;
  std::vector<uint8_t> seen(size_t(cfg.n_expert));
  GenerateOptions go;
  go.on_token = [&](size_t, int32_t) { decoding = ++chosen >= reqs.size(); };
  engine.hooks.on_routing = [&](int64_t layer, const Routing& r) {
    if (!decoding) return;
    p.k = r.k;
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t row = 0; row < r.n_rows; ++row) {
      bool any_cold = false;
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t e = r.ids[size_t(row * r.k + j)];
        if (e < 0) continue;
        ++routed;
        const bool c = cold[size_t(layer)][size_t(e)] != 0;
        cold_slots += c;
        any_cold = any_cold || c;
        if (!seen[size_t(e)]) {
          seen[size_t(e)] = 1;
          (c ? p.cold_bytes : p.hot_bytes) += double(model.layers[size_t(layer)].experts[size_t(e)].nbytes());
        }
      }
      p.cold_rows += any_cold;
    }
  };
  GenerateStats st;
  try {
    generate(engine, reqs, go, &st);
  } catch (...) {
    engine.hooks = {};
    throw;
  }
  engine.hooks = {};
  const double steps = double(std::max<int64_t>(1, st.decode_steps));
  p.hot_bytes /= steps;
  p.cold_bytes /= steps;
  p.cold_rows /= steps;
  p.cold_share = routed ? double(cold_slots) / double(routed) : 0;
  return p;
}

double fixed_bytes(const Model& model) {
  double routed = 0;
  for (const auto& l : model.layers)
    for (const auto& e : l.experts) routed += e.present() ? double(e.nbytes()) : 0;
  const double embed = model.lm_head.data == model.embed.data ? 0 : double(model.embed.nbytes());
  return double(model.store.total_bytes()) - routed - embed;
}

PathBytes path_bytes(const Device& device, Lane lane, double fixed, const Probe& p, int64_t hidden,
                     double split_share) {
  PathBytes b;
  if (device.is_cpu()) {
    b.dram = fixed + p.hot_bytes + p.cold_bytes;  // primary and peer read the same DRAM
    return b;
  }
  // The rows a lane with a peer sends there and back (f32), with their ids and weights.
  const double rows = p.cold_rows * (2.0 * double(hidden) * 4 + double(p.k) * 8);
  switch (lane) {
    case Lane::kLocal: b.hbm = fixed + p.hot_bytes + p.cold_bytes; break;
    case Lane::kHost:
      b.hbm = fixed + p.hot_bytes;
      b.link = p.cold_bytes;
      break;
    case Lane::kPeer:
      b.hbm = fixed + p.hot_bytes;
      b.dram = p.cold_bytes;
      b.link = rows;
      break;
    case Lane::kSplit:
      b.hbm = fixed + p.hot_bytes;
      b.dram = (1.0 - split_share) * p.cold_bytes;
      b.link = split_share * p.cold_bytes + rows;
      break;
  }
  return b;
}

ToMeasure bandwidths_to_measure(Bandwidths& bw, const Device& device, bool link_used, bool dram_used) {
  if (device.is_cpu()) link_used = false, dram_used = true;
  const auto need = [](double& gbps, std::string& source, bool used) {
    if (!used) {
      source = "not used";
      return false;
    }
    source = gbps > 0 ? "command line" : "measured";
    return gbps == 0;
  };
  ToMeasure m;
  m.hbm = need(bw.hbm_gbps, bw.hbm_source, !device.is_cpu());
  m.link = need(bw.link_gbps, bw.link_source, link_used);
  m.dram = need(bw.dram_gbps, bw.dram_source, dram_used);
  return m;
}

void measure_bandwidths(Bandwidths& bw, const ToMeasure& m, const Device& device, int threads) {
  if (m.dram) {
    ThreadPool pool(threads);
    bw.dram_gbps = dram_read_bandwidth_gbps(pool);
  }
  if (!m.hbm && !m.link) return;
#ifdef TANDEM_HAVE_CUDA
  if (device.cuda) {
    if (m.hbm) bw.hbm_gbps = cuda_read_bandwidth_gbps(device.index);
    if (m.link) bw.link_gbps = cuda_host_read_bandwidth_gbps(device.index);
    return;
  }
#endif
  fail("--device {}: this build has no CUDA backend to measure the GPU's bandwidths with", device.name());
}

}  // namespace tandem::bench
