// The local lane's executor (see executor.h).
#include "moe/executor.h"

#include "models/model.h"

namespace tandem {

void LocalExperts::run(int64_t layer, const float* x, int64_t n_rows, const Routing& routing, float* out) {
  const auto& experts = model_.layers[size_t(layer)].experts;
  run_experts_cpu(experts, x, n_rows, model_.cfg.hidden_size, routing.ids.data(), routing.weights.data(),
                  routing.k, out, pool_);
}

}  // namespace tandem
