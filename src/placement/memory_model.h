// What the primary holds, in bytes: non-expert weights, shared experts, hot routed experts, the KV
// cache and a reserve. The planner trades hot experts against KV capacity with it; `tandem info`
// prints model_bytes(). Formulas (and the tensor-name classification) are in docs/placement.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "io/config.h"
#include "placement/fingerprint.h"

namespace tandem {

class TensorStore;

// Parses "80GiB", "12.5GB", "512MiB", "4096" (bytes), "1.5 TiB". Units: B, KB/MB/GB/TB (powers of
// 1000), KiB/MiB/GiB/TiB (powers of 1024); case-insensitive. Anything else is an InputError naming `what`.
uint64_t parse_size(std::string_view text, std::string_view what = "size");
// "1.50 GiB", "512.00 MiB", "100 B".
std::string format_bytes(uint64_t bytes);

// Weight bytes of a model by part. routed_experts counts every routed expert of every MoE layer.
struct ModelBytes {
  uint64_t embeddings = 0;      // token embedding table
  uint64_t output_head = 0;     // lm_head (0 when tied to the embeddings)
  uint64_t attention = 0;       // attention projections of all layers (MLA low-rank parts included)
  uint64_t norms = 0;           // every RMSNorm weight (layer norms, q/k norms, MLA a-norms, final norm)
  uint64_t dense_mlp = 0;       // MLPs of the non-MoE layers
  uint64_t routers = 0;         // router weights (+ selection bias)
  uint64_t shared_experts = 0;  // shared experts of all MoE layers
  uint64_t routed_experts = 0;  // all routed experts
  uint64_t other = 0;           // tensors of used layers not recognised by name (tensor-based count only)
  uint64_t unused = 0;          // tensors of layers >= n_layer (e.g. DeepSeek's MTP layer): not loaded
  uint64_t expert_bytes = 0;    // one routed expert (gate + up + down)
  int64_t n_moe_layer = 0;
  int64_t n_expert = 0;

  // Everything the primary holds whatever the rowmap: all but the routed experts (and unused).
  uint64_t primary_fixed() const {
    return embeddings + output_head + attention + norms + dense_mlp + routers + shared_experts + other;
  }
  uint64_t total() const { return primary_fixed() + routed_experts; }
};

// From the config alone, every weight stored as weight_dtype. No biases (none of the supported
// architectures has attention or MLP biases).
ModelBytes model_bytes(const ModelConfig& cfg, DType weight_dtype);
// From the checkpoint's tensors (exact bytes), classified by name; expert_bytes = routed bytes /
// (n_moe_layer × n_expert), rounded up.
ModelBytes model_bytes(const ModelConfig& cfg, const std::vector<TensorMeta>& tensors);
ModelBytes model_bytes(const ModelConfig& cfg, const TensorStore& store);

// Elements of KV cache per token and layer: GQA 2·n_head_kv·head_dim; MLA kv_lora_rank + qk_rope_head_dim
// (the compressed latent and the shared rope key). Same as ModelConfig::kv_floats_per_token_layer().
int64_t kv_elements_per_token_layer(const ModelConfig& cfg);
// Bytes of KV cache per token over all layers at kv_dtype.
uint64_t kv_bytes_per_token(const ModelConfig& cfg, DType kv_dtype);

inline constexpr uint64_t kDefaultReserve = 1ull << 30;  // 1 GiB: activations, workspaces, CUDA context

// primary = fixed + hot · expert_bytes + kv_tokens · kv_bytes_per_token + reserve must hold.
struct MemoryModel {
  ModelBytes bytes;
  uint64_t primary_bytes = 0;
  uint64_t reserve_bytes = kDefaultReserve;
  uint64_t kv_bytes_per_token = 0;

  // Bytes left for hot experts and KV: primary − fixed − reserve (negative when those do not fit).
  int64_t free_bytes() const;
  // KV capacity in tokens next to n_hot hot experts in all; -1 when they do not fit.
  int64_t kv_tokens(int64_t n_hot) const;
  // The most hot experts (in all, at most n_moe_layer × n_expert) that fit next to kv_tokens of KV;
  // -1 when not even zero fit.
  int64_t max_hot(int64_t kv_tokens) const;
};

}  // namespace tandem
