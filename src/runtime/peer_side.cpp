// The peer's cold experts (see peer_side.h).
#include "runtime/peer_side.h"

#include <fmt/format.h>

#include "core/error.h"
#include "peer/cold_experts.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/gpu_cold_experts.h"
#endif

namespace tandem {

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

}  // namespace tandem
