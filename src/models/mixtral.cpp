// mixtral: GQA without q/k norm, softmax top-k router with renormalisation (softmax over the top-k
// logits), experts under block_sparse_moe.experts.N.w1 (gate) / w3 (up) / w2 (down).
#include <fmt/format.h>

#include "models/model.h"

namespace tandem {

void bind_mixtral(Model& m, const ExpertFilter& filter) {
  const auto& c = m.cfg;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto& L = m.layers[size_t(l)];
    std::string p = fmt::format("model.layers.{}.", l);
    bind_gqa_attention(m, l, p + "self_attn.");
    L.router = m.store.require(p + "block_sparse_moe.gate.weight", {c.n_expert, c.hidden_size});
    bind_routed_experts(m, l, p + "block_sparse_moe.experts.", "w1", "w3", "w2", filter);
  }
}

}  // namespace tandem
