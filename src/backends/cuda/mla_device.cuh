// Device helpers shared by the MLA kernels (attention.cu's, mla_decode.cu's fused decode): the
// rotated query (and key) column, so every kernel rotates with the same operations.
// Included by .cu files only.
#pragma once

#include "backends/cuda/attention.cuh"
#include "backends/cuda/device_util.cuh"

namespace tandem::cuda {

// Rotated q_rope column rc (0 ≤ rc < rope) of one head's query src (its rope part) at position pos,
// in the cache's de-interleaved layout: first halves then second halves of the rotated pairs.
__device__ __forceinline__ float mla_rope_q(const float* src, int rc, int pos, const RopeTables& rope) {
  const int half = rope.dim / 2, j = rc < half ? rc : rc - half;
  const float x0 = rope.interleaved ? src[2 * j] : src[j];
  const float x1 = rope.interleaved ? src[2 * j + 1] : src[half + j];
  const float c = rope.cos[int64_t(pos) * half + j], s = rope.sin[int64_t(pos) * half + j];
  return rc < half ? x0 * c - x1 * s : x1 * c + x0 * s;
}

}  // namespace tandem::cuda
