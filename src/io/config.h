// config.json of a Hugging Face MoE checkpoint, mapped once into one arch-neutral struct.
// Supported model_type: qwen3_moe, mixtral, olmoe, deepseek_v3. Every field the forward pass needs
// is filled here (defaults as transformers applies them); a required field that is missing or of
// the wrong type is an InputError naming the file and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class Arch { kQwen3Moe, kMixtral, kOlmoe, kDeepseekV3 };
enum class RouterKind {
  kSoftmaxTopK,       // softmax over all experts, top-k, optional renormalisation (qwen3_moe, mixtral, olmoe)
  kSigmoidGroupTopK,  // sigmoid scores, + correction bias for selection only, group-limited top-k (deepseek_v3)
};
enum class QkNorm { kNone, kPerHead, kWhole };  // per head_dim (qwen3_moe) or over the projection (olmoe)
enum class RopeType { kDefault, kLinear, kYarn };

std::string_view arch_name(Arch a);
// "qwen3_moe, mixtral, olmoe, deepseek_v3"
std::string supported_model_types();

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // yarn (deepseek_v3 checkpoints on the hub)
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // 0: derived from mscale / mscale_all_dim
  bool truncate = true;
};

// quantization_config of a fine-grained FP8 checkpoint (DeepSeek-V3, Qwen3 FP8): quant_method "fp8",
// fmt "e4m3", weight_block_size [rows, cols]. Which tensors are FP8 comes from the files' dtypes; this
// gives the size of their scale blocks. Absent (fp8 false): an F8_E4M3 tensor is an error.
struct QuantConfig {
  bool fp8 = false;
  int64_t block_rows = 0, block_cols = 0;
  // --weights fp8: routed experts stored in a float dtype are quantized to this format as they load
  // (block_rows x block_cols: the checkpoint's own, else 128 x 128). Part of the model's fingerprint.
  bool at_load = false;
};


struct ModelConfig {
  Arch arch = Arch::kQwen3Moe;
  std::string model_type;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // GQA: per-head q/k/v width
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  QkNorm qk_norm = QkNorm::kNone;
  double clip_qkv = 0.0;  // olmoe: clamp q, k, v to [-clip, clip] when > 0

  // MLA (deepseek_v3). q_lora_rank == 0: q_proj directly.
  bool mla = false;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = false;

  // Feed-forward.
  int64_t intermediate_size = 0;       // dense layers
  int64_t moe_intermediate_size = 0;   // one routed expert
  int64_t n_expert = 0;                // routed experts per MoE layer
  int64_t n_expert_used = 0;           // top-k
  int64_t n_shared_expert = 0;         // deepseek_v3: one fused shared MLP of moe_intermediate * n_shared
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  RouterKind router = RouterKind::kSoftmaxTopK;
  std::vector<bool> layer_is_moe;      // [n_layer]

  QuantConfig quant;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  int64_t n_moe_layers() const;
  int64_t shared_intermediate_size() const { return moe_intermediate_size * n_shared_expert; }
  // Softmax scale of attention (1/sqrt(qk head dim), times the yarn mscale² for deepseek yarn).
  double attn_scale() const;
  // YaRN's multiplier on cos/sin (1 for other rope types).
  double rope_attention_factor() const;
  // Per token and layer, floats of KV cache: GQA 2 * n_head_kv * head_dim; MLA kv_lora_rank + qk_rope_head_dim.
  int64_t kv_floats_per_token_layer() const;
};

// Parses config.json content. `source` names the file in errors.
ModelConfig parse_config(const nlohmann::json& j, std::string_view source);
// Reads DIR/config.json (or a path to a .json file).
ModelConfig load_config(const std::string& path);
// Applies a --weights value to a loaded config: "checkpoint" (as stored) or "fp8" (QuantConfig::at_load).
// InputError naming the flag otherwise.
void apply_weights_option(ModelConfig& cfg, const std::string& weights);

}  // namespace tandem
