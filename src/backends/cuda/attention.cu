// Attention kernels (see attention.cuh). Scores of one (row, head) live in shared memory; softmax
// follows the CPU: max, exp, sum, multiply by 1/sum, then the weighted sum of values.
#include "backends/cuda/attention.cuh"
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

template <class T>
__global__ void mla_q_kernel(MlaArgs a, const float* q, int64_t q_stride, const T* kv_b, RowInfo rows,
                             RopeTables rope, float* q_lat, float* q_rope) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [nope + rope] q of this head, then [rope] scratch
  const int r = blockIdx.x, head = blockIdx.y;
  const int qk = a.nope + a.rope;
  const float* qh = q + int64_t(r) * q_stride + head * qk;
  float* qs = sm;
  for (int i = threadIdx.x; i < qk; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();
  block_rope(qs + a.nope, rows.pos[r], rope, sm + qk);
  float* qr = q_rope + (int64_t(r) * a.n_head + head) * a.rope;
  if (blockIdx.z == 0)
    for (int i = threadIdx.x; i < a.rope; i += blockDim.x) qr[i] = qs[a.nope + i];
  const T* w = kv_b + int64_t(head) * (a.nope + a.v_dim) * a.kv_lora;
  float* ql = q_lat + (int64_t(r) * a.n_head + head) * a.kv_lora;
  for (int c = blockIdx.z * blockDim.x + threadIdx.x; c < a.kv_lora; c += gridDim.z * blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int d = 0; d < a.nope; ++d) acc += qs[d] * to_f32(w[int64_t(d) * a.kv_lora + c]);
    ql[c] = acc;
  }
}

__global__ void attention_mla_kernel(MlaArgs a, RowInfo rows, const float* q_lat, const float* q_rope,
                                     float scale, float* o_lat) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float red[32];
  extern __shared__ float sm[];  // [kv_lora] q_lat | [rope] q_rope | [T] scores
  const int r = blockIdx.x, head = blockIdx.y;
  const int L = a.kv_lora, R = a.rope, W = L + R;
  const int T = rows.pos[r] + 1;
  float* ql = sm;
  float* qr = sm + L;
  float* p = sm + L + R;
  for (int i = threadIdx.x; i < L; i += blockDim.x) ql[i] = q_lat[(int64_t(r) * a.n_head + head) * L + i];
  for (int i = threadIdx.x; i < R; i += blockDim.x) qr[i] = q_rope[(int64_t(r) * a.n_head + head) * R + i];
  __syncthreads();
  const float* cache = a.cache + int64_t(rows.seq[r]) * rows.ctx * W;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  for (int t = warp; t < T; t += nw) {
    const float* ct = cache + int64_t(t) * W;
    float s1 = 0.0f, s2 = 0.0f;
    for (int d = lane; d < L; d += kWarp) s1 += ql[d] * ct[d];
    for (int d = lane; d < R; d += kWarp) s2 += qr[d] * ct[L + d];
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if (lane == 0) p[t] = (s1 + s2) * scale;
  }
  __syncthreads();
  block_softmax(p, T, red);
  float* o = o_lat + (int64_t(r) * a.n_head + head) * L;
  for (int c = threadIdx.x; c < L; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 4
    for (int t = 0; t < T; ++t) acc += p[t] * cache[int64_t(t) * W + c];
    o[c] = acc;
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

void launch_mla_q(const MlaArgs& a, const float* q, int64_t q_stride, const void* kv_b, WType wt,
                  const RowInfo& rows, const RopeTables& rope, float* q_lat, float* q_rope, cudaStream_t stream) {
  if (rows.n == 0) return;
  const size_t smem = size_t(a.nope + 2 * a.rope) * 4;
  dim3 grid(rows.n, a.n_head, (a.kv_lora + 127) / 128);  // one latent column per thread
  switch (wt) {
    case WType::kF32:
      launch_kernel(mla_q_kernel<float>, grid, 128, smem, stream, a, q, q_stride, static_cast<const float*>(kv_b),
                    rows, rope, q_lat, q_rope);
      break;
    case WType::kBF16:
      launch_kernel(mla_q_kernel<__nv_bfloat16>, grid, 128, smem, stream, a, q, q_stride,
                    static_cast<const __nv_bfloat16*>(kv_b), rows, rope, q_lat, q_rope);
      break;
    case WType::kF16:
      launch_kernel(mla_q_kernel<__half>, grid, 128, smem, stream, a, q, q_stride, static_cast<const __half*>(kv_b),
                    rows, rope, q_lat, q_rope);
      break;
  }
}

void launch_attention_mla(const MlaArgs& a, const RowInfo& rows, const float* q_lat, const float* q_rope,
                          float scale, float* o_lat, cudaStream_t stream) {
  if (rows.n == 0) return;
  const size_t smem = size_t(a.kv_lora + a.rope + rows.ctx) * 4;
  allow_smem(attention_mla_kernel, smem);
  launch_kernel(attention_mla_kernel, dim3(rows.n, a.n_head), kAttnThreads, smem, stream, a, rows, q_lat, q_rope,
                scale, o_lat);
}

}  // namespace tandem::cuda
