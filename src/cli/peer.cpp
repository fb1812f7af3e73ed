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
#include "core/bandwidth.h"
#include "core/thread_pool.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/cold_experts.h"
#include "peer/server.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#include "backends/cuda/gpu_cold_experts.h"
#endif

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

// The cold experts as this peer holds them: where, how many, how many bytes.
struct Held {
  std::unique_ptr<peer::PeerCompute> compute;
  int64_t n_cold = 0;
  size_t bytes = 0;
  std::string where;
};

Held load_cold(const Model& model, const Rowmap& rm, std::optional<int> gpu, int64_t max_rows, int64_t split_begin) {
  Held h;
#ifdef TANDEM_HAVE_CUDA
  if (gpu) {
    auto g = std::make_unique<cuda::GpuColdExperts>(model, rm, *gpu, max_rows, split_begin);
    h.n_cold = g->n_cold();
    h.bytes = g->bytes_held();
    h.where = fmt::format("in the HBM of cuda:{}", *gpu);
    h.compute = std::move(g);
    return h;
  }
#endif
  TANDEM_ASSERT(!gpu, "a GPU device in a build without the CUDA backend");
  auto c = std::make_unique<ColdExperts>(model, rm, global_pool(), split_begin);
  h.n_cold = c->n_cold();
  h.bytes = c->bytes_held();
  const double huge = c->huge_page_share();
  h.where = fmt::format("in host memory{}, {} threads",
                        huge < 0 ? std::string() : fmt::format(" ({:.0f}% on huge pages)", 100.0 * huge),
                        global_pool().size());
  h.compute = std::move(c);
  return h;
}

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
  std::string split;  // "" or "0": whole experts
  double link_gbps = 0, dram_gbps = 0;
  std::string link_device = "cuda";
};

// The split lane's cut for --split-share (0: whole experts). auto measures what --link-gbps and
// --dram-gbps do not give, before any expert is loaded (the host is quiet then).
int64_t choose_split(const Opts& o, bool on_gpu, int64_t inter) {
  if (o.split.empty() || o.split == "0") return 0;
  std::optional<double> share = parse_split_share(o.split);
  if (!share) {
    if (on_gpu)
      fail("--split-share auto weighs the link against this host's DRAM; a peer on --device cuda takes --split-share F");
    double link = o.link_gbps, dram = o.dram_gbps;
    std::string link_from = "--link-gbps", dram_from = "--dram-gbps";
    if (link == 0) {
#ifdef TANDEM_HAVE_CUDA
      const std::optional<int> dev = parse_cuda_device(o.link_device);
      if (!dev) fail("--link-device {}: name the primary's GPU (cuda or cuda:N)", o.link_device);
      if (*dev >= cuda_device_count())
        fail("--split-share auto: no GPU {} (--link-device) to measure the link from ({} CUDA device(s) found); "
             "give --link-gbps G or --split-share F",
             o.link_device, cuda_device_count());
      link = cuda_host_read_bandwidth_gbps(*dev);
      cuda_release_device(*dev);  // a CPU peer: its context would hold GPU memory the primary may need
      link_from = fmt::format("measured: cuda:{} reading pinned host memory", *dev);
#else
      fail("--split-share auto measures the link from the primary's GPU and this build has no CUDA backend: give "
           "--link-gbps G or --split-share F");
#endif
    }
    if (dram == 0) {
      dram = dram_read_bandwidth_gbps(global_pool());
      dram_from = fmt::format("measured: {} threads", global_pool().size());
    }
    share = split_share_for(link, dram);
    spdlog::info("peer: split share auto: link {:.1f} GB/s ({}), DRAM {:.1f} GB/s ({}): {:.3f} of each cold expert "
                 "over the link",
                 link, link_from, dram, dram_from, *share);
  }
  return split_column(inter, *share);
}

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
  app.add_option("--split-share", o->split,
                 "Serve the split lane: hold and compute only the last (1 - F) of each cold expert's intermediate "
                 "features; a primary started with `--lane split` reads the first F over PCIe (it takes this cut; "
                 "see the header's split_column). auto: F = link / (link + DRAM) from the link's bandwidth (the "
                 "GPU of --link-device reading pinned host memory, or --link-gbps) and this host's DRAM "
                 "(measured with --threads, or --dram-gbps), where both parts take equally long: near the best at "
                 "one user; with many users a lower F can be faster (the GPU's part adds to its hot experts' time; "
                 "measure with `tandem bench`). 0 (default): whole experts, for the peer lane");
  app.add_option("--link-gbps", o->link_gbps,
                 "--split-share auto: the link's bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dram-gbps", o->dram_gbps,
                 "--split-share auto: this host's DRAM read bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--link-device", o->link_device,
                 "--split-share auto: the primary's GPU, whose reads of pinned host memory measure the link "
                 "(cuda or cuda:N; default cuda)");
  app.add_option("--delay-us", o->delay_us, "Testing aid: answer each request this many microseconds late");
  return [o, spin] {
    peer::validate_lane_name(o->lane);                        // before anything is loaded or created
    const std::optional<int> gpu = parse_device(o->device);
    if (gpu && spin->count() == 0) o->spin_us = 1'000'000'000;
    set_global_threads(gpu ? 1 : o->threads, int64_t(o->worker_spin_us));
    ModelConfig cfg = load_config(o->model);
    apply_weights_option(cfg, o->weights);
    TensorStore store = TensorStore::open_dir(o->model);
    Rowmap rm = Rowmap::load(o->rowmap);
    validate(rm, cfg, model_fingerprint(cfg, store), o->rowmap);
    auto model = Model::bind(cfg, store, o->model, [&](int64_t l, int64_t e) { return rm.is_cold(l, int32_t(e)); });
    const int64_t split_begin = choose_split(*o, gpu.has_value(), cfg.moe_intermediate_size);
    const uint64_t weights_fp = cold_weights_fingerprint(*model, rm);
    Held cold = load_cold(*model, rm, gpu, o->max_rows, split_begin);
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
#ifdef TANDEM_HAVE_CUDA
    // The GPU copies rows from and answers into the segment: page-locked, that is one DMA each way.
    // Declared after the server, so it is released before the segment is unmapped.
    std::optional<cuda::PinnedRange> pinned;
    if (gpu) pinned.emplace(&server->segment().header(), size_t(peer::segment_bytes(server->segment().geometry())));
#endif
    spdlog::info("peer: lane {} serving (rowmap {}, rowmap fingerprint {}, cold-expert weights {})", o->lane,
                 o->rowmap, rm.rowmap_fingerprint, peer::fp1_text(weights_fp));
    peer::ServeEnd end = server->serve();
    spdlog::info("peer: lane {} ended: {} after {} requests", o->lane, peer::to_string(end), server->served());
    switch (end) {
      case peer::ServeEnd::kStopped:
      case peer::ServeEnd::kLaneStopped:
      case peer::ServeEnd::kPrimaryGone: return 0;
      case peer::ServeEnd::kTripped: return 1;
      case peer::ServeEnd::kRefused: return 2;
      case peer::ServeEnd::kCorrupt:
      case peer::ServeEnd::kShrunk: return peer::kExitLaneDamaged;
    }
    return 1;
  };
}

}  // namespace
TANDEM_COMMAND(peer, "peer", "Run the sidecar: serve a rowmap's cold experts over shared memory", setup);
}  // namespace tandem::cli
