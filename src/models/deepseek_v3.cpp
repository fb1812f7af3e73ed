// deepseek_v3: multi-head latent attention (low-rank or direct q, compressed kv with its norm, a
// decoupled rotary part), sigmoid router with a selection-only correction bias and group-limited
// top-k, routed scaling, one fused shared-expert MLP, dense layers before first_k_dense_replace.
#include <fmt/format.h>

#include "models/model.h"

namespace tandem {

void bind_deepseek_v3(Model& m, const ExpertFilter& filter) {
  const auto& c = m.cfg;
  const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto& L = m.layers[size_t(l)];
    auto& a = L.attn;
    std::string p = fmt::format("model.layers.{}.", l);
    std::string s = p + "self_attn.";
    if (c.q_lora_rank > 0) {
      a.q_a = bind_linear(m, s + "q_a_proj.weight", {c.q_lora_rank, c.hidden_size});
      a.q_a_norm = m.store.require(s + "q_a_layernorm.weight", {c.q_lora_rank});
      a.q_b = bind_linear(m, s + "q_b_proj.weight", {c.n_head * qk_head, c.q_lora_rank});
    } else {
      a.q = bind_linear(m, s + "q_proj.weight", {c.n_head * qk_head, c.hidden_size});
    }
    a.kv_a = bind_linear(m, s + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size});
    a.kv_a_norm = m.store.require(s + "kv_a_layernorm.weight", {c.kv_lora_rank});
    a.kv_b = bind_linear(m, s + "kv_b_proj.weight", {c.n_head * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
    a.o = bind_linear(m, s + "o_proj.weight", {c.hidden_size, c.n_head * c.v_head_dim});
    if (!L.moe) {
      L.dense = bind_mlp(m, p + "mlp.", "gate_proj", "up_proj", "down_proj", c.intermediate_size);
      continue;
    }
    L.router = m.store.require(p + "mlp.gate.weight", {c.n_expert, c.hidden_size});
    L.router_bias = m.store.require(p + "mlp.gate.e_score_correction_bias", {c.n_expert});
    bind_routed_experts(m, l, p + "mlp.experts.", "gate_proj", "up_proj", "down_proj", filter);
    if (c.n_shared_expert > 0)
      L.shared = bind_mlp(m, p + "mlp.shared_experts.", "gate_proj", "up_proj", "down_proj",
                          c.shared_intermediate_size());
  }
}

}  // namespace tandem
