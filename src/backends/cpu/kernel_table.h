// Internal to the CPU backend: the table of kernels one SIMD path provides (a backend = a table of
// functions). kernels.cpp picks a table at run time and does the threading; the tables do the math.
// Within one path every output element is computed by the same sequence of operations whatever the
// tiling, the block bounds or the thread count, so results are bitwise identical across threads.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::cpu {

// One matmul call: y[n, m] (+)= x[n, k] · W[m, k]^T with explicit strides (in elements).
struct MatmulArgs {
  const float* x = nullptr;  // [n, x_stride]
  int64_t x_stride = 0;
  const void* w = nullptr;  // [m, k] in `w_dtype`
  DType w_dtype = DType::kF32;
  BlockScales w_scale;      // F8_E4M3: the block scales of W's rows (row j of W uses w_scale.at(j, ·))
  int64_t k = 0;
  float* y = nullptr;  // [n, y_stride]
  int64_t y_stride = 0;
  bool accumulate = false;
};

// The SIMD paths take F8_E4M3 weights whose scale blocks are this many columns wide (a multiple of
// either path's vector width, so a vector never straddles two blocks); kernels.cpp sends other block
// widths to the scalar table.
inline constexpr int64_t kSimdFp8BlockMultiple = 16;

struct KernelTable {
  const char* name;
  // Rows [n0, n1) × outputs [m0, m1) of a matmul, on the calling thread.
  void (*matmul_block)(const MatmulArgs& a, int64_t n0, int64_t n1, int64_t m0, int64_t m1);
  // x, out: [n, d]; w: [d] in w_dtype (F32/BF16/F16).
  void (*rms_norm)(const float* x, int64_t n, int64_t d, const void* w, DType w_dtype, float eps, float* out);
  void (*silu_mul)(float* gate, const float* up, int64_t count);
  void (*softmax)(float* x, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  void (*exp)(const float* x, float* out, int64_t n);  // out[i] = e^x[i]; in place allowed
};

const KernelTable& scalar_kernel_table();
// Only call these when the CPU supports the path (simd_supported in kernels.h).
const KernelTable& avx2_kernel_table();
const KernelTable& avx512_kernel_table();

}  // namespace tandem::cpu
