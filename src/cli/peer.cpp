// `tandem peer`: the sidecar process. Loads only the cold experts of a rowmap, creates the lane's
// shared-memory segment (owner-only), logs `serving`, and computes requests until the lane stops,
// trips, the primary goes away, or SIGTERM/SIGINT. Exit: 0 normal stop, 1 tripped, 2 bad input/refused.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "cli/command.h"
#include "core/thread_pool.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/cold_experts.h"
#include "peer/server.h"
#include "placement/fingerprint.h"

namespace tandem::cli {
namespace {

// Testing aid (--delay-us): answers every request late, to exercise the primary's spin limit and
// block-wait.
class DelayedCompute final : public peer::PeerCompute {
 public:
  DelayedCompute(peer::PeerCompute& inner, uint64_t delay_us) : inner_(inner), delay_us_(delay_us) {}
  int n_layers() const override { return inner_.n_layers(); }
  int n_experts() const override { return inner_.n_experts(); }
  bool is_cold(int layer, int expert) const override { return inner_.is_cold(layer, expert); }
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* w, int64_t k,
               float* out) override {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    inner_.compute(layer, x, n_rows, ids, w, k, out);
  }

 private:
  peer::PeerCompute& inner_;
  uint64_t delay_us_;
};

RunFn setup(CLI::App& app) {
  struct Opts {
    std::string model, rowmap, lane;
    int threads = 0;
    uint32_t max_rows = 256;
    uint32_t slots = 1;
    double primary_stall = 2.0;
    uint64_t delay_us = 0;
    uint64_t spin_us = 100;
    double split = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model folder")->required();
  app.add_option("--rowmap", o->rowmap, "Rowmap (tandem plan): the cold experts this peer serves")->required();
  app.add_option("--lane", o->lane, "Lane name (shared memory /tandem-NAME)")->required();
  app.add_option("--threads", o->threads, "CPU threads for expert compute (default: all)");
  app.add_option("--max-rows", o->max_rows, "Rows per request the segment holds (default 256)");
  app.add_option("--primary-stall", o->primary_stall,
                 "Seconds without a primary heartbeat after which the peer exits (default 2)");
  app.add_option("--spin-us", o->spin_us,
                 "Microseconds to keep polling the slots after the last request before napping on the doorbell "
                 "(default 100). A GPU primary cannot ring the doorbell: give such a peer a large value (a "
                 "dedicated core), e.g. 1000000000, or it answers after naps of up to 10 ms");
  app.add_option("--split-share", o->split,
                 "Serve the split lane: hold and compute only the last (1 - F) of each cold expert's intermediate "
                 "features; a primary started with `--lane split --split-share F` (the same F) reads the rest over PCIe. "
                 "0 (default): whole experts, for the peer lane");
  app.add_option("--delay-us", o->delay_us, "Testing aid: answer each request this many microseconds late");
  return [o] {
    set_global_threads(o->threads);
    ModelConfig cfg = load_config(o->model);
    TensorStore store = TensorStore::open_dir(o->model);
    Rowmap rm = Rowmap::load(o->rowmap);
    validate(rm, cfg, model_fingerprint(cfg, store), o->rowmap);
    auto model = Model::bind(cfg, store, o->model, [&](int64_t l, int64_t e) { return rm.is_cold(l, int32_t(e)); });
    const int64_t split_begin = o->split != 0 ? split_column(cfg.moe_intermediate_size, o->split) : 0;
    ColdExperts cold(*model, rm, global_pool(), split_begin);
    model.reset();  // nothing but the copied cold experts stays referenced
    spdlog::info("peer: {} cold experts in {} layers{}, {:.3f} GB held ({}), {} threads", cold.n_cold(),
                 cfg.n_moe_layers(),
                 split_begin ? fmt::format(" (features {}..{} of each: split lane)", split_begin, cfg.moe_intermediate_size)
                             : std::string(),
                 double(cold.bytes_held()) / 1e9, cold.bytes_held(), global_pool().size());
    peer::Geometry g;
    g.n_slots = o->slots;
    g.max_rows = o->max_rows;
    g.hidden = uint32_t(cfg.hidden_size);
    g.max_k = uint32_t(cfg.n_expert_used);
    peer::ServerOptions so;
    so.primary_stall_s = o->primary_stall;
    so.spin_us = o->spin_us;
    DelayedCompute delayed(cold, o->delay_us);
    peer::PeerCompute& compute = o->delay_us ? static_cast<peer::PeerCompute&>(delayed) : cold;
    auto server = peer::PeerServer::create(o->lane, lane_fingerprint(rm, split_begin), g, compute, so);
    peer::install_stop_signals(*server);
    spdlog::info("peer: lane {} serving (fingerprint {}, rowmap {})", o->lane, rm.rowmap_fingerprint, o->rowmap);
    peer::ServeEnd end = server->serve();
    spdlog::info("peer: lane {} ended: {} after {} requests", o->lane, peer::to_string(end), server->served());
    switch (end) {
      case peer::ServeEnd::kStopped:
      case peer::ServeEnd::kLaneStopped:
      case peer::ServeEnd::kPrimaryGone: return 0;
      case peer::ServeEnd::kTripped: return 1;
      case peer::ServeEnd::kRefused: return 2;
    }
    return 1;
  };
}

}  // namespace
TANDEM_COMMAND(peer, "peer", "Run the sidecar: serve a rowmap's cold experts over shared memory", setup);
}  // namespace tandem::cli
