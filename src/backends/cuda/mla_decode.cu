// The fused MLA decode step (see mla_decode.cuh): one cluster of C blocks per (row, head) (mla_cluster()).
// Block c of a cluster owns share c of each stage's outputs (q's columns, q_lat's columns, the
// context's positions, the head's output columns); after each stage the cluster barrier publishes the
// shares and every block reads the others' from their shared memory (distributed shared memory).
#include <cooperative_groups.h>

#include <utility>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/linear.cuh"
#include "backends/cuda/mla_decode.cuh"
#include "backends/cuda/mla_device.cuh"

namespace tandem::cuda {

namespace cg = cooperative_groups;

namespace {

constexpr int kDecWarps = 8;
constexpr int kDecThreads = kDecWarps * kWarp;

// Floats rounded up to whole 16-byte vectors (every shared array starts 16-byte aligned).
__host__ __device__ constexpr int pad4(int n) { return (n + 3) / 4 * 4; }

// Shared memory of one block. Weights (in T, 16-byte aligned, copied in before the launch's wait):
// wq [ceil(QK / C), q_width] this block's rows of q_b | wk [ceil(kv_lora / C), nope] of W_uk
// transposed | wv [ceil(v_dim / C), kv_lora] of W_uv (C the blocks of a cluster). Then floats: xq [q_width] q_a
// normalised | qh [nope + rope] the head's q | qv [kv_lora + rope] q_lat, then the rotated q_rope | fr
// [kv_lora + rope] the row's new cache entry | wp [kDecWarps][kv_lora + 4] each warp's sums, max, sum |
// bp [kv_lora + 4] the block's | ol [kv_lora]. Offsets in bytes.
struct DecodeSmem {
  int wq, wk, wv, xq, qh, qv, fr, wp, wp_stride, bp, ol, total;
  __host__ __device__ DecodeSmem(const MlaArgs& a, int w_size, int per) {
    const int W = a.kv_lora + a.rope;
    const auto rows = [per](int n) { return (n + per - 1) / per; };
    const auto bytes16 = [](int64_t b) { return int((b + 15) / 16 * 16); };
    wq = 0;
    wk = wq + bytes16(int64_t(rows(a.nope + a.rope)) * a.q_width * w_size);
    wv = wk + bytes16(int64_t(rows(a.kv_lora)) * a.nope * w_size);
    xq = wv + bytes16(int64_t(rows(a.v_dim)) * a.kv_lora * w_size);
    qh = xq + 4 * pad4(a.q_width);
    qv = qh + 4 * pad4(a.nope + a.rope);
    fr = qv + 4 * pad4(W);
    wp = fr + 4 * pad4(W);
    wp_stride = pad4(a.kv_lora) + 4;  // floats
    bp = wp + 4 * kDecWarps * wp_stride;
    ol = bp + 4 * wp_stride;
    total = ol + 4 * pad4(a.kv_lora);
  }
};

// Block c's share [b, e) of n outputs among C blocks (consecutive shares of ceil(n / C); the last ones
// may be empty).
struct Share {
  int b, e;
};
template <int C>
__device__ __forceinline__ int share_size(int n) {
  return (n + C - 1) / C;
}
template <int C>
__device__ __forceinline__ Share share_of(int n, int c) {
  const int b = min(n, c * share_size<C>(n));
  return {b, min(n, b + share_size<C>(n))};
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Bulk copies through the copy engine (sm_90): one thread issues bytes [src, src + bytes) into shared
// memory at dst (both 16-byte aligned, bytes a multiple of 16), completing on the shared-memory
// barrier bar, which it initialised for this one use; every thread waits on bar before reading dst.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  if (bytes > 0)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void bulk_wait(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar))
      : "memory");
}

// y[j] = w[j, 0 .. K) · x for j < rows: w [rows, K] in T and x [K] floats, both in shared memory and
// 16-byte aligned, K a multiple of vec_of<T>(). g lanes a row (a power of two ≤ 32: at least four
// 16-byte chunks each where the row has them) take its chunks in turn; their sums meet by shuffles.
// Block-wide (every thread, uniform trip counts). Not inlined: one copy of the loop serves the three
// projections (the kernel's code is fetched cold at every launch; its size costs time).
template <class T>
__device__ __noinline__ void smem_gemv(const T* w, int K, int rows, const float* x, float* y) {
  constexpr int V = vec_of<T>();
  const int chunks = K / V;
  int g = 1;
  while (g < kWarp && g * 8 <= chunks) g *= 2;
  const int per_pass = kDecThreads / g, sub = int(threadIdx.x) % g;
  const int passes = (rows + per_pass - 1) / per_pass;
#pragma unroll 1
  for (int p = 0; p < passes; ++p) {
    const int j = p * per_pass + int(threadIdx.x) / g;
    const T* wr = w + int64_t(min(j, rows - 1)) * K;
    float acc = 0.0f;
#pragma unroll 2
    for (int ch = sub; ch < chunks; ch += g) {
      float wf[V];
      widen_w16<T>(*reinterpret_cast<const uint4*>(wr + ch * V), wf);
      const float4* xp = reinterpret_cast<const float4*>(x + ch * V);
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 xv = xp[q];
        acc += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
      }
    }
    for (int o = g / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (sub == 0 && j < rows) y[j] = acc;
  }
}

// Fills dst[i] for i in [0, n) outside this block's share from the owners' copies (share_of<C>(n, ·)).
template <int C>
__device__ __forceinline__ void gather_shares(cg::cluster_group& cluster, float* dst, int n, int c) {
  const int per = share_size<C>(n);
  for (int i = threadIdx.x; i < n; i += kDecThreads) {
    const int owner = i / per;
    if (owner != c) dst[i] = *cluster.map_shared_rank(dst + i, owner);
  }
}

// Row r's new cache entry at its position pos into fr [(kv_lora + rope) / 2] (shared memory) and,
// when not null, cache_row: the latent's RMSNorm (sum of squares in f64) from the input projection's
// output (a.fused, not normalised in place) and the rotated key, as mla_prep computes them.
// Block-wide (every thread, kDecThreads of them), so that every load of the entry is in flight at
// once: the entry sits on the step's critical path.
__device__ __forceinline__ void fresh_row_block(const MlaArgs& a, int r, int pos, const RopeTables& rope, float2* fr,
                                                float2* cache_row, double* red) {
  const int L = a.kv_lora, W2 = (a.kv_lora + a.rope) / 2;
  const float* src = a.fused + int64_t(r) * a.stride + a.q_width;
  constexpr int kPairs = (kMlaMaxWidth / 2 + kDecThreads - 1) / kDecThreads;  // latent pairs a thread at most
  float2 x[kPairs] = {}, g[kPairs] = {};
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = int(threadIdx.x) + kDecThreads * i;
    if (2 * j < L) {
      x[i] = *reinterpret_cast<const float2*>(src + 2 * j);
      g[i] = *reinterpret_cast<const float2*>(a.kv_a_norm + 2 * j);
      ss += double(x[i].x) * x[i].x + double(x[i].y) * x[i].y;
    }
  }
  float2 kr = make_float2(0.0f, 0.0f);
  const int jr = L / 2 + int(threadIdx.x);  // rope pairs: rope / 2 ≤ kDecThreads
  if (jr < W2)
    kr = make_float2(mla_rope_q(src + L, 2 * jr - L, pos, rope), mla_rope_q(src + L, 2 * jr - L + 1, pos, rope));
  ss = block_sum(ss, red);
  const float sc = float(1.0 / sqrt(ss / double(L) + double(a.eps)));
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int j = int(threadIdx.x) + kDecThreads * i;
    if (2 * j < L) {
      const float2 v = make_float2(x[i].x * sc * g[i].x, x[i].y * sc * g[i].y);
      fr[j] = v;
      if (cache_row) cache_row[j] = v;
    }
  }
  if (jr < W2) {
    fr[jr] = kr;
    if (cache_row) cache_row[jr] = kr;
  }
}

template <class T, int NI, int C>  // NI column pairs per lane: (kv_lora + rope) / 2 ≤ 32 · NI; C blocks a cluster
__global__ void __launch_bounds__(kDecThreads)
    mla_decode_kernel(MlaDecodeArgs d, RowInfo rows, RopeTables rope, float scale) {
  const MlaArgs& a = d.a;
  cg::cluster_group cluster = cg::this_cluster();
  const int c = int(cluster.block_rank());
  const int h = blockIdx.y, r = blockIdx.z;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int Q = a.q_width, N = a.nope, P = a.rope, QK = N + P, L = a.kv_lora, W2 = (L + P) / 2, V = a.v_dim;
  const Share qs = share_of<C>(QK, c), ls = share_of<C>(L, c), vs = share_of<C>(V, c);
  extern __shared__ float4 sm4[];
  char* sm = reinterpret_cast<char*>(sm4);
  const DecodeSmem lay(a, int(sizeof(T)), C);
  const T* wq = reinterpret_cast<const T*>(sm + lay.wq);
  const T* wk = reinterpret_cast<const T*>(sm + lay.wk);
  const T* wv = reinterpret_cast<const T*>(sm + lay.wv);
  // Weights are never written during a step: this block's rows of q_b, W_uk and W_uv are on their way
  // into shared memory (three bulk copies) before the wait.
  const T* qb = static_cast<const T*>(d.q_b) + int64_t(h) * QK * Q;             // [QK, Q] head h's rows of q_b
  const T* uk = static_cast<const T*>(d.uk_t) + int64_t(h) * L * N;             // [L, N]
  const T* uv = static_cast<const T*>(d.kv_b) + (int64_t(h) * (N + V) + N) * L;  // [V, L]
  __shared__ uint64_t loaded[3];  // the bulk copies' barriers: q_b, W_uk, W_uv
  if (threadIdx.x == 0) {
    bulk_copy(sm + lay.wq, qb + int64_t(qs.b) * Q, uint32_t((qs.e - qs.b) * Q * int(sizeof(T))), &loaded[0]);
    bulk_copy(sm + lay.wk, uk + int64_t(ls.b) * N, uint32_t((ls.e - ls.b) * N * int(sizeof(T))), &loaded[1]);
    bulk_copy(sm + lay.wv, uv + int64_t(vs.b) * L, uint32_t((vs.e - vs.b) * L * int(sizeof(T))), &loaded[2]);
  }
  pdl_wait();
  pdl_launch_dependents();

  float* xq = reinterpret_cast<float*>(sm + lay.xq);
  float* qh = reinterpret_cast<float*>(sm + lay.qh);
  float* qv = reinterpret_cast<float*>(sm + lay.qv);
  float2* fr = reinterpret_cast<float2*>(sm + lay.fr);
  float* wp0 = reinterpret_cast<float*>(sm + lay.wp);
  float* bp = reinterpret_cast<float*>(sm + lay.bp);
  float* ol = reinterpret_cast<float*>(sm + lay.ol);
  __shared__ double red[32];

  // q_a's RMSNorm (sum of squares in f64), then this block's share of q = q_b · q_a.
  const float* row = a.fused + int64_t(r) * a.stride;
  double ss = 0.0;
#pragma unroll 1
  for (int k = threadIdx.x; k < Q; k += kDecThreads) {
    const float v = row[k];
    xq[k] = v;
    ss += double(v) * v;
  }
  ss = block_sum(ss, red);
  const float q_scale = float(1.0 / sqrt(ss / double(Q) + double(a.eps)));
#pragma unroll 1
  for (int k = threadIdx.x; k < Q; k += kDecThreads) xq[k] = xq[k] * q_scale * a.q_a_norm[k];
  __syncthreads();  // also publishes the barriers' initialisation
  bulk_wait(&loaded[0]);
  if (threadIdx.x == 0 && d.after.n > 0)  // the block's share of the later kernels' weights
    l2_prefetch_part(d.after, int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)),
                     int(gridDim.x * gridDim.y * gridDim.z));
  smem_gemv<T>(wq, Q, qs.e - qs.b, xq, qh + qs.b);
  cluster.sync();

  // The whole q; the rotated q_rope; the row's new cache entry by the block whose positions include it
  // (head 0's cluster also stores it in the cache); this block's share of q_lat = W_ukᵀ q_nope.
  gather_shares<C>(cluster, qh, QK, c);
  __syncthreads();
  bulk_wait(&loaded[1]);
  const int pos = rows.pos[r];
#pragma unroll 1
  for (int rc = threadIdx.x; rc < P; rc += kDecThreads) qv[L + rc] = mla_rope_q(qh + N, rc, pos, rope);
  const int n_pos = pos + 1, per = (n_pos + C - 1) / C;
  const int tb = min(n_pos, c * per), te = min(n_pos, tb + per);
  float2* cache = reinterpret_cast<float2*>(a.cache) + int64_t(rows.seq[r]) * rows.ctx * W2;
  if (te == n_pos && tb < te) fresh_row_block(a, r, pos, rope, fr, h == 0 ? cache + int64_t(pos) * W2 : nullptr, red);
  smem_gemv<T>(wk, N, ls.e - ls.b, qh, qv + ls.b);
  cluster.sync();

  // Attention over positions [tb, te): warp w takes tb + w, tb + w + kDecWarps, ..., an online softmax
  // as attention_mla_kernel's for one head, the next cached row in flight while it scores the current.
  gather_shares<C>(cluster, qv, L, c);
  __syncthreads();
  float2 qr[NI], acc[NI], cur[NI], nxt[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int j = lane + kWarp * i;
    qr[i] = j < W2 ? reinterpret_cast<const float2*>(qv)[j] : make_float2(0.0f, 0.0f);
    acc[i] = make_float2(0.0f, 0.0f);
  }
  auto load_row = [&](int t, float2(&dst)[NI]) {
    const float2* src = t == pos ? fr : cache + int64_t(t) * W2;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int j = lane + kWarp * i;
      dst[i] = j < W2 ? src[j] : make_float2(0.0f, 0.0f);
    }
  };
  float m = -INFINITY, l = 0.0f;
  int t = tb + warp;
  if (t < te) load_row(t, cur);
#pragma unroll 1
  for (; t < te; t += kDecWarps) {
    if (t + kDecWarps < te) load_row(t + kDecWarps, nxt);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) s += qr[i].x * cur[i].x + qr[i].y * cur[i].y;
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float al = expf(m - m_new);  // 0 at the first position (m = -inf)
    const float p = expf(s - m_new);
    l = l * al + p;
    m = m_new;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      acc[i].x = acc[i].x * al + p * cur[i].x;
      acc[i].y = acc[i].y * al + p * cur[i].y;
      cur[i] = nxt[i];
    }
  }
  float* wp = wp0 + warp * lay.wp_stride;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int col = 2 * (lane + kWarp * i);
    if (col < L) *reinterpret_cast<float2*>(wp + col) = acc[i];
  }
  if (lane == 0) wp[L] = m, wp[L + 1] = l;
  __syncthreads();
  // The block's sums over its warps (a warp or a block without positions weighs 0).
  {
    float wm[kDecWarps], mx = -INFINITY, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, wm[w] = wp0[w * lay.wp_stride + L]);
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      wm[w] = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - mx);
      den += wm[w] * wp0[w * lay.wp_stride + L + 1];
    }
#pragma unroll 1
    for (int k = threadIdx.x; k < L; k += kDecThreads) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) v += wm[w] * wp0[w * lay.wp_stride + k];
      bp[k] = v;
    }
    if (threadIdx.x == 0) bp[L] = mx, bp[L + 1] = den;
  }
  cluster.sync();

  // o_lat from every block's sums, in block order (the same bits in every block of the cluster); then
  // this block's share of the head's output = W_uv · o_lat. Block 0 always has positions: M is finite.
  {
    float cw[C], M = -INFINITY, den = 0.0f;
    const float* part[C];
#pragma unroll
    for (int o = 0; o < C; ++o) {
      part[o] = cluster.map_shared_rank(bp, o);
      M = fmaxf(M, cw[o] = part[o][L]);
    }
#pragma unroll
    for (int o = 0; o < C; ++o) {
      cw[o] = cw[o] == -INFINITY ? 0.0f : expf(cw[o] - M);
      den += cw[o] * part[o][L + 1];
    }
    const float inv = 1.0f / den;
#pragma unroll 1
    for (int k = threadIdx.x; k < L; k += kDecThreads) {
      float v = 0.0f;
#pragma unroll
      for (int o = 0; o < C; ++o) v += cw[o] * part[o][k];
      ol[k] = v * inv;
    }
  }
  __syncthreads();
  bulk_wait(&loaded[2]);
  // No block may leave while another still reads its shared memory: arrive now, wait before leaving.
  auto arrived = cluster.barrier_arrive();
  smem_gemv<T>(wv, L, vs.e - vs.b, ol, d.out + int64_t(r) * d.out_stride + int64_t(h) * V + vs.b);
  cluster.barrier_wait(std::move(arrived));
}

}  // namespace

size_t mla_decode_smem(const MlaArgs& a, WType wt, int cluster) {
  return size_t(DecodeSmem(a, int(wtype_size(wt)), cluster).total);
}

int mla_decode_cluster(const MlaArgs& a, WType wt, const KernelPolicy& p) {
  const int want = p.mla_cluster;
  return mla_decode_smem(a, wt, want) <= kMlaDecodeMaxSmem ? want : kMlaCluster;
}

bool mla_decode_applies(const MlaArgs& a, WType wt, const KernelPolicy& p) {
  const int v = 16 / int(wtype_size(wt));  // weights per 16-byte copy
  return a.q_lora && mla_fresh_applies(a) && a.kv_lora % 2 == 0 && a.rope % 2 == 0 &&
         a.kv_lora + a.rope <= kMlaMaxWidth && a.q_width % v == 0 && a.nope % v == 0 && a.kv_lora % v == 0 &&
         mla_decode_smem(a, wt, mla_decode_cluster(a, wt, p)) <= kMlaDecodeMaxSmem;
}

void launch_mla_decode(const MlaDecodeArgs& d, const RowInfo& rows, const RopeTables& rope, float scale,
                       const KernelPolicy& p, cudaStream_t stream) {
  if (rows.n == 0) return;
  const MlaArgs& a = d.a;
  TANDEM_CUDA_REQUIRE(p.mla_cluster == 4 || p.mla_cluster == kMlaCluster, "fused MLA decode: clusters of 4 or 8");
  TANDEM_CUDA_REQUIRE(mla_decode_applies(a, d.wt, p) && a.rope == rope.dim, "fused MLA decode: unsupported shapes");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  TANDEM_CUDA_REQUIRE(aligned(d.q_b) && aligned(d.uk_t) && aligned(d.kv_b), "fused MLA decode: unaligned weights");
  const int cluster = mla_decode_cluster(a, d.wt, p);
  const size_t smem = mla_decode_smem(a, d.wt, cluster);
  const int w2 = (a.kv_lora + a.rope) / 2;
  with_wtype(d.wt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto kernel) {
      if (smem > 48 * 1024)
        TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      launch_kernel_cluster(kernel, dim3(unsigned(cluster), a.n_head, rows.n), kDecThreads, smem, unsigned(cluster),
                            stream, d, rows, rope, scale);
    };
    auto pick = [&](auto c) {
      constexpr int C = decltype(c)::value;
      if (w2 <= kWarp) go(mla_decode_kernel<T, 1, C>);
      else if (w2 <= 2 * kWarp) go(mla_decode_kernel<T, 2, C>);
      else if (w2 <= 3 * kWarp) go(mla_decode_kernel<T, 3, C>);
      else if (w2 <= 5 * kWarp) go(mla_decode_kernel<T, 5, C>);
      else go(mla_decode_kernel<T, 9, C>);
    };
    static_assert(kMlaCluster == 8, "the clusters launch_mla_decode instantiates: 4 and 8");
    if (cluster == 4) pick(std::integral_constant<int, 4>{});
    else pick(std::integral_constant<int, 8>{});
  });
}

}  // namespace tandem::cuda
