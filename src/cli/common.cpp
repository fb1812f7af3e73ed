// Shared model-running options (see common.h).
#include "cli/common.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "core/thread_pool.h"
#include "moe/experts.h"
#include "peer/client.h"
#include "placement/fingerprint.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem::cli {

void add_model_options(CLI::App& app, ModelOptions& o, ModelOptionSet set) {
  app.add_option("--model", o.model_dir, "Model folder (config.json + safetensors)")->required();
  app.add_option("--threads", o.threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--ctx", o.max_ctx, "Context limit per sequence (default: the model's max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
#ifdef TANDEM_HAVE_CUDA
  app.add_option("--device", o.device, "cpu (default), cuda or cuda:N");
#else
  app.add_option("--device", o.device, "cpu (this build has no CUDA backend: -DTANDEM_CUDA=ON adds cuda, cuda:N)");
#endif
  add_weights_option(app, o.weights);
  if (set == ModelOptionSet::kDevice) return;
  const std::string lane_group = "Lane (cold experts elsewhere; see docs/lanes.md)";
  const std::string cuda_group = "CUDA primary (--device cuda)";
  app.add_option("--lane", o.lane,
                 "Where the rowmap's cold experts run: local (every expert on the device, default), peer (a sidecar "
                 "process started with `tandem peer`), host (cuda: cold experts in pinned host memory, read "
                 "over PCIe by the GPU), split (cuda: the --split-share of each cold expert's features read over "
                 "PCIe, the rest computed by a `tandem peer --split-share F|auto`)")
      ->group(lane_group);
  app.add_option("--peer", o.peer, "Lane name of the peer (lanes peer and split)")->group(lane_group);
  app.add_option("--rowmap", o.rowmap, "Rowmap of the cold experts (lanes peer, host and split)")->group(lane_group);
  app.add_option("--peer-spin-limit", o.peer_spin_limit_us,
                 "Microseconds to spin on the peer's answer before blocking (no deadline; counted as an overrun)")
      ->group(lane_group);
  app.add_option("--peer-check", o.peer_check,
                 "Check gate: recompute every Nth handoff per layer here and compare (0 = off); a row below "
                 "--check-min trips the lane: the request fails, no further token")
      ->check(CLI::NonNegativeNumber)
      ->group(lane_group);
  app.add_option("--check-min", o.check_min, "Check gate bar: the lowest cosine a checked row may have (default 0.999)")
      ->check(CLI::Range(-1.0, 1.0))
      ->group(lane_group);
  app.add_option("--peer-wait", o.peer_wait_s,
                 "Seconds to wait for the lane's peer to appear and accept this primary (default 30)")
      ->check(CLI::NonNegativeNumber)
      ->group(lane_group);
  app.add_option("--split-share", o.split,
                 "Lane split: share of each cold expert's intermediate features the GPU reads over PCIe, or auto "
                 "(default): the cut the lane's `tandem peer --split-share F|auto` chose. A share given here must "
                 "be the peer's")
      ->group(cuda_group);
  app.add_option("--split-peer", o.split_peer, "Lane split: lane name of its peer when it differs from --peer")
      ->group(cuda_group);
  app.add_option("--host-wait", o.host_wait,
                 "cuda: how the host thread waits for each step: spin (lowest latency, holds a core), sleep (on a "
                 "blocking-sync event: woken a little later, and the core is free meanwhile, e.g. for a CPU peer "
                 "on this host) or auto (default: sleep on lanes peer and split, spin on local and host)")
      ->check(CLI::IsMember({"auto", "spin", "sleep"}))
      ->group(cuda_group);
}

void add_weights_option(CLI::App& app, std::string& weights) {
  app.add_option("--weights", weights,
                 "checkpoint (default: as stored) or fp8: routed experts stored in bf16/f16/f32 are quantized as "
                 "they load to FP8 e4m3 with 128x128 block scales (half the bytes of bf16; the model fingerprint "
                 "says so, so the peer, the primary and the rowmap must all use it)")
      ->check(CLI::IsMember({"checkpoint", "fp8"}));
}

namespace {
std::unique_ptr<Rowmap> load_rowmap(const ModelOptions& o, const Model& model) {
  if (o.rowmap.empty()) fail("--lane {} needs --rowmap R (tandem plan)", o.lane);
  auto rm = std::make_unique<Rowmap>(Rowmap::load(o.rowmap));
  validate(*rm, model.cfg, model_fingerprint(model.cfg, model.store), o.rowmap);
  return rm;
}
}  // namespace

std::optional<double> parse_split_share(const std::string& value) {
  if (value == "auto") return std::nullopt;
  double share = 0;
  size_t used = 0;
  try {
    share = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !(share > 0.0 && share < 1.0))
    fail("--split-share {}: give a share of each cold expert's features in (0, 1), or auto", value);
  return share;
}

int64_t resolve_split_column(const std::string& share, const std::string& lane, int64_t inter, double timeout_s) {
  if (const std::optional<double> f = parse_split_share(share)) return split_column(inter, *f);
  const peer::Geometry g = peer::peek_geometry(lane, timeout_s);
  if (g.split_column == 0)
    fail("lane {}: its peer computes whole cold experts (the peer lane); the split lane needs a `tandem peer "
         "--split-share F|auto`",
         lane);
  if (int64_t(g.split_column) >= inter)
    fail("lane {}: its peer cuts the experts at feature {}, but they have {} intermediate features", lane,
         g.split_column, inter);
  spdlog::info("split lane: the peer of lane {} cuts each cold expert at feature {} of {}: {:.2f} of it over PCIe",
               lane, g.split_column, inter, double(g.split_column) / double(inter));
  return int64_t(g.split_column);
}

std::optional<int> parse_device(const std::string& device) {
  if (device == "cpu") return std::nullopt;
#ifdef TANDEM_HAVE_CUDA
  const std::optional<int> gpu = parse_cuda_device(device);
  if (!gpu) fail("--device {}: unknown device (cpu, cuda, cuda:N)", device);
  const int n = cuda_device_count();
  if (*gpu >= n) fail("--device {}: no such device ({} CUDA device(s) found)", device, n);
  return gpu;
#else
  fail("--device {}: this build has no CUDA backend (cpu only)", device);
#endif
}

Runtime make_runtime(const ModelOptions& o, int64_t max_seqs) {
  [[maybe_unused]] const std::optional<int> gpu = parse_device(o.device);
  parse_split_share(o.split);  // a bad value is an error on every lane, not only where it is used
  // Lane names before the model: a typo must not cost a model load.
  if (!o.peer.empty()) peer::validate_lane_name(o.peer);
  if (!o.split_peer.empty()) peer::validate_lane_name(o.split_peer);
  set_global_threads(o.threads);
  Runtime rt;
  rt.lane = o.lane;
  ModelConfig cfg = load_config(o.model_dir);
  apply_weights_option(cfg, o.weights);
  rt.model = Model::bind(std::move(cfg), TensorStore::open_dir(o.model_dir), o.model_dir);
  const int64_t positions = rt.model->cfg.max_position_embeddings;
  if (o.max_ctx > 0 && positions > 0 && o.max_ctx > positions)
    spdlog::warn("--ctx {} exceeds the model's max_position_embeddings ({}): positions past {} were not trained and "
                 "answers may degrade there",
                 o.max_ctx, positions, positions);
  EngineOptions eo;
  eo.max_seqs = max_seqs;
  eo.max_ctx = o.max_ctx;
#ifdef TANDEM_HAVE_CUDA
  if (gpu) {
    CudaOptions co;
    co.device = *gpu;
    co.host_wait = host_wait_sleeps(o.host_wait, o.lane) ? CudaHostWait::kSleep : CudaHostWait::kSpin;
    if (o.lane == "host" || o.lane == "peer" || o.lane == "split") {
      const std::string name = o.lane == "split" && !o.split_peer.empty() ? o.split_peer : o.peer;
      if (o.lane != "host" && name.empty()) fail("--lane {} needs --peer NAME and --rowmap R", o.lane);
      if (o.lane == "host" && (!o.peer.empty() || o.peer_check)) fail("--peer and --peer-check need --lane peer");
      rt.rowmap = load_rowmap(o, *rt.model);
      co.lane = o.lane == "host" ? CudaLane::kHost : o.lane == "peer" ? CudaLane::kPeer : CudaLane::kSplit;
      co.cold.assign(size_t(rt.model->cfg.n_layer), {});
      for (const auto& layer : rt.rowmap->layers) co.cold[size_t(layer.layer)] = layer.cold;
      co.peer = name;
      co.peer_attach_timeout_s = o.peer_wait_s;
      if (o.lane == "split")
        co.split_begin =
            resolve_split_column(o.split, name, rt.model->cfg.moe_intermediate_size, co.peer_attach_timeout_s);
      rt.split_column = co.split_begin;
      co.peer_fingerprint = lane_fingerprint(*rt.rowmap, co.split_begin, cold_weights_fingerprint(*rt.model, *rt.rowmap));
      co.peer_spin_limit_us = o.peer_spin_limit_us;
      co.peer_check = o.peer_check;
      co.check_min = o.check_min;
    } else if (o.lane != "local") {
      fail("--lane {}: not a lane on cuda (supported: local, host, peer, split)", o.lane);
    } else if (!o.peer.empty() || o.peer_check) {
      fail("--peer and --peer-check need --lane peer");
    }
    rt.engine = make_cuda_engine(*rt.model, eo, co);
    return rt;
  }
#endif
  ExpertExecutor* experts = nullptr;
  if (o.lane == "peer") {
    if (o.peer.empty() || o.rowmap.empty()) fail("--lane peer needs --peer NAME and --rowmap R");
    rt.rowmap = load_rowmap(o, *rt.model);
    PeerLaneOptions po;
    po.lane = o.peer;
    po.spin_limit_us = o.peer_spin_limit_us;
    po.check_every = o.peer_check;
    po.check_min = o.check_min;
    po.attach_timeout_s = o.peer_wait_s;
    rt.peer = std::make_unique<PeerExperts>(*rt.model, *rt.rowmap, po, global_pool());
    experts = rt.peer.get();
  } else if (o.lane != "local") {
    fail("--lane {}: not a lane on the cpu (supported: local, peer; host and split need --device cuda)", o.lane);
  } else if (!o.peer.empty() || o.peer_check) {
    fail("--peer and --peer-check need --lane peer");
  }
  rt.engine = std::make_unique<CpuEngine>(*rt.model, eo, experts);
  return rt;
}

int64_t context_limit(const ModelOptions& o, const ModelConfig& cfg) {
  if (o.max_ctx > 0) return o.max_ctx;
  return cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096;
}

namespace {

std::string percentile(const peer::ClientStats& st, double q) {
  uint64_t target = uint64_t(std::ceil(q * double(st.handoffs))), seen = 0;
  for (size_t i = 0; i < st.wait_hist.size(); ++i) {
    seen += st.wait_hist[i];
    if (seen >= target && target > 0) return i == 0 ? std::string("<1 us") : fmt::format("<{} us", uint64_t(1) << i);
  }
  return std::string("-");
}

std::string summary(const std::string& lane, const peer::ClientStats& st, uint64_t rows_sent, uint64_t routed,
                    uint64_t cold, const std::vector<LayerCheck>& checks) {
  std::string s = fmt::format("lane {}: {} handoffs, {} rows sent, cold share {:.1f}% of routed slots, wait mean {:.1f} us, "
                              "p50 {}, p99 {}, max {:.1f} us, spin-limit overruns {}",
                              lane, st.handoffs, rows_sent, routed ? 100.0 * double(cold) / double(routed) : 0.0,
                              st.handoffs ? double(st.wait_ns_total) / double(st.handoffs) / 1e3 : 0.0,
                              percentile(st, 0.5), percentile(st, 0.99), double(st.wait_ns_max) / 1e3, st.overruns);
  std::string gate;
  for (size_t l = 0; l < checks.size(); ++l)
    if (checks[l].checks) gate += fmt::format(" L{}:{:.6f}({})", l, checks[l].min_cosine, checks[l].checks);
  if (!gate.empty()) s += "\ncheck gate min cosine per layer (rows):" + gate;
  return s;
}

}  // namespace

std::string Runtime::lane_summary() const {
  if (peer) return summary(lane, peer->stats(), peer->rows_sent(), peer->routed_slots(), peer->cold_slots(), peer->checks());
#ifdef TANDEM_HAVE_CUDA
  if (engine)
    if (auto st = cuda_peer_stats(*engine))
      return summary(lane, st->client, st->rows_sent, st->routed_slots, st->cold_slots, st->checks);
#endif
  return "";
}

const std::vector<LayerCheck>* Runtime::lane_checks() const {
  if (peer) return &peer->checks();
#ifdef TANDEM_HAVE_CUDA
  if (engine)
    if (auto st = cuda_peer_stats(*engine)) {
      gpu_checks_ = st->checks;
      return &gpu_checks_;
    }
#endif
  return nullptr;
}

}  // namespace tandem::cli
