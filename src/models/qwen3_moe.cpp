// qwen3_moe: GQA with a per-head RMSNorm on q and k, softmax top-k router (optionally renormalised),
// dense layers where mlp_only_layers / decoder_sparse_step say so. Names as on the hub.
#include <fmt/format.h>

#include "models/model.h"

namespace tandem {

void bind_qwen3_moe(Model& m, const ExpertFilter& filter) {
  const auto& c = m.cfg;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto& L = m.layers[size_t(l)];
    std::string p = fmt::format("model.layers.{}.", l);
    bind_gqa_attention(m, l, p + "self_attn.");
    L.attn.q_norm = m.store.require(p + "self_attn.q_norm.weight", {c.head_dim});
    L.attn.k_norm = m.store.require(p + "self_attn.k_norm.weight", {c.head_dim});
    if (!L.moe) {
      L.dense = bind_mlp(m, p + "mlp.", "gate_proj", "up_proj", "down_proj", c.intermediate_size);
      continue;
    }
    L.router = m.store.require(p + "mlp.gate.weight", {c.n_expert, c.hidden_size});
    bind_routed_experts(m, l, p + "mlp.experts.", "gate_proj", "up_proj", "down_proj", filter);
  }
}

}  // namespace tandem
