// Shared model-running options (see common.h).
#include "cli/common.h"

#include <fmt/format.h>

#include "core/thread_pool.h"
#include "placement/fingerprint.h"

namespace tandem::cli {

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.model_dir, "Model folder (config.json + safetensors)")->required();
  app.add_option("--threads", o.threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--ctx", o.max_ctx, "Context limit per sequence (default: the model's max_position_embeddings)");
  app.add_option("--device", o.device, "cpu (default)");
  app.add_option("--lane", o.lane, "Where cold experts run: local (every expert here, default) or peer (a sidecar "
                                   "process started with `tandem peer`)");
  app.add_option("--peer", o.peer, "Lane name of the peer (lane peer)");
  app.add_option("--rowmap", o.rowmap, "Rowmap the peer serves (lane peer)");
  app.add_option("--peer-spin-limit", o.peer_spin_limit_us,
                 "Microseconds to spin on the peer's answer before blocking (no deadline; counted as an overrun)");
  app.add_option("--peer-check", o.peer_check,
                 "Check gate: recompute every Nth handoff per layer here and record the cosine (0 = off)");
}

Runtime make_runtime(const ModelOptions& o, int64_t max_seqs) {
  if (o.device != "cpu") fail("--device {}: this build runs on the cpu only", o.device);
  set_global_threads(o.threads);
  Runtime rt;
  rt.model = Model::load(o.model_dir);
  EngineOptions eo;
  eo.max_seqs = max_seqs;
  eo.max_ctx = o.max_ctx;
  ExpertExecutor* experts = nullptr;
  if (o.lane == "peer") {
    if (o.peer.empty() || o.rowmap.empty()) fail("--lane peer needs --peer NAME and --rowmap R");
    rt.rowmap = std::make_unique<Rowmap>(Rowmap::load(o.rowmap));
    validate(*rt.rowmap, rt.model->cfg, model_fingerprint(rt.model->cfg, rt.model->store), o.rowmap);
    PeerLaneOptions po;
    po.lane = o.peer;
    po.spin_limit_us = o.peer_spin_limit_us;
    po.check_every = o.peer_check;
    rt.peer = std::make_unique<PeerExperts>(*rt.model, *rt.rowmap, po, global_pool());
    experts = rt.peer.get();
  } else if (o.lane != "local") {
    fail("--lane {}: unknown lane on the cpu (supported: local, peer)", o.lane);
  } else if (!o.peer.empty() || o.peer_check) {
    fail("--peer and --peer-check need --lane peer");
  }
  rt.engine = std::make_unique<CpuEngine>(*rt.model, eo, experts);
  return rt;
}

std::string Runtime::lane_summary() const {
  if (!peer) return "";
  auto st = peer->stats();
  auto pct = [&](double q) {
    uint64_t target = uint64_t(std::ceil(q * double(st.handoffs))), seen = 0;
    for (size_t i = 0; i < st.wait_hist.size(); ++i) {
      seen += st.wait_hist[i];
      if (seen >= target && target > 0) return i == 0 ? std::string("<1 us") : fmt::format("<{} us", uint64_t(1) << i);
    }
    return std::string("-");
  };
  std::string s = fmt::format("lane peer: {} handoffs, {} rows sent, cold share {:.1f}% of routed slots, wait mean {:.1f} us, "
                              "p50 {}, p99 {}, max {:.1f} us, spin-limit overruns {}",
                              st.handoffs, peer->rows_sent(),
                              peer->routed_slots() ? 100.0 * double(peer->cold_slots()) / double(peer->routed_slots()) : 0.0,
                              st.handoffs ? double(st.wait_ns_total) / double(st.handoffs) / 1e3 : 0.0, pct(0.5), pct(0.99),
                              double(st.wait_ns_max) / 1e3, st.overruns);
  const auto& checks = peer->checks();
  std::string gate;
  for (size_t l = 0; l < checks.size(); ++l)
    if (checks[l].checks) gate += fmt::format(" L{}:{:.6f}({})", l, checks[l].min_cosine, checks[l].checks);
  if (!gate.empty()) s += "\ncheck gate min cosine per layer (rows):" + gate;
  return s;
}

}  // namespace tandem::cli
