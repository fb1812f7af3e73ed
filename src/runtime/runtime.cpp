// Runtime::open and the lane's counters (see runtime.h).
#include "runtime/runtime.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "peer/segment.h"
#include "placement/fingerprint.h"
#include "runtime/split.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem {
namespace {

// Every check that needs no model, in the order the flags were always checked: device, split share,
// lane names, then what the lane needs on this device.
void check_options(const RuntimeOptions& o) {
#ifndef TANDEM_HAVE_CUDA
  if (o.device.cuda) fail("--device {}: this build has no CUDA backend (cpu only)", o.device.name());
#endif
  if (o.split_share) check_split_share(*o.split_share);  // an error on every lane, not only where it is used
  if (!o.peer.empty()) peer::validate_lane_name(o.peer);
  if (!o.split_peer.empty()) peer::validate_lane_name(o.split_peer);
  if (o.stand_in_cold && !(*o.stand_in_cold >= 0.0 && *o.stand_in_cold <= 1.0))
    fail("cold fraction {} is outside [0, 1]", *o.stand_in_cold);
  if (o.max_seqs < 1) fail("max_seqs {}: need at least 1 sequence", o.max_seqs);
  const char* lane = lane_name(o.lane);
  if (o.stand_in_cold && lane_has_peer(o.lane))
    fail("lane {}: a stand-in placement (cold fraction {}) serves the host lane only; the lanes with a peer need "
         "the rowmap their peer serves (--rowmap R)",
         lane, *o.stand_in_cold);
  if (o.device.is_cpu()) {
    switch (o.lane) {
      case Lane::kLocal: break;
      case Lane::kPeer:
        if (o.peer.empty() || o.rowmap.empty()) fail("--lane peer needs --peer NAME and --rowmap R");
        break;
      case Lane::kHost:
      case Lane::kSplit:
        fail("--lane {}: not a lane on the cpu (supported: local, peer; host and split need --device cuda)", lane);
    }
  } else if (lane_has_peer(o.lane) && peer_lane_name(o).empty()) {
    fail("--lane {} needs --peer NAME and --rowmap R", lane);
  }
  if (!lane_has_peer(o.lane) && (!o.peer.empty() || o.peer_check)) fail("--peer and --peer-check need --lane peer");
  if (lane_has_cold(o.lane) && o.rowmap.empty() && !o.stand_in_cold) fail("--lane {} needs --rowmap R (tandem plan)", lane);
}

}  // namespace

std::unique_ptr<Rowmap> load_rowmap_for(const Model& model, const std::string& path) {
  auto rm = std::make_unique<Rowmap>(Rowmap::load(path));
  validate(*rm, model.cfg, model_fingerprint(model.cfg, model.store), path);
  return rm;
}

std::string wait_percentile(std::span<const uint64_t> hist, double q) {
  uint64_t total = 0;
  for (uint64_t v : hist) total += v;
  if (total == 0) return "-";
  const uint64_t target = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(total))));
  uint64_t seen = 0;
  for (size_t i = 0; i < hist.size(); ++i) {
    seen += hist[i];
    if (seen >= target) return i == 0 ? std::string("<1 us") : fmt::format("<{} us", uint64_t(1) << i);
  }
  return "-";
}

std::string peer_lane_name(const RuntimeOptions& o) {
  if (!lane_has_peer(o.lane)) return "";
  return o.lane == Lane::kSplit && !o.split_peer.empty() ? o.split_peer : o.peer;
}

void require_peer_served(const RuntimeOptions& o) {
  const std::string name = peer_lane_name(o);
  if (name.empty()) fail("--lane {} needs --peer NAME and --rowmap R", lane_name(o.lane));
  if (!peer::Segment::exists(name))
    fail("lane {}: no lane is being served (no /dev/shm/tandem-{}); start `tandem peer --model M --rowmap R --lane "
         "{}{}` first",
         lane_name(o.lane), name, name, o.lane == Lane::kSplit ? " --split-share F|auto" : "");
}

Runtime Runtime::open(const RuntimeOptions& o) {
  check_options(o);
  set_global_threads(o.threads);
  Runtime rt;
  rt.device = o.device;
  rt.max_seqs = o.max_seqs;
  ModelConfig cfg = load_config(o.model_dir);
  apply_weights_option(cfg, o.weights);
  rt.model = Model::bind(std::move(cfg), TensorStore::open_dir(o.model_dir), o.model_dir);
  const ModelConfig& mc = rt.model->cfg;
  const int64_t positions = mc.max_position_embeddings;
  if (o.max_ctx > 0 && positions > 0 && o.max_ctx > positions)
    spdlog::warn("--ctx {} exceeds the model's max_position_embeddings ({}): positions past {} were not trained and "
                 "answers may degrade there",
                 o.max_ctx, positions, positions);
  EngineOptions eo;
  eo.max_seqs = o.max_seqs;
  eo.max_ctx = o.max_ctx;
  eo.kv_block = o.kv_block;
  eo.kv_tokens = o.kv_tokens;
  eo.kv_dtype = o.kv_dtype;

  // The lane's plan: from the rowmap (validated once, here), or the host lane's stand-in.
  rt.plan = LanePlan::local(mc.n_layer);
  if (lane_has_cold(o.lane)) {
    if (!o.rowmap.empty()) rt.rowmap = load_rowmap_for(*rt.model, o.rowmap);
    if (!rt.rowmap) {
      rt.plan = LanePlan::from_stand_in(o.lane, mc, *o.stand_in_cold);
    } else if (!lane_has_peer(o.lane)) {
      rt.plan = LanePlan::from_rowmap(o.lane, *rt.rowmap, mc.n_layer);
    }
  }

  if (o.device.cuda) {
#ifdef TANDEM_HAVE_CUDA
    if (lane_has_peer(o.lane)) {
      const std::string name = peer_lane_name(o);
      const int64_t cut = o.lane == Lane::kSplit
                              ? resolve_split_column(o.split_share, name, mc.moe_intermediate_size, o.peer_wait_s)
                              : 0;
      rt.plan = LanePlan::from_rowmap(o.lane, *rt.rowmap, mc.n_layer, name, cut,
                                      cold_weights_fingerprint(*rt.model, *rt.rowmap));
    }
    CudaOptions co;
    co.device = o.device.index;
    co.host_wait = host_wait_sleeps(o.host_wait, o.lane) ? CudaHostWait::kSleep : CudaHostWait::kSpin;
    switch (o.lane) {
      case Lane::kLocal: co.lane = CudaLane::kLocal; break;
      case Lane::kHost: co.lane = CudaLane::kHost; break;
      case Lane::kPeer: co.lane = CudaLane::kPeer; break;
      case Lane::kSplit: co.lane = CudaLane::kSplit; break;
    }
    if (lane_has_cold(o.lane)) co.cold = rt.plan.cold;
    co.split_begin = rt.plan.split_column;
    co.peer = rt.plan.peer;
    co.peer_fingerprint = rt.plan.lane_fp;
    co.peer_attach_timeout_s = o.peer_wait_s;
    co.peer_spin_limit_us = o.peer_spin_limit_us;
    co.peer_check = o.peer_check;
    co.check_min = o.check_min;
    rt.engine = make_cuda_engine(*rt.model, eo, co);
    return rt;
#endif
  }

  ExpertExecutor* experts = nullptr;
  if (o.lane == Lane::kPeer) {
    PeerLaneOptions po;
    po.lane = o.peer;
    po.spin_limit_us = o.peer_spin_limit_us;
    po.check_every = o.peer_check;
    po.check_min = o.check_min;
    po.attach_timeout_s = o.peer_wait_s;
    rt.peer = std::make_unique<PeerExperts>(*rt.model, *rt.rowmap, po, global_pool());
    rt.plan = LanePlan::from_rowmap(o.lane, *rt.rowmap, mc.n_layer, o.peer, 0, rt.peer->weights_fingerprint());
    experts = rt.peer.get();
  }
  rt.engine = std::make_unique<CpuEngine>(*rt.model, eo, experts);
  return rt;
}

std::optional<LaneCounters> Runtime::lane_counters() const {
  if (peer)
    return LaneCounters{peer->stats(), peer->rows_sent(), peer->routed_slots(), peer->cold_slots(),
                        peer->routed_slots_by_layer(), peer->cold_slots_by_layer(), peer->checks()};
#ifdef TANDEM_HAVE_CUDA
  if (engine)
    if (auto st = cuda_peer_stats(*engine))
      return LaneCounters{st->client, st->rows_sent, st->routed_slots, st->cold_slots,
                          std::move(st->routed_slots_by_layer), std::move(st->cold_slots_by_layer),
                          std::move(st->checks)};
#endif
  return std::nullopt;
}

std::string Runtime::lane_summary() const {
  const std::optional<LaneCounters> c = lane_counters();
  if (!c) return "";
  const peer::ClientStats& st = c->client;
  std::string s = fmt::format(
      "lane {}: {} handoffs, {} rows sent, cold share {:.1f}% of routed slots, wait mean {:.1f} us, p50 {}, p99 {}, "
      "max {:.1f} us, spin-limit overruns {}",
      lane_name(plan.lane), st.handoffs, c->rows_sent,
      c->routed_slots ? 100.0 * double(c->cold_slots) / double(c->routed_slots) : 0.0,
      st.handoffs ? double(st.wait_ns_total) / double(st.handoffs) / 1e3 : 0.0, wait_percentile(st.wait_hist, 0.5),
      wait_percentile(st.wait_hist, 0.99), double(st.wait_ns_max) / 1e3, st.overruns);
  std::string gate;
  for (size_t l = 0; l < c->checks.size(); ++l)
    if (c->checks[l].checks) gate += fmt::format(" L{}:{:.6f}({})", l, c->checks[l].min_cosine, c->checks[l].checks);
  if (!gate.empty()) s += "\ncheck gate min cosine per layer (rows):" + gate;
  return s;
}

const std::vector<LayerCheck>* Runtime::lane_checks() const {
  if (peer) return &peer->checks();
  std::optional<LaneCounters> c = lane_counters();
  if (!c) return nullptr;
  checks_ = std::move(c->checks);
  return &checks_;
}

std::string Runtime::lane_state() const {
  if (!lane_has_peer(plan.lane) || plan.peer.empty()) return "";
  try {
    auto seg = peer::Segment::open(plan.peer, 0.0);
    return peer::state_name(seg->header().state.load(std::memory_order_acquire));
  } catch (const InputError&) {
    return "gone";
  }
}

ProbeResult Runtime::probe(double bar) {
  const int64_t vocab = model->cfg.vocab_size;
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < 8; ++i) prompt.push_back(int32_t((7 + 131 * i) % vocab));
  auto last_logits = [&](Engine& e) {
    const int seq = e.add_sequence();
    const Engine::Item item{seq, prompt};
    std::vector<float> out;
    try {
      out = e.forward(std::span<const Engine::Item>(&item, 1));
    } catch (...) {
      e.remove_sequence(seq);
      throw;
    }
    e.remove_sequence(seq);
    return out;
  };
  auto handoffs_now = [&] {
    const std::optional<LaneCounters> c = lane_counters();
    return c ? c->client.handoffs : uint64_t(0);
  };
  ProbeResult r;
  const uint64_t before = handoffs_now();
  std::vector<float> got;
  try {
    got = last_logits(*engine);
  } catch (const std::exception& ex) {
    r.why = fmt::format("the probe's step failed: {}", ex.what());
    return r;
  }
  r.handoffs = handoffs_now() - before;
  if (lane_has_peer(plan.lane) && r.handoffs == 0) {
    r.why = "the probe reached no cold expert: the lane was not exercised";
    return r;
  }
  EngineOptions eo;
  eo.max_seqs = 1;
  eo.max_ctx = int64_t(prompt.size());
  CpuEngine reference(*model, eo);
  const std::vector<float> want = last_logits(reference);
  r.cosine = row_cosine(got.data(), want.data(), vocab);
  if (!(r.cosine >= bar)) {
    r.why = fmt::format("the probe's logits through the lane have cosine {:.6f} against every expert on this host, "
                        "below {}",
                        r.cosine, bar);
    return r;
  }
  r.passed = true;
  return r;
}

}  // namespace tandem
