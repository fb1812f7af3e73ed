// Attention kernels (see attention.cuh). Scores of one (row, head) live in shared memory; softmax
// follows the CPU: max, exp, sum, multiply by 1/sum, then the weighted sum of values.
#include "backends/cuda/attention.cuh"

#include <algorithm>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"

namespace tandem::cuda {

namespace {

constexpr int kAttnThreads = 128;
constexpr int kMaxSmem = 200 * 1024;

// p[0..T) = softmax(p) in place, block-wide.
__device__ void block_softmax(float* p, int T, float* red) {
  float mx = -INFINITY;
  for (int t = threadIdx.x; t < T; t += blockDim.x) mx = fmaxf(mx, p[t]);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int t = threadIdx.x; t < T; t += blockDim.x) sum += (p[t] = expf(p[t] - mx));
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int t = threadIdx.x; t < T; t += blockDim.x) p[t] *= inv;
  __syncthreads();
}

// Rotates one vector of width rope.dim at v (in place) for position pos. Block-wide; `tmp` holds
// rope.dim floats of shared memory.
__device__ void block_rope(float* v, int pos, const RopeTables& rope, float* tmp) {
  const int half = rope.dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = rope.interleaved ? v[2 * i] : v[i];
    const float b = rope.interleaved ? v[2 * i + 1] : v[half + i];
    const float c = rope.cos[int64_t(pos) * half + i], s = rope.sin[int64_t(pos) * half + i];
    tmp[i] = a * c - b * s;
    tmp[half + i] = b * c + a * s;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rope.dim; i += blockDim.x) v[i] = tmp[i];
  __syncthreads();
}

// v[0..d) *= 1/sqrt(mean(v²) + eps) · w, block-wide (sum of squares in f64 as the CPU).
__device__ void block_rms_norm(const float* x, int d, const float* w, float eps, float* out, double* red) {
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += double(x[i]) * x[i];
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(ss / double(d) + double(eps)));
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = x[i] * scale * w[i];
  __syncthreads();
}

__global__ void gqa_prep_kernel(GqaPrepArgs a, RowInfo rows, RopeTables rope) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ double red[32];
  extern __shared__ float tmp[];
  const int r = blockIdx.x;
  const int hd = a.head_dim, qw = a.n_head * hd, kvw = a.n_head_kv * hd;
  float* q = a.qkv + int64_t(r) * a.stride;
  float* k = q + qw;
  float* v = k + kvw;
  if (a.clip > 0.0f) {
    for (int i = threadIdx.x; i < qw + 2 * kvw; i += blockDim.x) q[i] = fminf(fmaxf(q[i], -a.clip), a.clip);
    __syncthreads();
  }
  if (a.qk_norm == 1) {
    for (int h = 0; h < a.n_head; ++h) block_rms_norm(q + h * hd, hd, a.q_norm, a.eps, q + h * hd, red);
    for (int h = 0; h < a.n_head_kv; ++h) block_rms_norm(k + h * hd, hd, a.k_norm, a.eps, k + h * hd, red);
  } else if (a.qk_norm == 2) {
    block_rms_norm(q, qw, a.q_norm, a.eps, q, red);
    block_rms_norm(k, kvw, a.k_norm, a.eps, k, red);
  }
  const int pos = rows.pos[r];
  for (int h = 0; h < a.n_head; ++h) block_rope(q + h * hd, pos, rope, tmp);
  for (int h = 0; h < a.n_head_kv; ++h) block_rope(k + h * hd, pos, rope, tmp);
  const int64_t at = (int64_t(rows.seq[r]) * rows.ctx + pos) * kvw;
  for (int i = threadIdx.x; i < kvw; i += blockDim.x) {
    a.k_cache[at + i] = k[i];
    a.v_cache[at + i] = v[i];
  }
}

__global__ void attention_gqa_kernel(GqaPrepArgs a, RowInfo rows, float scale, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float red[32];
  extern __shared__ float p[];
  const int r = blockIdx.x, head = blockIdx.y;
  const int hd = a.head_dim, kvw = a.n_head_kv * hd, g = head / (a.n_head / a.n_head_kv);
  const int T = rows.pos[r] + 1;
  const float* qh = a.qkv + int64_t(r) * a.stride + head * hd;
  const float* kc = a.k_cache + int64_t(rows.seq[r]) * rows.ctx * kvw + g * hd;
  const float* vc = a.v_cache + int64_t(rows.seq[r]) * rows.ctx * kvw + g * hd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  for (int t = warp; t < T; t += nw) {
    float s = 0.0f;
    for (int d = lane; d < hd; d += kWarp) s += qh[d] * kc[int64_t(t) * kvw + d];
    s = warp_sum(s);
    if (lane == 0) p[t] = s * scale;
  }
  __syncthreads();
  block_softmax(p, T, red);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll 4
    for (int t = 0; t < T; ++t) o += p[t] * vc[int64_t(t) * kvw + d];
    out[int64_t(r) * a.n_head * hd + head * hd + d] = o;
  }
}

__global__ void mla_prep_kernel(MlaArgs a, RowInfo rows, RopeTables rope) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ double red[32];
  extern __shared__ float tmp[];
  const int r = blockIdx.x;
  float* row = a.fused + int64_t(r) * a.stride;
  if (a.q_lora) block_rms_norm(row, a.q_width, a.q_a_norm, a.eps, row, red);
  const int pos = rows.pos[r];
  float* dst = a.cache + (int64_t(rows.seq[r]) * rows.ctx + pos) * (a.kv_lora + a.rope);
  block_rms_norm(row + a.q_width, a.kv_lora, a.kv_a_norm, a.eps, dst, red);
  float* kr = row + a.q_width + a.kv_lora;
  block_rope(kr, pos, rope, tmp);
  for (int i = threadIdx.x; i < a.rope; i += blockDim.x) dst[a.kv_lora + i] = kr[i];
}

// MLA attention over the latent cache (decode and prefill), all heads of a tile in one block: each
// cached position is read once per block and scored against every head of the tile (MLA shares its
// cache across heads). Positions [0, T) of a row are cut into up to `splits` contiguous chunks of at
// least kMlaMinChunk positions, one block each (flash-decoding), so that a single sequence with a
// long context still spreads over many multiprocessors; a block
// walks its chunk kMlaTile positions at a time with an online softmax (running max and sum per head).
// With one split the block writes o_lat directly; otherwise it writes its unnormalised sums with
// their max and sum, and the block that arrives last for its (row, head tile) combines the splits in
// split order (so the result does not depend on which block was last).
constexpr int kMlaThreads = 256;
constexpr int kMlaWarps = kMlaThreads / kWarp;
constexpr int kMlaTile = 32;  // positions per online-softmax step: one per lane in the softmax
constexpr int kMlaMinChunk = 32;  // fewest positions a split block takes
static_assert(kMlaTile == kWarp, "the softmax step maps one position to each lane");

struct MlaSmem {  // float offsets into the dynamic shared memory
  int ql, qr, p, m, l, alpha, wgt, den, total;
  __host__ __device__ MlaSmem(int L, int R, int splits) {
    ql = 0;                          // [kMlaHeads][L] q_lat of the tile's heads
    qr = ql + kMlaHeads * L;         // [kMlaHeads][R] rotated q_rope
    p = qr + kMlaHeads * R;          // [kMlaHeads][kMlaTile] scores, then their exponentials
    m = p + kMlaHeads * kMlaTile;    // [kMlaHeads] running max
    l = m + kMlaHeads;               // [kMlaHeads] running sum
    alpha = l + kMlaHeads;           // [kMlaHeads] rescale of the accumulators at this step
    wgt = alpha + kMlaHeads;         // [kMlaHeads][splits] combine weights
    den = wgt + kMlaHeads * splits;  // [kMlaHeads] combine denominators
    total = den + kMlaHeads;
  }
};

template <int C>  // C: latent columns per thread (kv_lora ≤ C · kMlaThreads)
__global__ void __launch_bounds__(kMlaThreads)
    attention_mla_kernel(MlaArgs a, RowInfo rows, const float* q_lat, const float* q, int64_t q_stride,
                         RopeTables rope, float scale, float* o_lat, MlaScratch sc, int splits) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];
  __shared__ int last;
  const int r = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  const int L = a.kv_lora, R = a.rope, W = L + R, nh = a.n_head;
  const int h0 = tile * kMlaHeads, hn = min(kMlaHeads, nh - h0);
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  const MlaSmem o(L, R, splits);
  float *ql = sm + o.ql, *qr = sm + o.qr, *p = sm + o.p, *mrun = sm + o.m, *lrun = sm + o.l, *alpha = sm + o.alpha;
  const int pos = rows.pos[r];
  const int T = pos + 1;
  // A short context uses fewer of the grid's splits (the rest leave at once): no chunk shorter than
  // kMlaMinChunk positions, and one block writes the answer directly when one chunk is all there is.
  const int used = min(splits, (T + kMlaMinChunk - 1) / kMlaMinChunk);
  if (split >= used) return;
  const int chunk = (T + used - 1) / used;
  const int tb = min(T, split * chunk), te = min(T, tb + chunk);

  // The tile's queries (q_rope rotated here); heads past the model's last score zeros, never stored.
  for (int i = tid; i < kMlaHeads * L; i += kMlaThreads) {
    const int h = i / L;
    ql[i] = h < hn ? q_lat[(int64_t(r) * nh + h0 + h) * L + i % L] : 0.0f;
  }
  const int half = R / 2;
  for (int i = tid; i < kMlaHeads * half; i += kMlaThreads) {
    const int h = i / half, j = i % half;
    float* dst = qr + h * R;
    if (h >= hn) {
      dst[j] = dst[half + j] = 0.0f;
      continue;
    }
    const float* src = q + int64_t(r) * q_stride + int64_t(h0 + h) * (a.nope + R) + a.nope;
    const float x0 = rope.interleaved ? src[2 * j] : src[j];
    const float x1 = rope.interleaved ? src[2 * j + 1] : src[half + j];
    const float c = rope.cos[int64_t(pos) * half + j], s = rope.sin[int64_t(pos) * half + j];
    dst[j] = x0 * c - x1 * s;
    dst[half + j] = x1 * c + x0 * s;
  }
  if (tid < kMlaHeads) {
    mrun[tid] = -INFINITY;
    lrun[tid] = 0.0f;
  }
  __syncthreads();

  const float* cache = a.cache + int64_t(rows.seq[r]) * rows.ctx * W;
  float acc[kMlaHeads][C] = {};
  for (int t0 = tb; t0 < te; t0 += kMlaTile) {
    const int nt = min(kMlaTile, te - t0);
    // Scores: a warp per position, every head of the tile from one read of the cached row.
    for (int tt = warp; tt < nt; tt += kMlaWarps) {
      const float* ct = cache + int64_t(t0 + tt) * W;
      float s[kMlaHeads] = {};
#pragma unroll 2
      for (int d = lane; d < L; d += kWarp) {
        const float cv = ct[d];
#pragma unroll
        for (int h = 0; h < kMlaHeads; ++h) s[h] += ql[h * L + d] * cv;
      }
      for (int d = lane; d < R; d += kWarp) {
        const float cv = ct[L + d];
#pragma unroll
        for (int h = 0; h < kMlaHeads; ++h) s[h] += qr[h * R + d] * cv;
      }
#pragma unroll
      for (int h = 0; h < kMlaHeads; ++h) {
        const float v = warp_sum(s[h]);
        if (lane == h) p[h * kMlaTile + tt] = v * scale;
      }
    }
    __syncthreads();
    // Online softmax step: a warp per head, a lane per position.
    for (int h = warp; h < hn; h += kMlaWarps) {
      const float sv = lane < nt ? p[h * kMlaTile + lane] : -INFINITY;
      const float m_old = mrun[h], m_new = fmaxf(m_old, warp_max(sv));
      const float e = lane < nt ? expf(sv - m_new) : 0.0f;
      const float sum = warp_sum(e);
      p[h * kMlaTile + lane] = e;
      if (lane == 0) {
        const float al = expf(m_old - m_new);  // 0 on the first step (m_old = -inf)
        alpha[h] = al;
        lrun[h] = lrun[h] * al + sum;
        mrun[h] = m_new;
      }
    }
    __syncthreads();
    // Weighted sum: a thread per latent column, every head of the tile from one read.
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const int c = tid + k * kMlaThreads;
      if (c >= L) break;
#pragma unroll
      for (int h = 0; h < kMlaHeads; ++h) acc[h][k] *= alpha[h];
#pragma unroll 4
      for (int tt = 0; tt < nt; ++tt) {
        const float v = cache[int64_t(t0 + tt) * W + c];
#pragma unroll
        for (int h = 0; h < kMlaHeads; ++h) acc[h][k] += p[h * kMlaTile + tt] * v;
      }
    }
    __syncthreads();
  }

  // One split: the answer, normalised. Several: this split's partial, [kMlaHeads][L + 2] =
  // unnormalised sums | max | sum, for the last block to combine.
  const bool direct = used == 1;
  const int64_t rt = int64_t(r) * gridDim.y + tile;
  float* part = sc.part + (rt * splits + split) * int64_t(kMlaHeads) * (L + 2);
  float* dst = direct ? o_lat + (int64_t(r) * nh + h0) * L : part;
  const int ld = direct ? L : L + 2;
#pragma unroll
  for (int k = 0; k < C; ++k) {
    const int c = tid + k * kMlaThreads;
    if (c >= L) break;
#pragma unroll
    for (int h = 0; h < kMlaHeads; ++h)
      if (h < hn) dst[h * ld + c] = direct ? acc[h][k] / lrun[h] : acc[h][k];
  }
  if (direct) return;
  if (tid < hn) {
    part[tid * (L + 2) + L] = mrun[tid];
    part[tid * (L + 2) + L + 1] = lrun[tid];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int ticket = atomicAdd(&sc.tickets[rt], 1);
    last = ticket == used - 1;
    if (last) sc.tickets[rt] = 0;  // ready for the next launch (stream-ordered after this one)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The last block combines the splits of every head, in split order.
  const float* base = sc.part + rt * splits * int64_t(kMlaHeads) * (L + 2);
  float *wgt = sm + o.wgt, *den = sm + o.den;
  if (tid < hn) {
    const int h = tid;
    float ms[kMaxMlaSplits];
#pragma unroll
    for (int s = 0; s < kMaxMlaSplits; ++s)
      ms[s] = s < used ? __ldcg(base + (int64_t(s) * kMlaHeads + h) * (L + 2) + L) : -INFINITY;
    float m_all = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxMlaSplits; ++s) m_all = fmaxf(m_all, ms[s]);
    float d = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxMlaSplits; ++s) {
      if (s >= used) break;
      const float w = expf(ms[s] - m_all);
      wgt[h * splits + s] = w;
      d += w * __ldcg(base + (int64_t(s) * kMlaHeads + h) * (L + 2) + L + 1);
    }
    den[h] = d;
  }
  __syncthreads();
  for (int i = tid; i < hn * L; i += kMlaThreads) {
    const int h = i / L, c = i % L;
    float v[kMaxMlaSplits];
#pragma unroll
    for (int s = 0; s < kMaxMlaSplits; ++s)  // all loads in flight at once
      v[s] = s < used ? __ldcg(base + (int64_t(s) * kMlaHeads + h) * (L + 2) + c) : 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxMlaSplits; ++s)
      if (s < used) acc += wgt[h * splits + s] * v[s];
    o_lat[(int64_t(r) * nh + h0 + h) * L + c] = acc / den[h];
  }
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

int max_attention_ctx(int kv_lora) { return kMaxSmem / 4 - kv_lora - 512; }

void launch_gqa_prep(const GqaPrepArgs& a, const RowInfo& rows, const RopeTables& rope, cudaStream_t stream) {
  if (rows.n == 0) return;
  launch_kernel(gqa_prep_kernel, rows.n, kAttnThreads, size_t(rope.dim) * 4, stream, a, rows, rope);
}

void launch_attention_gqa(const GqaPrepArgs& a, const RowInfo& rows, float scale, float* out,
                          cudaStream_t stream) {
  if (rows.n == 0) return;
  const size_t smem = size_t(rows.ctx) * 4;
  allow_smem(attention_gqa_kernel, smem);
  launch_kernel(attention_gqa_kernel, dim3(rows.n, a.n_head), kAttnThreads, smem, stream, a, rows, scale, out);
}

void launch_mla_prep(const MlaArgs& a, const RowInfo& rows, const RopeTables& rope, cudaStream_t stream) {
  if (rows.n == 0) return;
  launch_kernel(mla_prep_kernel, rows.n, 256, size_t(rope.dim) * 4, stream, a, rows, rope);
}

MlaScratchSize mla_scratch_size(int n_sm, int kv_lora) {
  MlaScratchSize z;
  z.target = 2 * n_sm;
  // A split launch has pairs < target (row, head tile) pairs and ceil(target / pairs) splits each:
  // fewer than 2 · target blocks.
  z.blocks = 2 * z.target;
  z.part_floats = size_t(z.blocks) * kMlaHeads * size_t(kv_lora + 2);
  z.tickets = z.target;
  return z;
}

void launch_attention_mla(const MlaArgs& a, const RowInfo& rows, const float* q_lat, const float* q, int64_t q_stride,
                          const RopeTables& rope, float scale, float* o_lat, const MlaScratch& sc,
                          cudaStream_t stream) {
  if (rows.n == 0) return;
  const int tiles = (a.n_head + kMlaHeads - 1) / kMlaHeads;
  const int pairs = rows.n * tiles;
  int splits = 1;
  if (sc.part && pairs < sc.target) splits = std::min(kMaxMlaSplits, (sc.target + pairs - 1) / pairs);
  TANDEM_CUDA_REQUIRE(splits == 1 || (pairs <= sc.tickets_n && pairs * splits <= sc.blocks), "MLA split scratch too small");
  TANDEM_CUDA_REQUIRE(a.rope % 2 == 0 && a.rope == rope.dim, "rotary width");
  const size_t smem = size_t(MlaSmem(a.kv_lora, a.rope, splits).total) * 4;
  const dim3 grid(rows.n, tiles, splits);
  auto go = [&](auto kernel) {
    allow_smem(kernel, smem);
    launch_kernel(kernel, grid, kMlaThreads, smem, stream, a, rows, q_lat, q, q_stride, rope, scale, o_lat, sc, splits);
  };
  if (a.kv_lora <= kMlaThreads) go(attention_mla_kernel<1>);
  else if (a.kv_lora <= 2 * kMlaThreads) go(attention_mla_kernel<2>);
  else if (a.kv_lora <= 4 * kMlaThreads) go(attention_mla_kernel<4>);
  else TANDEM_CUDA_REQUIRE(false, "kv_lora_rank above 1024");
}

}  // namespace tandem::cuda
