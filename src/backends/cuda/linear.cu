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

// The RMSNorm fused in front of a projection (n ≤ kLinearNormRows ≤ the block's warps: a warp per
// row): scale[r] for each row as rms_norm_kernel computes it (sum of squares in f64), then this
// block's share of the normalised rows to norm_out. vec: x rows 16-byte aligned, K a multiple of 4
// (every load of a row in flight at once). Contains __syncthreads.
__device__ __forceinline__ void fused_norm(const LinearArgs& a, const float* xb, bool vec, float* scale) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (warp < a.n) {
    const float* xr = xb + int64_t(warp) * a.x_stride;
    double ss = 0.0;
    if (vec) {
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

// y[r, m] for the block's features, kSplit warps a feature: the warps of feature m take consecutive
// shares of K (whole steps of the dot's loop, so every share starts 16-byte aligned) and add their
// sums in share order through shared memory; at kSplit 1 a warp streams the whole row. kNorm
// (kNormGain: an RMSNorm in front) multiplies x by the gain only and takes the row's sum of squares
// from the same pass, scaling the dot at the end. Features past M re-read row M - 1 (their sums are
// dropped), so every warp reaches the block's barriers.
template <class T, int kRows, int kNorm, int kSplit>
__global__ void __launch_bounds__(kLinearWarps * kWarp) linear_kernel(LinearArgs a, bool vec) {
  constexpr int kFeatures = kLinearWarps / kSplit;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int part = warp % kSplit, m_want = blockIdx.x * kFeatures + warp / kSplit;
  const bool live = m_want < a.M;
  const int m = min(m_want, a.M - 1);
  const int b = blockIdx.y;
  const int step = vec ? kWarp * vec_of<T>() : kWarp;
  const int share = ((a.K + step - 1) / step + kSplit - 1) / kSplit * step;
  const int k0 = min(a.K, part * share), kn = min(a.K, k0 + share) - k0;
  const T* w[1] = {static_cast<const T*>(a.w) + b * a.w_bstride + int64_t(m) * a.w_ld + k0};
  // The one exception to "wait first" (launch.cuh): weights are never written during a step, so the
  // warp starts pulling its row into L2 while the predecessor still runs (only a hint; the kernel's
  // parameters are all it reads for that).
  if (live) prefetch_row_l2(w[0], kn);
  pdl_wait();
  pdl_launch_dependents();
  const float* xb = a.x + b * a.x_bstride;
  float* yb = a.y + b * a.y_bstride;
  __shared__ float scale[kLinearNormRows];
  __shared__ float part_dot[kSplit][kFeatures][kRows];
  __shared__ double part_ss[kSplit][kFeatures][kRows];
  const bool writer = live && part == 0 && lane == 0;
  for (int r0 = 0; r0 < a.n; r0 += kRows) {
    const int nr = min(kRows, a.n - r0);
    const float* x[kRows];
    float old[kRows] = {};  // the accumulation's targets, loaded with the weights rather than after them
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = r0 + min(r, nr - 1);
      x[r] = xb + int64_t(a.x_rows ? a.x_rows[row] : row) * a.x_stride + k0;
      if (a.accumulate && writer && r < nr) old[r] = yb[int64_t(r0 + r) * a.y_stride + m];
    }
    float acc[1][kRows] = {};
    double ss[kRows] = {};
    warp_dot_rows<T, 1, kRows, kNorm>(w, kn, x, nr, vec, acc, kNorm ? a.norm_w + k0 : nullptr, ss);
    float v[kRows];
    double q[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      v[r] = warp_sum(acc[0][r]);
      q[r] = kNorm == kNormGain ? warp_sum(ss[r]) : 0.0;
    }
    if constexpr (kSplit > 1) {
      const int f = warp / kSplit;
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < kRows; ++r) part_dot[part][f][r] = v[r], part_ss[part][f][r] = q[r];
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        v[r] = part_dot[0][f][r], q[r] = part_ss[0][f][r];
#pragma unroll
        for (int p = 1; p < kSplit; ++p) v[r] += part_dot[p][f][r], q[r] += part_ss[p][f][r];
      }
      __syncthreads();  // part_dot is the next pass's
    }
    if constexpr (kNorm == kNormGain) {
      // One pass (a fused norm has at most kLinearNormRows ≤ kRows rows): every warp saw the whole
      // rows, so every warp holds the same scales; warp 0 leaves them for norm_out.
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sc = float(1.0 / sqrt(q[r] / double(a.K) + double(a.norm_eps)));
        v[r] *= sc;
        if (warp == 0 && lane == 0 && r < nr) scale[r] = sc;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nr) break;
      if (writer) {
        float* dst = yb + int64_t(r0 + r) * a.y_stride + m;
        *dst = a.accumulate ? old[r] + v[r] : v[r];
      }
    }
  }
  if constexpr (kNorm == kNormGain) {
    if (a.norm_out) {
      __syncthreads();
      const int per = (a.K + gridDim.x - 1) / gridDim.x, i0 = blockIdx.x * per, i1 = min(a.K, i0 + per);
      for (int r = 0; r < a.n; ++r)
        for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x)
          a.norm_out[int64_t(r) * a.norm_out_stride + i] = xb[int64_t(r) * a.x_stride + i] * scale[r] * a.norm_w[i];
    }
  }
}

// ---- Tensor-core kernel (steps of many rows; linear.cuh) ----
constexpr int kMmaWarps = 8;      // a block's warps split K between them
constexpr int kMmaFeatures = 16;  // output features per block: the mma's M
constexpr int kMmaChunk = 32;     // K per warp step: two k16 mmas

// c += A · B, m16n8k16: A 16 features × 16 k (row-major fragment), B 16 k × 8 rows, f32 accumulation.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The pair (u, v) as three bf16 pairs whose sums are u and v exactly (each remainder of a rounding
// is exact in f32, and 3 × 8 significand bits cover f32's 24): t[0] the rounded values, t[1] the
// rounded remainders, t[2] the rest. Low half: u (the lower k).
__device__ __forceinline__ void split3(float u, float v, uint32_t (&t)[3]) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(u, v);
    t[i] = *reinterpret_cast<const uint32_t*>(&h);
    u -= __low2float(h);
    v -= __high2float(h);
  }
}

// y[r, m0 .. m0 + 16) for every row r, in tiles of 8 · NT rows. Lane (g = lane / 4, t = lane % 4)
// loads 8 consecutive k (16 bytes of weights of features m0 + g and m0 + g + 8, 32 bytes of row
// g of each tile) per 32-k chunk; the two mmas of the chunk take those 8 k as their logical k
// {2t, 2t + 1, 2t + 8, 2t + 9} (A and B alike, so each product pairs the same k). Warp w takes
// chunks w, w + 8, ...; the block adds the 8 warps' sums in warp order (deterministic) and writes.
template <int NT, bool kNorm>
__global__ void __launch_bounds__(kMmaWarps * kWarp) linear_mma_kernel(LinearArgs a) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.x * kMmaFeatures, b = blockIdx.y;
  const __nv_bfloat16* wb = static_cast<const __nv_bfloat16*>(a.w) + b * a.w_bstride;
  // Features past M re-read row M - 1 (their sums are dropped), so every load stays in bounds.
  const __nv_bfloat16* w_g = wb + int64_t(min(m0 + g, a.M - 1)) * a.w_ld;
  const __nv_bfloat16* w_g8 = wb + int64_t(min(m0 + g + 8, a.M - 1)) * a.w_ld;
  // As linear_kernel: weights are never written during a step, so L2 gets them before the wait.
#pragma unroll
  for (int i = 0; i < kMmaFeatures / kMmaWarps; ++i) {
    const int m = m0 + warp * (kMmaFeatures / kMmaWarps) + i;
    if (m < a.M) prefetch_row_l2(wb + int64_t(m) * a.w_ld, a.K);
  }
  pdl_wait();
  pdl_launch_dependents();
  const float* xb = a.x + b * a.x_bstride;
  float* yb = a.y + b * a.y_bstride;
  __shared__ float scale[kLinearNormRows];
  __shared__ float red[kMmaWarps][NT * 4][kWarp];
  if constexpr (kNorm) fused_norm(a, xb, true, scale);
  const int n_chunk = a.K / kMmaChunk;
  for (int r0 = 0; r0 < a.n; r0 += 8 * NT) {
    // Tile j's row g (rows past n re-read the last row; their sums are dropped).
    const float* xr[NT];
    float s[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = min(r0 + 8 * j + g, a.n - 1);
      xr[j] = xb + int64_t(a.x_rows ? a.x_rows[r] : r) * a.x_stride;
      s[j] = kNorm ? scale[r] : 1.0f;
    }
    const int tiles = min(NT, (a.n - r0 + 7) / 8);  // the same for the whole block
    float acc[NT][4] = {};
#pragma unroll 2
    for (int c = warp; c < n_chunk; c += kMmaWarps) {
      const int k = c * kMmaChunk + 8 * t;
      const uint4 wg = __ldg(reinterpret_cast<const uint4*>(w_g + k));
      const uint4 wg8 = __ldg(reinterpret_cast<const uint4*>(w_g8 + k));
      const uint32_t a0[4] = {wg.x, wg8.x, wg.y, wg8.y}, a1[4] = {wg.z, wg8.z, wg.w, wg8.w};
      float4 nw0 = make_float4(1.f, 1.f, 1.f, 1.f), nw1 = nw0;
      if constexpr (kNorm) {
        nw0 = reinterpret_cast<const float4*>(a.norm_w + k)[0];
        nw1 = reinterpret_cast<const float4*>(a.norm_w + k)[1];
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (j >= tiles) break;
        float4 x0 = reinterpret_cast<const float4*>(xr[j] + k)[0], x1 = reinterpret_cast<const float4*>(xr[j] + k)[1];
        if constexpr (kNorm) {  // linear_kernel's rounding: (x · scale) · w
          x0 = make_float4(x0.x * s[j] * nw0.x, x0.y * s[j] * nw0.y, x0.z * s[j] * nw0.z, x0.w * s[j] * nw0.w);
          x1 = make_float4(x1.x * s[j] * nw1.x, x1.y * s[j] * nw1.y, x1.z * s[j] * nw1.z, x1.w * s[j] * nw1.w);
        }
        uint32_t p[4][3];
        split3(x0.x, x0.y, p[0]);
        split3(x0.z, x0.w, p[1]);
        split3(x1.x, x1.y, p[2]);
        split3(x1.z, x1.w, p[3]);
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          mma_16816(acc[j], a0, p[0][i], p[1][i]);
          mma_16816(acc[j], a1, p[2][i], p[3][i]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][j * 4 + i][lane] = acc[j][i];
    __syncthreads();
    // Accumulator i of lane l, tile j: feature m0 + l / 4 (+ 8 for i ≥ 2), row r0 + 8j + 2 (l % 4) + i % 2.
    for (int o = threadIdx.x; o < tiles * 4 * kWarp; o += blockDim.x) {
      const int ji = o / kWarp, l = o % kWarp, j = ji / 4, i = ji % 4;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) v += red[w][ji][l];
      const int m = m0 + l / 4 + (i >= 2 ? 8 : 0), r = r0 + 8 * j + 2 * (l % 4) + (i & 1);
      if (m < a.M && r < a.n) {
        float* dst = yb + int64_t(r) * a.y_stride + m;
        *dst = a.accumulate ? *dst + v : v;
      }
    }
    __syncthreads();  // red is the next tile's
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
static_assert(kLinearNormRows <= kLinearWarps && kLinearNormRows <= kMmaWarps, "a warp per normalised row");

// Multiprocessors of the current device, asked once per device and thread (a device fact cached per
// thread, so no shared state; not a kernel choice).
int sm_count() {
  thread_local int known_dev = -1;
  thread_local int known_n = 0;
  int dev = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != known_dev) {
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&known_n, cudaDevAttrMultiProcessorCount, dev));
    known_dev = dev;
  }
  return known_n;
}

}  // namespace

bool linear_uses_mma(const LinearArgs& a, const KernelPolicy& p) {
  const int min_rows = p.linear_mma_min_rows;
  return min_rows > 0 && a.n >= min_rows && a.wt == WType::kBF16 && a.K % kMmaChunk == 0 && a.w_ld % 8 == 0 &&
         a.w_bstride % 8 == 0 && a.x_stride % 4 == 0 && a.x_bstride % 4 == 0 && aligned16(a.w) && aligned16(a.x);
}

int linear_row_split(const LinearArgs& a, const KernelPolicy& p) {
  if (a.n != 1 || linear_uses_mma(a, p)) return 1;
  const int fixed = p.linear_row_split;
  if (fixed > 0) return fixed;
  const int64_t want = p.linear_split_target * int64_t(sm_count());
  int s = 1;
  while (s < 4 && (int64_t(a.M) * s + kLinearWarps - 1) / kLinearWarps * a.batch < want) s *= 2;
  return s;
}

void launch_linear(const LinearArgs& a, const KernelPolicy& p, cudaStream_t stream) {
  if (a.n == 0 || a.M == 0) return;
  const int64_t V = 16 / int64_t(wtype_size(a.wt));
  const bool vec = a.K % V == 0 && a.w_ld % V == 0 && a.w_bstride % V == 0 && a.x_stride % 4 == 0 &&
                   a.x_bstride % 4 == 0 && aligned16(a.w) && aligned16(a.x);
  const bool norm = a.norm_w != nullptr;
  TANDEM_CUDA_REQUIRE(!norm || (a.n <= kLinearNormRows && !a.x_rows && a.batch == 1 && aligned16(a.norm_w)),
                      "fused norm: at most kLinearNormRows plain rows, one problem");
  if (linear_uses_mma(a, p)) {
    const dim3 mma_grid((a.M + kMmaFeatures - 1) / kMmaFeatures, a.batch);
    auto go = [&](auto kernel) { launch_kernel(kernel, mma_grid, kMmaWarps * kWarp, 0, stream, a); };
    if (a.n <= 8) norm ? go(linear_mma_kernel<1, true>) : go(linear_mma_kernel<1, false>);
    else if (a.n <= 16) go(linear_mma_kernel<2, false>);  // a fused norm has at most 8 rows
    else go(linear_mma_kernel<4, false>);
    return;
  }
  const int split = linear_row_split(a, p);
  const dim3 grid((a.M * split + kLinearWarps - 1) / kLinearWarps, a.batch);
  with_rows(a.n, [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    auto go = [&](auto kernel) { launch_kernel(kernel, grid, kLinearWarps * kWarp, 0, stream, a, vec); };
    auto pick = [&](auto tag, auto split_c) {
      using T = typename decltype(tag)::type;
      constexpr int S = decltype(split_c)::value;
      if (norm) go(linear_kernel<T, R, kNormGain, S>);
      else go(linear_kernel<T, R, kNormNone, S>);
    };
    with_wtype(a.wt, [&](auto tag) {
      if constexpr (R == 1) {  // more warps a feature only pay where a step has one row (linear.cuh)
        if (split == 4) return pick(tag, std::integral_constant<int, 4>{});
        if (split == 2) return pick(tag, std::integral_constant<int, 2>{});
      }
      pick(tag, std::integral_constant<int, 1>{});
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
