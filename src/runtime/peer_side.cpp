// The peer's cold experts (see peer_side.h).
#include "runtime/peer_side.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "moe/peer_lane.h"
#include "peer/cold_experts.h"
#include "peer/protocol.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/gpu_cold_experts.h"
#endif

namespace tandem {
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

}  // namespace

ColdHolding load_cold(const Model& model, const Rowmap& rm, const Device& device, int64_t max_rows,
                      int64_t split_begin, ThreadPool& pool) {
  ColdHolding h;
  if (device.cuda) {
#ifdef TANDEM_HAVE_CUDA
    auto g = std::make_unique<cuda::GpuColdExperts>(model, rm, device.index, max_rows, split_begin);
    h.n_cold = g->n_cold();
    h.bytes = g->bytes_held();
    h.where = fmt::format("in the HBM of cuda:{}", device.index);
    h.compute = std::move(g);
    return h;
#else
    fail("--device {}: this build has no CUDA backend (cpu only)", device.name());
#endif
  }
  auto c = std::make_unique<ColdExperts>(model, rm, pool, split_begin);
  h.n_cold = c->n_cold();
  h.bytes = c->bytes_held();
  const double huge = c->huge_page_share();
  h.where = fmt::format("in host memory{}, {} threads",
                        huge < 0 ? std::string() : fmt::format(" ({:.0f}% on huge pages)", 100.0 * huge), pool.size());
  h.compute = std::move(c);
  return h;
}

std::shared_ptr<void> pin_for_device(const Device& device, void* base, size_t bytes) {
#ifdef TANDEM_HAVE_CUDA
  if (device.cuda)
    return std::shared_ptr<void>(new cuda::PinnedRange(base, bytes),
                                 [](void* p) { delete static_cast<cuda::PinnedRange*>(p); });
#endif
  return nullptr;
}

PeerSide open_peer_side(const PeerSideOptions& o) {
  peer::validate_lane_name(o.lane);  // before anything is loaded or created
  set_global_threads(o.device.cuda ? 1 : o.threads, o.worker_spin_us);
  ModelConfig cfg = load_config(o.model_dir);
  apply_weights_option(cfg, o.weights);
  TensorStore store = TensorStore::open_dir(o.model_dir);
  Rowmap rm = Rowmap::load(o.rowmap);
  validate(rm, cfg, model_fingerprint(cfg, store), o.rowmap);
  auto model = Model::bind(cfg, store, o.model_dir, [&](int64_t l, int64_t e) { return rm.is_cold(l, int32_t(e)); });
  PeerSide p;
  p.split_column = choose_peer_split(o.split, o.device.cuda, cfg.moe_intermediate_size, global_pool());
  p.weights_fp = cold_weights_fingerprint(*model, rm);
  p.rowmap_fingerprint = rm.rowmap_fingerprint;
  p.cold = load_cold(*model, rm, o.device, o.max_rows, p.split_column, global_pool());
  model.reset();  // nothing but the copied cold experts stays referenced
  spdlog::info("peer: {} cold experts in {} layers{}, {} held ({} bytes), {}", p.cold.n_cold, cfg.n_moe_layers(),
               p.split_column ? fmt::format(" (features {}..{} of each: split lane)", p.split_column,
                                            cfg.moe_intermediate_size)
                              : std::string(),
               format_bytes(p.cold.bytes), p.cold.bytes, p.cold.where);
  peer::Geometry g;
  g.n_slots = o.slots;
  g.max_rows = o.max_rows;
  g.hidden = uint32_t(cfg.hidden_size);
  g.max_k = uint32_t(cfg.n_expert_used);
  g.split_column = uint32_t(p.split_column);
  if (o.delay_us) p.delayed = std::make_unique<DelayedCompute>(*p.cold.compute, o.delay_us);
  peer::PeerCompute& compute = p.delayed ? *p.delayed : *p.cold.compute;
  p.server = peer::PeerServer::create(o.lane, lane_fingerprint(rm, p.split_column, p.weights_fp), g, compute, o.server,
                                      peer::fp1_value(rm.rowmap_fingerprint), p.weights_fp);
  p.pinned = pin_for_device(o.device, &p.server->segment().header(),
                            size_t(peer::segment_bytes(p.server->segment().geometry())));
  return p;
}

}  // namespace tandem
