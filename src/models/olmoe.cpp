// olmoe: GQA with RMSNorm over the whole q and k projections (before the head split), optional
// clip_qkv, softmax top-k router without renormalisation by default.
#include <fmt/format.h>

#include "models/model.h"

namespace tandem {

void bind_olmoe(Model& m, const ExpertFilter& filter) {
  const auto& c = m.cfg;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto& L = m.layers[size_t(l)];
    std::string p = fmt::format("model.layers.{}.", l);
    bind_gqa_attention(m, l, p + "self_attn.");
    L.attn.q_norm = m.store.require(p + "self_attn.q_norm.weight", {c.n_head * c.head_dim});
    L.attn.k_norm = m.store.require(p + "self_attn.k_norm.weight", {c.n_head_kv * c.head_dim});
    L.router = m.store.require(p + "mlp.gate.weight", {c.n_expert, c.hidden_size});
    bind_routed_experts(m, l, p + "mlp.experts.", "gate_proj", "up_proj", "down_proj", filter);
  }
}

}  // namespace tandem
