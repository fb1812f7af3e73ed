// Dense projections on the GPU: y[n, M] (+)= x[n, K] · W[M, K]ᵀ with W in its checkpoint dtype
// (f32/bf16/f16) and f32 activations and accumulation, plus the embedding gather. One warp per
// output feature streams its weight row once with 16-byte loads for all n rows (8 at a time), which
// is what decode needs (n = batch size, weights read once per step at HBM speed).
#pragma once

#include "backends/cuda/cuda_common.cuh"

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
void launch_linear(const LinearArgs& a, cudaStream_t stream);

// x[r, :] = embed[tokens[r], :] widened to f32. embed: [vocab, H] in `wt`; tokens: [n] (device).
void launch_embedding(const void* embed, WType wt, int H, const int32_t* tokens, int n, float* x,
                      cudaStream_t stream);

}  // namespace tandem::cuda
