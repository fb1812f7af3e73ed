// Helpers shared by the CUDA backend's kernels and host code: checked CUDA calls and the weight
// element types the kernels are templated on. Every CUDA call goes through TANDEM_CUDA_CHECK and every
// launch is followed by TANDEM_CUDA_LAUNCH_CHECK; a failure is a bug and aborts with file:line and
// CUDA's message. Kept free of fmt/spdlog so that nvcc only ever compiles kernels and launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cuda {

[[noreturn]] void cuda_check_failed(const char* expr, cudaError_t err, const char* file, int line);
[[noreturn]] void cuda_require_failed(const char* cond, const char* message, const char* file, int line);

// cudaMalloc / cudaHostAlloc (flags as cudaHostAlloc's) of at least 16 bytes for `what` (named in
// the error). Lack of memory throws OutOfMemoryError (core/error.h) naming what, how much and, for the
// device, what is free; any other failure is a bug (aborts like TANDEM_CUDA_CHECK).
void* device_alloc(size_t bytes, const char* what);
void* host_alloc(size_t bytes, unsigned flags, const char* what);

// Element type of a weight matrix on the device: the checkpoint's own (no conversion, so f32
// checkpoints keep f32 accuracy and bf16 ones stream half the bytes).
enum class WType : int { kF32, kBF16, kF16 };

// The WType of a float checkpoint dtype; InputError naming `what` for any other dtype.
WType wtype_of(DType t, const char* what);
inline size_t wtype_size(WType t) { return t == WType::kF32 ? 4 : 2; }

// Weights a kernel asks L2 to fetch for a later kernel of the step while HBM is idle (one-row steps
// are chains of short launches that leave it idle most of the time): up to kL2Ranges byte ranges,
// 16-byte aligned (a range's tail past its last whole 16 bytes is left out). A hint: it changes no
// result. l2_prefetch_part (device_util.cuh) issues a part of it as bulk prefetches (sm_90).
constexpr int kL2Ranges = 4;
struct L2Prefetch {
  const void* p[kL2Ranges] = {};
  uint32_t bytes[kL2Ranges] = {};
  int n = 0;
  // Adds a range; false (nothing added) when the list is full, the range empty, 4 GiB or more, or
  // not 16-byte aligned.
  bool add(const void* ptr, size_t size) {
    if (n == kL2Ranges || !ptr || size == 0 || size >= (size_t(1) << 32) || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return false;
    p[n] = ptr, bytes[n] = uint32_t(size), ++n;
    return true;
  }
};

}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(call)                                                               \
  do {                                                                                        \
    cudaError_t tandem_err_ = (call);                                                         \
    if (tandem_err_ != cudaSuccess)                                              \
      ::tandem::cuda::cuda_check_failed(#call, tandem_err_, __FILE__, __LINE__);              \
  } while (0)

#define TANDEM_CUDA_LAUNCH_CHECK() TANDEM_CUDA_CHECK(cudaGetLastError())

// A broken invariant in a launcher (a bug in the caller): aborts with file:line.
#define TANDEM_CUDA_REQUIRE(cond, message)                                                    \
  do {                                                                                        \
    if (!(cond))                                                                 \
      ::tandem::cuda::cuda_require_failed(#cond, message, __FILE__, __LINE__);                \
  } while (0)
