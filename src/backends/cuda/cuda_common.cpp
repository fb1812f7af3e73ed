// Failure reporting, allocation, dtype mapping and the per-thread PDL switch of the CUDA backend
// (see cuda_common.cuh and launch.cuh).
#include "backends/cuda/cuda_common.cuh"

#include "backends/cuda/launch.cuh"
#include "core/error.h"

namespace tandem::cuda {

namespace {
thread_local bool t_pdl = false;
}  // namespace

bool pdl_enabled() { return t_pdl; }
PdlScope::PdlScope(bool on) : prev_(t_pdl) { t_pdl = on; }
PdlScope::~PdlScope() { t_pdl = prev_; }

void* device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes < 16 ? 16 : bytes);
  if (err == cudaSuccess) return p;
  cudaGetLastError();  // reset the last error, so the next launch check does not report this one
  if (err != cudaErrorMemoryAllocation) cuda_check_failed("cudaMalloc", err, __FILE__, __LINE__);
  size_t free_b = 0, total = 0;
  int dev = -1;
  cudaGetDevice(&dev);
  cudaMemGetInfo(&free_b, &total);
  fail_out_of_memory("GPU out of memory: {} needs {} bytes ({:.2f} GiB) on cuda:{}; {:.2f} GiB of {:.2f} are free", what,
                     bytes, double(bytes) / (1 << 30), dev, double(free_b) / (1 << 30), double(total) / (1 << 30));
}

void* host_alloc(size_t bytes, unsigned flags, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes < 16 ? 16 : bytes, flags);
  if (err == cudaSuccess) return p;
  cudaGetLastError();
  if (err != cudaErrorMemoryAllocation) cuda_check_failed("cudaHostAlloc", err, __FILE__, __LINE__);
  fail_out_of_memory("out of pinned host memory: {} needs {} bytes ({:.2f} GiB); the host could not lock that much "
                     "(free host memory, the memlock limit)",
                     what, bytes, double(bytes) / (1 << 30));
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
