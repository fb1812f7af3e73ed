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

// Element type of a weight matrix on the device: the checkpoint's own (no conversion, so f32
// checkpoints keep f32 accuracy and bf16 ones stream half the bytes).
enum class WType : int { kF32, kBF16, kF16 };

// The WType of a float checkpoint dtype; InputError naming `what` for any other dtype.
WType wtype_of(DType t, const char* what);
inline size_t wtype_size(WType t) { return t == WType::kF32 ? 4 : 2; }

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
