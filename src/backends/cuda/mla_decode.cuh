// MLA decode steps of a few rows in one launch: q_b (with q_a's RMSNorm in front), the absorption of
// q_nope through W_uk, attention over the latent cache (the row's new entry built inside, as the
// `fresh` path of launch_attention_mla) and the expansion by W_uv — four dependent launches of the
// unfused path (three projections and attention) become one. Each (row, head) is a cluster of
// mla_decode_cluster() blocks (sm_90 thread block clusters; 4 by default) that split every stage
// between them and trade the intermediate vectors through distributed shared memory: each block
// computes its share of the
// head's q, then of q_lat, attends over its share of the positions, and after the blocks' partial
// softmax sums are combined (in block order, so every block holds the same o_lat) computes its share
// of the head's output. Three cluster barriers replace three kernel boundaries, and every block
// reads only its share of the head's q_b, W_uk and W_uv rows, which the copy engine brings into
// its shared memory (bulk copies) from the kernel's first instruction on. Why it is the default at one
// row: bench/RESULTS.md, "Fused MLA decode".
#pragma once

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_common.cuh"

namespace tandem::cuda {

// Blocks per (row, head) where the policy's cluster (KernelPolicy::mla_cluster) would need more shared
// memory a block than kMlaDecodeMaxSmem: the portable cluster size.
constexpr int kMlaCluster = 8;

struct MlaDecodeArgs {
  MlaArgs a;                   // a.fused as the input projection wrote it (q_a and the latent not normalised)
  const void* q_b = nullptr;   // [n_head * (nope + rope), q_width] in wt
  const void* uk_t = nullptr;  // [n_head * kv_lora, nope] in wt: W_uk per head, transposed
  const void* kv_b = nullptr;  // [n_head * (nope + v_dim), kv_lora] in wt: W_uv is rows nope .. nope + v_dim of each head
  WType wt = WType::kF32;
  float* out = nullptr;        // [n, n_head * v_dim]: the attention output, o_proj's input
  int64_t out_stride = 0;
  L2Prefetch after;            // weights of later kernels, asked of L2 once q_b's rows are in (HBM is idle then)
};

// Whether the fused kernel takes a layer of these shapes with weights in wt: q_lora (a q_b
// projection), the fresh path's conditions (mla_fresh_applies), kv_lora + rope even and at most
// kMlaMaxWidth, rows of q_b, W_uk and W_uv in whole 16-byte copies, and its shared memory (the
// block's weight slices and vectors, mla_decode_smem) at most kMlaDecodeMaxSmem at the cluster size
// the launch takes (mla_decode_cluster).
constexpr size_t kMlaDecodeMaxSmem = 200 * 1024;
size_t mla_decode_smem(const MlaArgs& a, WType wt, int cluster);
// Blocks per (row, head) cluster: p.mla_cluster (4 or 8) where a block of that size fits
// kMlaDecodeMaxSmem, else kMlaCluster. Fewer blocks hold more of the head's weights each; results
// differ in f32 rounding (the softmax partials combine in another grouping).
int mla_decode_cluster(const MlaArgs& a, WType wt, const KernelPolicy& p);
bool mla_decode_applies(const MlaArgs& a, WType wt, const KernelPolicy& p);

// out[r, head · v_dim ...] = W_uv[head] · attention(q_lat, q_rope) for every row r of a decode step
// (each row the only row of its sequence: rows.pos[r] is its own new position, written to the cache
// here). The same function as launch_linear(q_b, fused norm) → launch_linear(W_uk) →
// launch_attention_mla(fresh) → launch_linear(W_uv), within f32 rounding (sums in other orders).
// Which decode steps take it is the caller's choice (KernelPolicy::mla_fused_rows).
void launch_mla_decode(const MlaDecodeArgs& d, const RowInfo& rows, const RopeTables& rope, float scale,
                       const KernelPolicy& p, cudaStream_t stream);

// Rows whose position reaches this take the unfused path (the engine keys its graphs by it): each
// head's cluster reads the whole context once, 4× the cache reads of attention_mla_kernel's groups
// of 4 heads, which costs more than the saved launches at long contexts.
constexpr int kMlaFusedMaxPos = 1024;

}  // namespace tandem::cuda
