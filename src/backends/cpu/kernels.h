// CPU compute kernels used by the forward pass (primary on the CPU, and the CPU peer).
// Activations are f32; weights are views of the checkpoint in F32, BF16 or F16, widened on the fly
// and accumulated in f32 (never rounded to bf16). Every kernel is pure: same inputs, same outputs; for
// a given SIMD path the results are bitwise identical for any thread count. SIMD paths differ from
// each other (and from the scalar reference) only by f32 rounding of a reordered sum.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// y[n, m] = x[n, k] · W[m, k]^T. W is row-major [m, k] (a Linear weight), dtype F32/BF16/F16.
// x rows are `x_stride` floats apart (default k), y rows `y_stride` apart (default m).
// Uses the pool's threads over m (and n for large n). y must not overlap x or W.
void matmul(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
            int64_t x_stride = -1, int64_t y_stride = -1);
// Same with accumulate: y += x · W^T.
void matmul_acc(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                int64_t x_stride = -1, int64_t y_stride = -1);

// out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i] for each of n rows of width d. In place allowed.
// weight: [d], F32/BF16/F16. The mean of squares is accumulated in f64.
void rms_norm(const float* x, int64_t n, int64_t d, const TensorView& weight, float eps, float* out);

// gate[i] = silu(gate[i]) * up[i], for `count` elements.
void silu_mul(float* gate, const float* up, int64_t count);

// x[i] = e^(x[i] - max x) / Σ_j e^(x[j] - max x) over n elements (n = 0: nothing).
void softmax_inplace(float* x, int64_t n);
// Σ a[i]·b[i] over n floats, f32 accumulation.
float dot_f32(const float* a, const float* b, int64_t n);
// y[i] += a·x[i] over n floats (fused multiply-add on the SIMD paths).
void axpy(float a, const float* x, float* y, int64_t n);

// Reads row `token` of an embedding table [vocab, d] (any float dtype) into out[d].
void embedding_row(const TensorView& table, int64_t token, float* out);

// The SIMD paths. The default is the best the CPU supports; TANDEM_SIMD=scalar|avx2|avx512 in the
// environment forces one (read at the first kernel call; an unknown name or a path the CPU lacks is
// an InputError then).
enum class SimdPath : uint8_t { kScalar, kAvx2, kAvx512 };

// avx512 needs AVX-512 F/BW/VL/DQ; avx2 needs AVX2, FMA and F16C; scalar always works.
bool simd_supported(SimdPath path);
// Parses "scalar", "avx2" or "avx512"; anything else fails, naming the accepted values.
SimdPath simd_path_from_name(std::string_view name);
std::string_view simd_path_name(SimdPath path);
// Switches every kernel to `path` (for tests and benchmarks; not while kernels run on other
// threads). Fails when the CPU lacks it.
void set_simd_path(SimdPath path);
SimdPath current_simd_path();
// Applies TANDEM_SIMD again (unset or empty: the best path); fails like the first kernel call would.
void reload_simd_path_from_env();
// The name of the SIMD path in use ("avx512", "avx2", "scalar").
const char* simd_path();

}  // namespace tandem::cpu
