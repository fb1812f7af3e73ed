// `tandem peer`: the sidecar process. Loads only the cold experts of a rowmap into host memory (the
// CPU computes them) or one GPU's HBM (`--device cuda[:N]`: the CUDA backend's expert kernels), creates
// the lane's shared-memory segment (owner-only) once they are in place, logs `serving`, and computes
// requests until the lane stops, trips, the primary goes away, or SIGTERM/SIGINT. Exit: 0 normal stop,
// 1 tripped, 2 bad input/refused (a bad --device among them: then no segment is created), 4 the segment
// was damaged under the lane (corrupt header or truncated file; the lane is tripped with that cause).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "moe/peer_lane.h"
#include "peer/server.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"
#include "runtime/exit_codes.h"
#include "runtime/lane.h"
#include "runtime/peer_side.h"
#include "runtime/split.h"

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

// What `tandem peer` was asked (its flags).
struct Opts {
  std::string model, rowmap, lane, device = "cpu", weights = "checkpoint";
  int threads = 0;
  uint32_t max_rows = 256;
  uint32_t slots = 1;
  double primary_stall = 2.0;
  uint64_t delay_us = 0;
  uint64_t spin_us = 100;
  int64_t worker_spin_us = ThreadPool::kDefaultSpinUs;
  PeerSplitOptions split;  // --split-share, --link-gbps, --dram-gbps, --link-device
};

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model folder")->required();
  add_weights_option(app, o->weights);
  app.add_option("--rowmap", o->rowmap, "Rowmap (tandem plan): the cold experts this peer serves")->required();
  app.add_option("--lane", o->lane, "Lane name (shared memory /tandem-NAME)")->required();
  app.add_option("--device", o->device,
                 "Where the cold experts live and run: cpu (default: host memory, the CPU's cores), cuda or cuda:N "
                 "(that GPU's HBM, the CUDA backend's expert kernels; needs a build with the CUDA backend)");
  app.add_option("--threads", o->threads, "CPU threads for expert compute (default: all; unused with --device cuda)");
  app.add_option("--max-rows", o->max_rows, "Rows per request the segment holds (default 256)");
  app.add_option("--primary-stall", o->primary_stall,
                 "Seconds without a primary heartbeat after which the peer exits (default 2)");
  CLI::Option* spin = app.add_option(
      "--spin-us", o->spin_us,
      "Microseconds to keep polling the slots after the last request before napping on the doorbell "
      "(default 100; with --device cuda 1000000000, i.e. always polling on one core). A GPU primary rings the "
      "doorbell once per step, not per request: give such a peer more than the gaps between the requests of one "
      "step, e.g. 50000 (or 1000000000: a dedicated core); with less, its first requests wait for naps of up to "
      "10 ms, after which the peer polls 50000 on its own");
  app.add_option("--worker-spin-us", o->worker_spin_us,
                 "Microseconds a compute thread keeps polling for the next pass before it sleeps (default 200). "
                 "Waking sleeping threads costs tens of microseconds (more on a VM); when the gaps between "
                 "passes are longer than this (a GPU primary, many rows: ~1 ms), a larger value keeps the "
                 "--threads cores busy while the lane is active and lets them sleep only after this long idle")
      ->check(CLI::Range(int64_t(0), int64_t(10'000'000)));
  app.add_option("--split-share", o->split.share,
                 "Serve the split lane: hold and compute only the last (1 - F) of each cold expert's intermediate "
                 "features; a primary started with `--lane split` reads the first F over PCIe (it takes this cut; "
                 "see the header's split_column). auto: F = link / (link + DRAM) from the link's bandwidth (the "
                 "GPU of --link-device reading pinned host memory, or --link-gbps) and this host's DRAM "
                 "(measured with --threads, or --dram-gbps), where both parts take equally long: near the best at "
                 "one user; with many users a lower F can be faster (the GPU's part adds to its hot experts' time; "
                 "measure with `tandem bench`). 0 (default): whole experts, for the peer lane");
  app.add_option("--link-gbps", o->split.link_gbps,
                 "--split-share auto: the link's bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dram-gbps", o->split.dram_gbps,
                 "--split-share auto: this host's DRAM read bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--link-device", o->split.link_device,
                 "--split-share auto: the primary's GPU, whose reads of pinned host memory measure the link "
                 "(cuda or cuda:N; default cuda)");
  app.add_option("--delay-us", o->delay_us, "Testing aid: answer each request this many microseconds late");
  return [o, spin] {
    peer::validate_lane_name(o->lane);                        // before anything is loaded or created
    const Device device = parse_device(o->device);
    if (device.cuda && spin->count() == 0) o->spin_us = 1'000'000'000;
    set_global_threads(device.cuda ? 1 : o->threads, int64_t(o->worker_spin_us));
    ModelConfig cfg = load_config(o->model);
    apply_weights_option(cfg, o->weights);
    TensorStore store = TensorStore::open_dir(o->model);
    Rowmap rm = Rowmap::load(o->rowmap);
    validate(rm, cfg, model_fingerprint(cfg, store), o->rowmap);
    auto model = Model::bind(cfg, store, o->model, [&](int64_t l, int64_t e) { return rm.is_cold(l, int32_t(e)); });
    const int64_t split_begin = choose_peer_split(o->split, device.cuda, cfg.moe_intermediate_size, global_pool());
    const uint64_t weights_fp = cold_weights_fingerprint(*model, rm);
    ColdHolding cold = load_cold(*model, rm, device, o->max_rows, split_begin, global_pool());
    model.reset();  // nothing but the copied cold experts stays referenced
    spdlog::info("peer: {} cold experts in {} layers{}, {} held ({} bytes), {}", cold.n_cold, cfg.n_moe_layers(),
                 split_begin ? fmt::format(" (features {}..{} of each: split lane)", split_begin, cfg.moe_intermediate_size)
                             : std::string(),
                 format_bytes(cold.bytes), cold.bytes, cold.where);
    peer::Geometry g;
    g.n_slots = o->slots;
    g.max_rows = o->max_rows;
    g.hidden = uint32_t(cfg.hidden_size);
    g.max_k = uint32_t(cfg.n_expert_used);
    g.split_column = uint32_t(split_begin);
    peer::ServerOptions so;
    so.primary_stall_s = o->primary_stall;
    so.spin_us = o->spin_us;
    DelayedCompute delayed(*cold.compute, o->delay_us);
    peer::PeerCompute& compute = o->delay_us ? static_cast<peer::PeerCompute&>(delayed) : *cold.compute;
    auto server = peer::PeerServer::create(o->lane, lane_fingerprint(rm, split_begin, weights_fp), g, compute, so,
                                           peer::fp1_value(rm.rowmap_fingerprint), weights_fp);
    peer::install_stop_signals(*server);
    // A GPU copies rows from and answers into the segment: page-locked, that is one DMA each way.
    // Declared after the server, so it is released before the segment is unmapped.
    const std::shared_ptr<void> pinned =
        pin_for_device(device, &server->segment().header(), size_t(peer::segment_bytes(server->segment().geometry())));
    spdlog::info("peer: lane {} serving (rowmap {}, rowmap fingerprint {}, cold-expert weights {})", o->lane,
                 o->rowmap, rm.rowmap_fingerprint, peer::fp1_text(weights_fp));
    peer::ServeEnd end = server->serve();
    spdlog::info("peer: lane {} ended: {} after {} requests", o->lane, peer::to_string(end), server->served());
    return exit_code(end);
  };
}

}  // namespace
TANDEM_COMMAND(peer, "peer", "Run the sidecar: serve a rowmap's cold experts over shared memory", setup);
}  // namespace tandem::cli
