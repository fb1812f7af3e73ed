// Attention on the GPU, prefill and decode alike (a row attends to positions 0..pos of its own
// sequence, whose keys were written to the cache by the prep kernel of the same step):
//  - GQA: prep (clip, q/k RMSNorm, RoPE, K/V cache write) and attention over the f32 K/V cache;
//  - MLA, absorbed form as the CPU engine: the cache holds per token the normalised latent [kv_lora]
//    and the rotary key [rope]; q_nope is pulled into latent space through W_uk (a batched
//    launch_linear over heads on a transposed copy of it), attention runs there, and the latent
//    output is expanded by W_uv (another batched launch_linear).
// Positions and sequence slots are read from device memory, so a captured graph serves every step.
// KV cache layout: [slots, ctx, width] per layer (GQA keeps K and V in two such arrays).
#pragma once

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernel_policy.h"

namespace tandem::cuda {

// Rotary tables and the per-row position/sequence of one step.
struct RowInfo {
  const int32_t* pos = nullptr;  // [n] position of each row
  const int32_t* seq = nullptr;  // [n] cache slot of each row
  int n = 0;
  int ctx = 0;  // cache capacity per slot (positions)
};
struct RopeTables {
  const float* cos = nullptr;  // [ctx, dim / 2] (YaRN attention factor included)
  const float* sin = nullptr;  // [ctx, dim / 2]
  int dim = 0;
  bool interleaved = false;  // DeepSeek: de-interleave, then rotate-half
};

struct GqaPrepArgs {
  float* qkv = nullptr;  // [n, stride]: q [n_head * hd] | k [n_head_kv * hd] | v [n_head_kv * hd]
  int64_t stride = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float clip = 0.0f;      // > 0: clamp q, k, v to [-clip, clip]
  int qk_norm = 0;        // 0 none, 1 per head (w: [hd]), 2 whole projection (w: [n_head * hd] / [n_kv * hd])
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
  float* k_cache = nullptr;  // [slots, ctx, n_head_kv * hd]
  float* v_cache = nullptr;
};
void launch_gqa_prep(const GqaPrepArgs& a, const RowInfo& rows, const RopeTables& rope, cudaStream_t stream);

// out[r, head * hd ...] = softmax(q k_tᵀ · scale) v over t ≤ pos[r]. out: [n, n_head * hd].
void launch_attention_gqa(const GqaPrepArgs& a, const RowInfo& rows, float scale, float* out,
                          cudaStream_t stream);

struct MlaArgs {
  float* fused = nullptr;  // [n, stride]: q_a or q [q_width] | latent [kv_lora] | k_rope [rope]
  int64_t stride = 0;
  int q_width = 0;         // q_lora_rank (normalised here in place) or n_head * qk when q_lora is 0
  bool q_lora = false;
  const float* q_a_norm = nullptr;   // [q_lora]
  const float* kv_a_norm = nullptr;  // [kv_lora]
  float eps = 0.0f;
  int n_head = 0, nope = 0, rope = 0, v_dim = 0, kv_lora = 0;
  float* cache = nullptr;  // [slots, ctx, kv_lora + rope]
};
// Normalises q_a (when q_lora) in place; writes the normalised latent and the rotated key to the cache.
void launch_mla_prep(const MlaArgs& a, const RowInfo& rows, const RopeTables& rope, cudaStream_t stream);

// MLA attention: heads per block (one warp each), and the most blocks one row's positions are split
// over. kv_lora + rope must be even and at most 576 (DeepSeek V3's 512 + 64).
constexpr int kMlaHeads = 4;
constexpr int kMaxMlaSplits = 16;
constexpr int kMlaMaxWidth = 576;  // kv_lora + rope
// Where split blocks leave their partial results: part [blocks][kMlaHeads][kv_lora + 2] floats and
// tickets [tickets] ints, zero before the first launch (each launch leaves them zero). A launch splits
// a row's positions over several blocks only when the step has fewer than `target` (row, head group)
// pairs; null `part`: never.
struct MlaScratchSize {
  size_t part_floats = 0;
  int blocks = 0, tickets = 0, target = 0;
};
// What MlaScratch needs on a device of n_sm multiprocessors (target: two blocks per multiprocessor).
MlaScratchSize mla_scratch_size(int n_sm, int kv_lora);
struct MlaScratch {
  float* part = nullptr;  // [size.part_floats]
  int* tickets = nullptr;  // [size.tickets]
  MlaScratchSize size;
};

// o_lat: [n, n_head, kv_lora] = Σ_t softmax((q_lat·c_t + rot(q_rope)·k_t) · scale) c_t over t ≤ pos.
// q_lat: [n, n_head, kv_lora] (q_nope absorbed through W_uk); q: the query rows [n, n_head · (nope +
// rope)], q_stride apart, whose rope parts are rotated here at each row's position.
// fresh: each row's own position is taken from a.fused (its latent normalised, its key rotated, as
// launch_mla_prep does) and written to the cache here, so the step needs no mla_prep launch for the
// cache (q_a's norm then belongs to q_b's projection). Only for steps whose rows are each the only
// row of their sequence (decode: no row reads another row's new position) and mla_fresh_applies(a);
// whether a decode step takes it is the caller's choice (KernelPolicy::mla_fresh_rows; off, mla_prep
// normalises q_a in place and writes the cache, as prefill does).
// A split block takes at least p.mla_min_chunk positions (fewer: more blocks, each with a shorter
// serial run over its positions); a captured graph keeps what it was captured with.
void launch_attention_mla(const MlaArgs& a, const RowInfo& rows, const float* q_lat, const float* q, int64_t q_stride,
                          const RopeTables& rope, float scale, float* o_lat, const MlaScratch& sc, bool fresh,
                          const KernelPolicy& p, cudaStream_t stream);
bool mla_fresh_applies(const MlaArgs& a);  // float2 loads of the latent: stride and q_width even

// Largest cache capacity (positions) the GQA attention kernel accepts (its scores live in shared
// memory; MLA has no such bound).
int max_gqa_ctx();

}  // namespace tandem::cuda
