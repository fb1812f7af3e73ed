// Device-side building blocks shared by the kernels (included by .cu files only): 16-byte weight
// loads widened to f32, warp/block reductions, and the multi-row dot product every GEMV-like kernel
// (dense linear, experts, MLA expansion) is built on: one warp streams a weight row once and
// multiplies it with up to R activation rows held in f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"

namespace tandem::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// Weights per 16-byte load.
template <class T>
constexpr int vec_of() {
  return 16 / int(sizeof(T));
}

// 16 bytes of weights v (as loaded) widened to vec_of<T>() floats.
template <class T>
__device__ __forceinline__ void widen_w16(const uint4& v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      out[i] = __uint_as_float(w[i]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

// Loads 16 bytes of weights at p (16-byte aligned, read-only during the kernel) as vec_of<T>() floats.
template <class T>
__device__ __forceinline__ void load_w16(const T* p, float* out) {
  widen_w16<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

// An L2 eviction policy for cache-hinted loads (createpolicy, sm_80+): evict_first when `first` (weights
// streamed once: L2 keeps other lines over theirs), else evict_normal.
__device__ __forceinline__ uint64_t l2_policy(bool first) {
  uint64_t p;
  if (first)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// load_w16 with an L2 eviction policy (l2_policy).
template <class T>
__device__ __forceinline__ void load_w16_hint(const T* p, float* out, uint64_t policy) {
  uint4 v;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  widen_w16<T>(v, out);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024). `red` holds 32 values of shared
// memory. Every thread gets the result. Contains __syncthreads.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  V t = lane < nw ? red[lane] : V(0);
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

// Calls f(std::integral_constant<int, R>) with R, the activation rows per pass of a GEMV-like kernel,
// the smallest of 1, 2, 4, 8 that covers n rows (at least 8 for more): fewer rows per pass need
// fewer registers, so a small step's kernel keeps more warps and loads in flight. A row's sum runs in
// the same order whatever R is (bitwise the same results).
template <class F>
void with_rows(int n, F&& f) {
  if (n <= 1) f(std::integral_constant<int, 1>{});
  else if (n <= 2) f(std::integral_constant<int, 2>{});
  else if (n <= 4) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

// Calls f(TypeTag<T>{}) with T the element type of weights in dtype wt (float, __nv_bfloat16 or
// __half): the one place a launcher turns a WType into its kernel's template argument.
template <class T>
struct TypeTag {
  using type = T;
};
template <class F>
void with_wtype(WType wt, F&& f) {
  switch (wt) {
    case WType::kF32: f(TypeTag<float>{}); return;
    case WType::kBF16: f(TypeTag<__nv_bfloat16>{}); return;
    case WType::kF16: f(TypeTag<__half>{}); return;
  }
}

// acc[w][r] += Σ_k W_w[k] · x_r[k] for NW weight rows (sharing the activation loads) and nr ≤ R
// activation rows, partial per lane (reduce with warp_sum afterwards). `vec`: W rows and x rows are
// 16-byte aligned and K is a multiple of vec_of<T>() (then 16-byte loads; else a scalar loop).
// kNormGain (an RMSNorm in front, nw its weights, 16-byte aligned) multiplies each x_r by nw[k]
// only and adds x_r[k]² into ss[r] (f64, partial per lane), so that one pass over x yields both the
// dot and the row's sum of squares (the caller scales the dot afterwards). kHint: the 16-byte weight
// loads carry the L2 eviction policy `policy` (l2_policy).
enum : int { kNormNone = 0, kNormGain = 2 };  // 2: as kernel labels in bench/results name it
template <class T, int NW, int R, int kNorm = kNormNone, bool kHint = false>
__device__ __forceinline__ void warp_dot_rows(const T* const (&w)[NW], int K, const float* const (&x)[R], int nr,
                                              bool vec, float (&acc)[NW][R], const float* nw = nullptr,
                                              double* ss = nullptr, uint64_t policy = 0) {
  const int lane = threadIdx.x % kWarp;
  if (vec) {
    constexpr int V = vec_of<T>();
    // Few weight and activation rows: eight steps' loads in flight at once (a 2 K-element bf16 row
    // is eight steps: one round trip); more rows: four, to stay within the registers.
    constexpr int kUnroll = NW * R <= 2 ? 8 : 4;
#pragma unroll kUnroll
    for (int k = lane * V; k < K; k += kWarp * V) {
      float wf[NW][V];
#pragma unroll
      for (int i = 0; i < NW; ++i) {
        if constexpr (kHint)
          load_w16_hint<T>(w[i] + k, wf[i], policy);
        else
          load_w16<T>(w[i] + k, wf[i]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < nr) {
          const float4* xp = reinterpret_cast<const float4*>(x[r] + k);
#pragma unroll
          for (int q = 0; q < V / 4; ++q) {
            float4 xv = xp[q];
            if constexpr (kNorm == kNormGain) {
              const float4 g = reinterpret_cast<const float4*>(nw + k)[q];
              ss[r] += double(xv.x) * xv.x + double(xv.y) * xv.y + double(xv.z) * xv.z + double(xv.w) * xv.w;
              xv = make_float4(xv.x * g.x, xv.y * g.y, xv.z * g.z, xv.w * g.w);
            }
#pragma unroll
            for (int i = 0; i < NW; ++i)
              acc[i][r] += wf[i][4 * q] * xv.x + wf[i][4 * q + 1] * xv.y + wf[i][4 * q + 2] * xv.z +
                           wf[i][4 * q + 3] * xv.w;
          }
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += kWarp) {
      float wf[NW];
#pragma unroll
      for (int i = 0; i < NW; ++i) wf[i] = to_f32(w[i][k]);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < nr) {
          float xv = x[r][k];
          if constexpr (kNorm == kNormGain) {
            ss[r] += double(xv) * xv;
            xv = xv * nw[k];
          }
#pragma unroll
          for (int i = 0; i < NW; ++i) acc[i][r] += wf[i] * xv;
        }
    }
  }
}

// Part `part` of `parts` of pf (cuda_common.cuh): every range cut into kL2Chunk-byte chunks (its last
// one shorter), chunk g of the whole list going to part g % parts, each chunk one bulk prefetch into
// L2 (cp.async.bulk.prefetch.L2). Fire and forget: nothing waits for it; before sm_90 it does nothing.
// The prefetches queue on the issuing SM's copy engine, so a kernel should spread them over its
// blocks and issue them early in a block that runs on (a short kernel's few blocks asking for the
// next layer's weights held it up: bench/RESULTS.md, "Tried and dropped", "More L2 prefetches").
constexpr uint32_t kL2Chunk = 16 * 1024;
__device__ __forceinline__ void l2_prefetch_part(const L2Prefetch& pf, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  int g0 = 0;  // the whole list's index of the current range's first chunk
#pragma unroll 1
  for (int i = 0; i < pf.n; ++i) {
    const uint32_t bytes = pf.bytes[i] & ~15u;
    const int per = int((bytes + kL2Chunk - 1) / kL2Chunk);
    const char* base = static_cast<const char*>(pf.p[i]);
#pragma unroll 1
    for (int c = (part - g0 % parts + parts) % parts; c < per; c += parts) {
      const uint32_t off = uint32_t(c) * kL2Chunk, len = min(kL2Chunk, bytes - off);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(len) : "memory");
    }
    g0 += per;
  }
#endif
}

}  // namespace tandem::cuda
