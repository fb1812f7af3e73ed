// Attention kernels (see attention.cuh). GQA: the scores of one (row, head) live in shared memory and
// the softmax follows the CPU (max, exp, sum, multiply by 1/sum, then the weighted sum of values).
// MLA: an online softmax over the latent cache, split over blocks and warps (attention_mla_kernel).
#include "backends/cuda/attention.cuh"

#include <algorithm>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/mla_device.cuh"

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

// Block (r, 0): q_a's RMSNorm in place (when q_lora); block (r, 1): the latent's RMSNorm and the
// rotated key into the cache. Two blocks per row, so the two reductions run side by side.
__global__ void mla_prep_kernel(MlaArgs a, RowInfo rows, RopeTables rope) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ double red[32];
  extern __shared__ float tmp[];
  const int r = blockIdx.x;
  float* row = a.fused + int64_t(r) * a.stride;
  if (blockIdx.y == 0) {
    if (a.q_lora) block_rms_norm(row, a.q_width, a.q_a_norm, a.eps, row, red);
    return;
  }
  const int pos = rows.pos[r];
  float* dst = a.cache + (int64_t(rows.seq[r]) * rows.ctx + pos) * (a.kv_lora + a.rope);
  block_rms_norm(row + a.q_width, a.kv_lora, a.kv_a_norm, a.eps, dst, red);
  float* kr = row + a.q_width + a.kv_lora;
  block_rope(kr, pos, rope, tmp);
  for (int i = threadIdx.x; i < a.rope; i += blockDim.x) dst[a.kv_lora + i] = kr[i];
}

// MLA attention over the latent cache (decode and prefill). A block is (row, group of kMlaHeads
// heads, split) with one warp per head of the group; a row's positions [0, T) are cut into up to
// `splits` contiguous chunks of at least min_chunk positions (mla_min_chunk()), one block each (flash-decoding), and
// inside a block the warps take the chunk's positions in turn. A warp holds its lanes' share of every
// group head's query in registers (q_lat and the rotated q_rope, two columns per lane per NI step),
// reads each of its positions' cached rows once (the next one in flight while it scores the current
// one), scores all heads from it, and runs an online softmax into per-lane accumulators over the same
// latent values: one read of a cached row serves every head's score and weighted sum. The block's
// warps combine through shared memory (warp h then owns head h); with one split that is the answer,
// otherwise the block leaves its unnormalised sums with their max and sum, and the block that arrives
// last for its (row, head group) combines the splits in split order (so the result does not depend
// on which block was last).
constexpr int kMlaWarps = kMlaHeads;  // warp h combines head h
constexpr int kMlaThreads = kMlaWarps * kWarp;

template <int NI>  // column pairs per lane: (kv_lora + rope) / 2 ≤ 32 · NI
__global__ void __launch_bounds__(kMlaThreads)
    attention_mla_kernel(MlaArgs a, RowInfo rows, const float* q_lat, const float* q, int64_t q_stride,
                         RopeTables rope, float scale, float* o_lat, MlaScratch sc, int splits, int min_chunk,
                         bool fresh) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [kMlaWarps][kMlaHeads][L] warp sums | [kMlaWarps][kMlaHeads] max | sum
  __shared__ int last;
  constexpr int HG = kMlaHeads;
  const int r = blockIdx.x, grp = blockIdx.y, split = blockIdx.z;
  const int L = a.kv_lora, W2 = (a.kv_lora + a.rope) / 2, nh = a.n_head;
  const int h0 = grp * HG, hn = min(HG, nh - h0);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int pos = rows.pos[r];
  const int T = pos + 1;
  // A short context uses fewer of the grid's splits (the rest leave at once), each at least one
  // position: chunks of ceil(T / want) positions, as many as it takes to cover T.
  const int want = min(splits, (T + min_chunk - 1) / min_chunk);
  const int chunk = (T + want - 1) / want;
  const int used = (T + chunk - 1) / chunk;
  if (split >= used) return;
  const int tb = min(T, split * chunk), te = min(T, tb + chunk);

  // The group's queries, this lane's columns 2j, 2j + 1 for j = lane + 32 i; heads past the model's
  // last and columns past the row are zeros.
  float2 qv[HG][NI];
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    const float* src = q + int64_t(r) * q_stride + int64_t(h0 + h) * (a.nope + a.rope) + a.nope;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int j = lane + kWarp * i, c = 2 * j;
      float2 v = make_float2(0.0f, 0.0f);
      if (h < hn && j < W2) {
        if (c < L) v = *reinterpret_cast<const float2*>(q_lat + (int64_t(r) * nh + h0 + h) * L + c);
        else v = make_float2(mla_rope_q(src, c - L, pos, rope), mla_rope_q(src, c - L + 1, pos, rope));
      }
      qv[h][i] = v;
    }
  }

  float2* cache = reinterpret_cast<float2*>(a.cache) + int64_t(rows.seq[r]) * rows.ctx * W2;
  // fresh: the row's own position is not in the cache yet. The warp that takes it builds it from the
  // projection's output (a.fused) as mla_prep does — the latent's RMSNorm (sum of squares in f64),
  // the rotated key — into shared memory, where its loop reads it; group 0's block also stores it in
  // the cache for the steps after this one.
  __shared__ float2 fresh_sm[kMlaMaxWidth / 2];
  const bool own = fresh && te == T && warp == (pos - tb) % kMlaWarps;
  if (own) {
    const float* src = a.fused + int64_t(r) * a.stride + a.q_width;
    double ss = 0.0;
    for (int c = 2 * lane; c < L; c += 2 * kWarp) {
      const float2 v = *reinterpret_cast<const float2*>(src + c);
      ss += double(v.x) * v.x + double(v.y) * v.y;
    }
    ss = warp_sum(ss);
    const float sc = float(1.0 / sqrt(ss / double(L) + double(a.eps)));
    for (int j = lane; j < W2; j += kWarp) {
      const int c = 2 * j;
      float2 v;
      if (c < L) {
        const float2 x = *reinterpret_cast<const float2*>(src + c), g = *reinterpret_cast<const float2*>(a.kv_a_norm + c);
        v = make_float2(x.x * sc * g.x, x.y * sc * g.y);
      } else {
        v = make_float2(mla_rope_q(src + L, c - L, pos, rope), mla_rope_q(src + L, c - L + 1, pos, rope));
      }
      fresh_sm[j] = v;
      if (grp == 0) cache[int64_t(pos) * W2 + j] = v;
    }
    __syncwarp();
  }
  auto load_row = [&](int t, float2(&dst)[NI]) {
    const float2* src = own && t == pos ? fresh_sm : cache + int64_t(t) * W2;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int j = lane + kWarp * i;
      dst[i] = j < W2 ? src[j] : make_float2(0.0f, 0.0f);
    }
  };
  float m[HG], l[HG];
  float2 acc[HG][NI];
#pragma unroll
  for (int h = 0; h < HG; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) acc[h][i] = make_float2(0.0f, 0.0f);
  }
  float2 cur[NI], nxt[NI];
  int t = tb + warp;
  if (t < te) load_row(t, cur);
  for (; t < te; t += kMlaWarps) {
    if (t + kMlaWarps < te) load_row(t + kMlaWarps, nxt);
    float s[HG];
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < NI; ++i) v += qv[h][i].x * cur[i].x + qv[h][i].y * cur[i].y;
      s[h] = v;
    }
#pragma unroll
    for (int h = 0; h < HG; ++h) s[h] = warp_sum(s[h]) * scale;
#pragma unroll
    for (int h = 0; h < HG; ++h) {
      const float m_new = fmaxf(m[h], s[h]);
      const float al = expf(m[h] - m_new);  // 0 at the first position (m = -inf)
      const float p = expf(s[h] - m_new);
      l[h] = l[h] * al + p;
      m[h] = m_new;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        acc[h][i].x = acc[h][i].x * al + p * cur[i].x;
        acc[h][i].y = acc[h][i].y * al + p * cur[i].y;
      }
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) cur[i] = nxt[i];
  }

  // The block's warps combine in shared memory; warp h then owns head h of the group.
  float* ws = sm;                                // [kMlaWarps][HG][L]
  float* wm = ws + kMlaWarps * HG * L;           // [kMlaWarps][HG]
  float* wl = wm + kMlaWarps * HG;               // [kMlaWarps][HG]
#pragma unroll
  for (int h = 0; h < HG; ++h) {
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int c = 2 * (lane + kWarp * i);
      if (c < L) *reinterpret_cast<float2*>(ws + (warp * HG + h) * L + c) = acc[h][i];
    }
  }
  if (lane < HG) {
    float mv = 0.0f, lv = 0.0f;
#pragma unroll
    for (int h = 0; h < HG; ++h)
      if (lane == h) mv = m[h], lv = l[h];
    wm[warp * HG + lane] = mv;
    wl[warp * HG + lane] = lv;
  }
  __syncthreads();
  const int h = warp;
  const bool direct = used == 1;
  const int64_t rt = int64_t(r) * gridDim.y + grp;
  const int64_t stride = int64_t(HG) * (L + 2);  // per (row, group, split): [HG][L] sums | [HG] max | [HG] sum
  float* part = sc.part + (rt * splits + split) * stride;
  if (h < hn) {
    float mw[kMlaWarps], mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMlaWarps; ++w) mx = fmaxf(mx, mw[w] = wm[w * HG + h]);
    float den = 0.0f;
#pragma unroll
    for (int w = 0; w < kMlaWarps; ++w) {
      mw[w] = expf(mw[w] - mx);  // a warp without positions: exp(-inf) = 0
      den += mw[w] * wl[w * HG + h];
    }
    float* dst = direct ? o_lat + (int64_t(r) * nh + h0 + h) * L : part + h * L;
    const float inv = direct ? 1.0f / den : 1.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int c = 2 * (lane + kWarp * i);
      if (c >= L) break;
      float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kMlaWarps; ++w) {
        const float2 x = *reinterpret_cast<const float2*>(ws + (w * HG + h) * L + c);
        v.x += mw[w] * x.x;
        v.y += mw[w] * x.y;
      }
      v.x *= inv;
      v.y *= inv;
      *reinterpret_cast<float2*>(dst + c) = v;
    }
    if (!direct && lane == 0) {
      part[HG * L + h] = mx;
      part[HG * L + HG + h] = den;
    }
  }
  if (direct) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int ticket = atomicAdd(&sc.tickets[rt], 1);
    last = ticket == used - 1;
    if (last) sc.tickets[rt] = 0;  // ready for the next launch (stream-ordered after this one)
  }
  __syncthreads();
  if (!last || h >= hn) return;
  __threadfence();
  // The last block combines the splits of head h, in split order: lane s holds split s's max and
  // weight (used ≤ kMaxMlaSplits ≤ 32), the weights then in shared memory for every lane.
  __shared__ float split_w[kMlaHeads][kMaxMlaSplits];
  const float* base = sc.part + rt * splits * stride;
  const float ms = lane < used ? __ldcg(base + lane * stride + HG * L + h) : -INFINITY;
  const float m_all = warp_max(ms);
  const float wgt = lane < used ? expf(ms - m_all) : 0.0f;
  const float den = warp_sum(lane < used ? wgt * __ldcg(base + lane * stride + HG * L + HG + h) : 0.0f);
  if (lane < used) split_w[h][lane] = wgt;
  __syncwarp();
  const float inv = 1.0f / den;
  // Splits outer, columns inner: every load of a split (and of two splits at once) is in flight
  // together, and the stores come after all of them.
  float2 v[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) v[i] = make_float2(0.0f, 0.0f);
  const auto add_split = [&](int s) {
    const float w = split_w[h][s];
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int c = 2 * (lane + kWarp * i);
      if (c < L) {
        const float2 x = __ldcg(reinterpret_cast<const float2*>(base + s * stride + h * L + c));
        v[i].x += w * x.x;
        v[i].y += w * x.y;
      }
    }
  };
  int s = 0;
  for (; s + 2 <= used; s += 2) {
    add_split(s);
    add_split(s + 1);
  }
  if (s < used) add_split(s);
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int c = 2 * (lane + kWarp * i);
    if (c < L)
      *reinterpret_cast<float2*>(o_lat + (int64_t(r) * nh + h0 + h) * L + c) = make_float2(v[i].x * inv, v[i].y * inv);
  }
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

int max_gqa_ctx() { return kMaxSmem / 4; }

bool mla_fresh_applies(const MlaArgs& a) { return a.stride % 2 == 0 && a.q_width % 2 == 0; }

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
  launch_kernel(mla_prep_kernel, dim3(rows.n, 2), 256, size_t(rope.dim) * 4, stream, a, rows, rope);
}

MlaScratchSize mla_scratch_size(int n_sm, int kv_lora) {
  MlaScratchSize z;
  z.target = 2 * n_sm;
  // A split launch has pairs < target (row, head group) pairs and ceil(target / pairs) splits each:
  // fewer than 2 · target blocks.
  z.blocks = 2 * z.target;
  z.part_floats = size_t(z.blocks) * kMlaHeads * size_t(kv_lora + 2);
  z.tickets = z.target;
  return z;
}

void launch_attention_mla(const MlaArgs& a, const RowInfo& rows, const float* q_lat, const float* q, int64_t q_stride,
                          const RopeTables& rope, float scale, float* o_lat, const MlaScratch& sc, bool fresh,
                          const KernelPolicy& p, cudaStream_t stream) {
  if (rows.n == 0) return;
  TANDEM_CUDA_REQUIRE(a.rope % 2 == 0 && a.rope == rope.dim && a.kv_lora % 2 == 0, "MLA widths must be even");
  TANDEM_CUDA_REQUIRE(!fresh || mla_fresh_applies(a), "MLA fresh rows: the projection's stride and q width must be even");
  TANDEM_CUDA_REQUIRE(a.kv_lora + a.rope <= kMlaMaxWidth, "kv_lora_rank + qk_rope_head_dim above 576");
  TANDEM_CUDA_REQUIRE(p.mla_min_chunk >= 1, "MLA split chunk: at least one position");
  const int groups = (a.n_head + kMlaHeads - 1) / kMlaHeads;
  const int pairs = rows.n * groups;
  int splits = 1;
  const MlaScratchSize& z = sc.size;
  if (sc.part && pairs < z.target) splits = std::min(kMaxMlaSplits, (z.target + pairs - 1) / pairs);
  TANDEM_CUDA_REQUIRE(splits == 1 || (pairs <= z.tickets && pairs * splits <= z.blocks), "MLA split scratch too small");
  const size_t smem = size_t(kMlaWarps) * kMlaHeads * size_t(a.kv_lora + 2) * 4;
  static_assert(size_t(kMlaWarps) * kMlaHeads * (kMlaMaxWidth + 2) * 4 <= 48 * 1024, "within the default shared memory");
  const dim3 grid(rows.n, groups, splits);
  auto go = [&](auto kernel) {
    launch_kernel(kernel, grid, kMlaThreads, smem, stream, a, rows, q_lat, q, q_stride, rope, scale, o_lat, sc, splits,
                  p.mla_min_chunk, fresh);
  };
  const int w2 = (a.kv_lora + a.rope) / 2;
  if (w2 <= kWarp) go(attention_mla_kernel<1>);
  else if (w2 <= 2 * kWarp) go(attention_mla_kernel<2>);
  else if (w2 <= 3 * kWarp) go(attention_mla_kernel<3>);
  else if (w2 <= 5 * kWarp) go(attention_mla_kernel<5>);
  else go(attention_mla_kernel<9>);
}

}  // namespace tandem::cuda
