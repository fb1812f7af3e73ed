// Dense projection and embedding kernels (see linear.cuh).
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/linear.cuh"

namespace tandem::cuda {

namespace {

constexpr int kLinearWarps = 8;

// Asks L2 for the K weights at row (one 128-byte line per lane and step), warp-wide.
template <class T>
__device__ __forceinline__ void prefetch_row_l2(const T* row, int K) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = int64_t(K) * int64_t(sizeof(T));
  for (int64_t off = int64_t(threadIdx.x % kWarp) * 128; off < bytes; off += kWarp * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

template <class T, int kRows, bool kNorm>
__global__ void __launch_bounds__(kLinearWarps * kWarp) linear_kernel(LinearArgs a, bool vec) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int m = blockIdx.x * kLinearWarps + warp;
  const int b = blockIdx.y;
  const T* w[1] = {static_cast<const T*>(a.w) + b * a.w_bstride + int64_t(m) * a.w_ld};
  // The one exception to "wait first" (launch.cuh): weights are never written during a step, so the
  // warp starts pulling its row into L2 while the predecessor still runs (only a hint; the kernel's
  // parameters are all it reads for that).
  if (m < a.M) prefetch_row_l2(w[0], a.K);
  pdl_wait();
  pdl_launch_dependents();
  const float* xb = a.x + b * a.x_bstride;
  float* yb = a.y + b * a.y_bstride;
  __shared__ float scale[kRows];
  if constexpr (kNorm) {
    // RMSNorm of the step's rows (n ≤ kRows ≤ kLinearWarps: a warp per row), as rms_norm_kernel
    // computes it (sum of squares in f64), then this block's share of the normalised rows to norm_out.
    if (warp < a.n) {
      const float* xr = xb + int64_t(warp) * a.x_stride;
      double ss = 0.0;
      if (vec) {  // x rows 16-byte aligned, K a multiple of 4: every load of the row in flight at once
        const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 16
        for (int i = lane; i < a.K / 4; i += kWarp) {
          const float4 v = x4[i];
          ss += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
        }
      } else {
        for (int i = lane; i < a.K; i += kWarp) ss += double(xr[i]) * xr[i];
      }
      ss = warp_sum(ss);
      if (lane == 0) scale[warp] = float(1.0 / sqrt(ss / double(a.K) + double(a.norm_eps)));
    }
    __syncthreads();
    if (a.norm_out) {
      const int per = (a.K + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per, i1 = min(a.K, i0 + per);
      for (int r = 0; r < a.n; ++r)
        for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x)
          a.norm_out[int64_t(r) * a.norm_out_stride + i] = xb[int64_t(r) * a.x_stride + i] * scale[r] * a.norm_w[i];
    }
  }
  if (m >= a.M) return;
  for (int r0 = 0; r0 < a.n; r0 += kRows) {
    const int nr = min(kRows, a.n - r0);
    const float* x[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = r0 + min(r, nr - 1);
      x[r] = xb + int64_t(a.x_rows ? a.x_rows[row] : row) * a.x_stride;
    }
    float acc[1][kRows] = {};
    warp_dot_rows<T, 1, kRows, kNorm>(w, a.K, x, nr, vec, acc, a.norm_w, scale);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nr) break;
      float v = warp_sum(acc[0][r]);
      if (lane == 0) {
        float* dst = yb + int64_t(r0 + r) * a.y_stride + m;
        *dst = a.accumulate ? *dst + v : v;
      }
    }
  }
}

template <class T>
__global__ void embedding_kernel(const T* embed, int H, const int32_t* tokens, float* x) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = blockIdx.x;
  const T* src = embed + int64_t(tokens[r]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[int64_t(r) * H + i] = to_f32(src[i]);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
static_assert(kLinearNormRows <= kLinearWarps, "a warp per normalised row");

}  // namespace

void launch_linear(const LinearArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.M == 0) return;
  const int64_t V = 16 / int64_t(wtype_size(a.wt));
  const bool vec = a.K % V == 0 && a.w_ld % V == 0 && a.w_bstride % V == 0 && a.x_stride % 4 == 0 &&
                   a.x_bstride % 4 == 0 && aligned16(a.w) && aligned16(a.x);
  dim3 grid((a.M + kLinearWarps - 1) / kLinearWarps, a.batch);
  const bool norm = a.norm_w != nullptr;
  TANDEM_CUDA_REQUIRE(!norm || (a.n <= kLinearNormRows && !a.x_rows && a.batch == 1 && aligned16(a.norm_w)),
                      "fused norm: at most kLinearNormRows plain rows, one problem");
  with_rows(a.n, [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    auto go = [&](auto kernel) { launch_kernel(kernel, grid, kLinearWarps * kWarp, 0, stream, a, vec); };
    with_wtype(a.wt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      norm ? go(linear_kernel<T, R, true>) : go(linear_kernel<T, R, false>);
    });
  });
}

void launch_embedding(const void* embed, WType wt, int H, const int32_t* tokens, int n, float* x,
                      cudaStream_t stream) {
  if (n == 0) return;
  with_wtype(wt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_kernel(embedding_kernel<T>, n, 256, 0, stream, static_cast<const T*>(embed), H, tokens, x);
  });
}

}  // namespace tandem::cuda
