// CPU compute kernels used by the forward pass (primary on the CPU, and the CPU peer).
// Activations are f32; weights are views of the checkpoint in F32, BF16 or F16, widened on the fly
// and accumulated in f32. Every kernel is pure: same inputs, same outputs, any thread count.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// y[n, m] = x[n, k] · W[m, k]^T. W is row-major [m, k] (a Linear weight), dtype F32/BF16/F16.
// x rows are `x_stride` floats apart (default k), y rows `y_stride` apart (default m).
// Uses the pool's threads over m (and n for large n).
void matmul(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
            int64_t x_stride = -1, int64_t y_stride = -1);
// Same with accumulate: y += x · W^T.
void matmul_acc(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                int64_t x_stride = -1, int64_t y_stride = -1);

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i] for each of n rows of width d. In place allowed.
void rms_norm(const float* x, int64_t n, int64_t d, const TensorView& weight, float eps, float* out);

// gate[i] = silu(gate[i]) * up[i], for `count` elements.
void silu_mul(float* gate, const float* up, int64_t count);

// Reads row `token` of an embedding table [vocab, d] (any float dtype) into out[d].
void embedding_row(const TensorView& table, int64_t token, float* out);

// The name of the SIMD path chosen at run time ("avx512bf16", "avx512", "avx2", "scalar").
const char* simd_path();

}  // namespace tandem::cpu
