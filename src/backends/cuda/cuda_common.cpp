// Failure reporting, dtype mapping and the per-thread PDL switch of the CUDA backend
// (see cuda_common.cuh and launch.cuh).
#include "backends/cuda/cuda_common.cuh"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/launch.cuh"
#include "core/error.h"

namespace tandem::cuda {

namespace {
thread_local bool t_pdl = false;
}  // namespace

bool pdl_enabled() { return t_pdl; }
PdlScope::PdlScope(bool on) : prev_(t_pdl) { t_pdl = on; }
PdlScope::~PdlScope() { t_pdl = prev_; }

namespace {
std::atomic<int> g_carveout{-1};
std::atomic<bool> g_carveout_touched{false};  // a kernel's attribute was ever set: -1 must be put back
std::mutex g_carveout_mu;
std::unordered_map<const void*, int>& carveout_applied() {
  static std::unordered_map<const void*, int> applied;  // kernel -> the value last set (absent: -1)
  return applied;
}
}  // namespace

void set_smem_carveout(int percent) {
  TANDEM_CUDA_REQUIRE(percent >= -1 && percent <= 100, "shared-memory carveout: not -1 (default) or 0 to 100 percent");
  g_carveout = percent;
}
int smem_carveout() { return g_carveout.load(); }

void apply_smem_carveout(const void* kernel) {
  const int want = g_carveout.load();
  if (want == -1 && !g_carveout_touched.load()) return;  // the default: no lock, no lookup per launch
  const std::lock_guard<std::mutex> lock(g_carveout_mu);
  auto& applied = carveout_applied();
  const auto it = applied.find(kernel);
  if ((it == applied.end() ? -1 : it->second) == want) return;
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, want));
  applied[kernel] = want;
  g_carveout_touched = true;
}

void cuda_check_failed(const char* expr, cudaError_t err, const char* file, int line) {
  detail::assert_fail(file, line, expr, fmt::format("CUDA error {}: {}", int(err), cudaGetErrorString(err)));
}

void cuda_require_failed(const char* cond, const char* message, const char* file, int line) {
  detail::assert_fail(file, line, cond, message);
}

WType wtype_of(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return WType::kF32;
    case DType::kBF16: return WType::kBF16;
    case DType::kF16: return WType::kF16;
    case DType::kF8E4M3:
      fail("{}: FP8 (F8_E4M3) weights are not supported on the GPU yet (issue 31): the CUDA engine, the GPU "
           "peer and the host and split lanes refuse them; run this model on the CPU (--device cpu, the local "
           "or the CPU peer lane)",
           what);
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32: case DType::kI64:
    case DType::kBool:
      break;
  }
  fail("{}: dtype {} is not a supported weight type on the GPU (F32, BF16, F16)", what, dtype_name(t));
}

}  // namespace tandem::cuda
