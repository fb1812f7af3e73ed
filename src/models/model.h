// A loaded checkpoint: config plus typed, non-owning views of every weight the forward pass uses.
// Weights stay in the memory-mapped safetensors files (the TensorStore owns the mappings); nothing is
// widened to f32 here. One binding function per architecture (models/<arch>.cpp) maps the
// checkpoint's tensor names onto these fields and checks every shape.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "moe/experts.h"

namespace tandem {

struct AttentionWeights {
  // GQA (qwen3_moe, mixtral, olmoe)
  TensorView q;       // [n_head * head_dim, hidden]   (MLA without q_lora: [n_head * qk_head, hidden])
  TensorView k;       // [n_head_kv * head_dim, hidden]
  TensorView v;       // [n_head_kv * head_dim, hidden]
  TensorView q_norm;  // [head_dim] per head (qwen3_moe) or [n_head * head_dim] whole (olmoe); empty if none
  TensorView k_norm;  // [head_dim] or [n_head_kv * head_dim]; empty if none
  // MLA (deepseek_v3)
  TensorView q_a;        // [q_lora, hidden]
  TensorView q_a_norm;   // [q_lora]
  TensorView q_b;        // [n_head * (nope + rope), q_lora]
  TensorView kv_a;       // [kv_lora + rope, hidden]
  TensorView kv_a_norm;  // [kv_lora]
  TensorView kv_b;       // [n_head * (nope + v_head), kv_lora]
  // Both
  TensorView o;  // [hidden, n_head * v_width]
};

struct LayerWeights {
  TensorView attn_norm;  // [hidden]
  TensorView ffn_norm;   // [hidden]
  AttentionWeights attn;
  bool moe = false;
  ExpertWeights dense;                 // dense layers only
  TensorView router;                   // [n_expert, hidden]
  TensorView router_bias;              // [n_expert] (deepseek_v3 e_score_correction_bias); empty if none
  std::vector<ExpertWeights> experts;  // [n_expert]; an expert not loaded has empty views
  ExpertWeights shared;                // deepseek_v3 shared experts; empty if none
};

// Which routed experts to bind: all (default) or a subset per layer (the peer binds only its cold ones).
using ExpertFilter = std::function<bool(int64_t layer, int64_t expert)>;

struct Model {
  std::string dir;
  ModelConfig cfg;
  TensorStore store;
  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;
  // Weights this process made (cfg.quant.at_load: FP8 codes and scales of the routed experts); the
  // views in `layers` point into them.
  std::vector<std::unique_ptr<uint8_t[]>> owned;

  // Loads DIR (config.json + safetensors). Throws InputError naming the file/tensor/field.
  static std::unique_ptr<Model> load(const std::string& dir, const ExpertFilter& filter = nullptr);
  // Binds a config and an already opened store (tests, synth).
  static std::unique_ptr<Model> bind(ModelConfig cfg, TensorStore store, const std::string& dir,
                                     const ExpertFilter& filter = nullptr);
};

// Per-architecture binders (models/<arch>.cpp). Each fills model.layers from model.store.
void bind_qwen3_moe(Model& m, const ExpertFilter& filter);
void bind_mixtral(Model& m, const ExpertFilter& filter);
void bind_olmoe(Model& m, const ExpertFilter& filter);
void bind_deepseek_v3(Model& m, const ExpertFilter& filter);

// Shared binding blocks (models/model.cpp).
// A linear layer's weight [out, in]: float, or F8_E4M3 with its validated block scales (io/fp8_weights.h).
// Attention, dense-MLP and expert projections bind through this; embeddings, norms, routers and
// lm_head stay float (store.require).
TensorView bind_linear(const Model& m, const std::string& name, std::initializer_list<int64_t> shape);
void bind_gqa_attention(Model& m, int64_t layer, const std::string& prefix);  // q/k/v/o_proj
ExpertWeights bind_mlp(const Model& m, const std::string& prefix, const char* gate, const char* up,
                       const char* down, int64_t inter);
void bind_common(Model& m);  // embed, final norm, lm_head, per-layer norms
// cfg.quant.at_load (--weights fp8): every bound routed expert weight in a float dtype becomes
// F8_E4M3 with block scales (quantize_fp8_blocks) in m.owned. Run by bind() after the binder.
void quantize_experts_at_load(Model& m);
// The routed experts of MoE layer `layer` under `prefix` (e.g. "model.layers.3.mlp.experts."), each
// "<prefix><e>.<gate|up|down>.weight"; experts the filter rejects stay unbound.
void bind_routed_experts(Model& m, int64_t layer, const std::string& prefix, const char* gate, const char* up,
                         const char* down, const ExpertFilter& filter);

}  // namespace tandem
