// RMSNorm on the GPU, as the CPU reference computes it: the sum of squares in f64, scale
// 1/sqrt(mean + eps) rounded to f32, out = x · scale · weight. Weights are f32 (norm vectors are
// widened once at upload).
#pragma once

#include "backends/cuda/cuda_common.cuh"

namespace tandem::cuda {

// For each of n rows of width d: out[r] = rms_norm(x[rows ? rows[r] : r]) · w.
// x rows x_stride floats apart, out rows out_stride apart; in place (x == out, same stride) allowed.
// rows: [n] (device) or null. w: [d] f32 (device).
void launch_rms_norm(const float* x, int64_t x_stride, const int32_t* rows, int n, int d, const float* w,
                     float eps, float* out, int64_t out_stride, cudaStream_t stream);

}  // namespace tandem::cuda
