// Dense projections on the GPU: y[n, M] (+)= x[n, K] · W[M, K]ᵀ with W in its checkpoint dtype
// (f32/bf16/f16) and f32 activations and accumulation, plus the embedding gather. Two kernels:
// - a step of few rows: one warp per output feature streams its weight row once with 16-byte loads
//   and multiplies it with every row on the CUDA cores (8 rows a pass);
// - a step of many rows (KernelPolicy::linear_mma_min_rows, bf16 weights): the tensor cores
//   (mma.sync m16n8k16, f32 accumulation), each f32 activation split into three bf16 terms whose sum
//   is the f32 value (24 significand bits), so the products are those of f32 activations; a block
//   takes 16 features and
//   all rows in tiles of 32, its 8 warps splitting K and adding their partial sums in warp order.
//   The CUDA-core kernel spends its time loading activations (8 floats per 8 weights and row), so
//   at 8 to 32 rows it runs far below HBM speed; the tensor cores take 16 × 8 × 16 products per
//   instruction from registers.
#pragma once

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernel_policy.h"

namespace tandem::cuda {

struct LinearArgs {
  const float* x = nullptr;      // [n, K] rows x_stride floats apart (or gathered through x_rows)
  int64_t x_stride = 0;
  const int32_t* x_rows = nullptr;  // [n] row indices into x (device), or null: rows 0..n-1
  int n = 0;
  const void* w = nullptr;       // [M, K] rows w_ld elements apart
  WType wt = WType::kF32;
  int M = 0, K = 0;
  int64_t w_ld = 0;
  float* y = nullptr;            // [n, M] rows y_stride floats apart
  int64_t y_stride = 0;
  bool accumulate = false;       // y += instead of y =
  // Independent problems along blockIdx.y (e.g. per attention head): offsets per batch index.
  int batch = 1;
  int64_t x_bstride = 0, w_bstride = 0, y_bstride = 0;  // floats, elements, floats
  // RMSNorm fused in front (steps of at most kLinearNormRows rows, plain rows, batch 1): x is
  // normalised on the fly with weights norm_w [K] (f32, 16-byte aligned) by launch_rms_norm's formula
  // (its f64 sum of squares added in another order); norm_out (optional, rows norm_out_stride apart)
  // receives the normalised rows, each block writing its share. Saves the norm's launch.
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  float* norm_out = nullptr;
  int64_t norm_out_stride = 0;
};
constexpr int kLinearNormRows = 8;
// Which kernel runs `a`, and how, is the policy's (KernelPolicy: linear_mma_min_rows,
// linear_row_split, linear_split_target); a captured graph keeps what it was captured with.
void launch_linear(const LinearArgs& a, const KernelPolicy& p, cudaStream_t stream);
// Whether launch_linear runs `a` on the tensor-core kernel under `p`: at least p.linear_mma_min_rows
// rows (0: never), bf16 weights, K and the strides multiples of 32 / 8 / 4 elements, 16-byte aligned
// rows.
bool linear_uses_mma(const LinearArgs& a, const KernelPolicy& p);
// Warps per output feature launch_linear gives `a` on the CUDA-core kernel (1 on the tensor cores or
// past one row): p.linear_row_split, or where that is 0 the fewest of 1, 2, 4 that give the launch at
// least p.linear_split_target blocks a multiprocessor. More warps a feature put more of a short row's
// loads in flight at once; their sums are added in share order.
int linear_row_split(const LinearArgs& a, const KernelPolicy& p);

// x[r, :] = embed[tokens[r], :] widened to f32. embed: [vocab, H] in `wt`; tokens: [n] (device).
void launch_embedding(const void* embed, WType wt, int H, const int32_t* tokens, int n, float* x,
                      cudaStream_t stream);

}  // namespace tandem::cuda
