// Routed-expert execution on the CPU (see experts.h). Rows are grouped by expert so each touched
// expert's weights are streamed once per call, however many rows use it.
#include "moe/experts.h"

#include <algorithm>

#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace tandem {

void run_mlp_cpu(const ExpertWeights& mlp, const float* x, int64_t n_rows, int64_t hidden, float* out,
                 ThreadPool& pool) {
  const int64_t inter = mlp.gate.rows();
  std::vector<float> g(size_t(n_rows * inter)), u(size_t(n_rows * inter));
  cpu::matmul(x, n_rows, mlp.gate, g.data(), pool);
  cpu::matmul(x, n_rows, mlp.up, u.data(), pool);
  cpu::silu_mul(g.data(), u.data(), n_rows * inter);
  cpu::matmul(g.data(), n_rows, mlp.down, out, pool);
}

void run_experts_cpu(std::span<const ExpertWeights> experts, const float* x, int64_t n_rows, int64_t hidden,
                     const int32_t* ids, const float* weights, int64_t k, float* out, ThreadPool& pool) {
  std::fill(out, out + n_rows * hidden, 0.0f);
  // Group (row, slot) pairs by expert.
  std::vector<std::vector<int64_t>> by_expert(experts.size());
  for (int64_t i = 0; i < n_rows * k; ++i) {
    int32_t e = ids[i];
    if (e < 0) continue;
    TANDEM_ASSERT(size_t(e) < experts.size() && experts[size_t(e)].present(), "expert {} not present", e);
    by_expert[size_t(e)].push_back(i);
  }
  std::vector<float> xs, ys;
  for (size_t e = 0; e < experts.size(); ++e) {
    const auto& slots = by_expert[e];
    if (slots.empty()) continue;
    const int64_t m = int64_t(slots.size());
    xs.resize(size_t(m * hidden));
    ys.resize(size_t(m * hidden));
    for (int64_t i = 0; i < m; ++i) {
      int64_t row = slots[size_t(i)] / k;
      std::copy(x + row * hidden, x + (row + 1) * hidden, xs.begin() + i * hidden);
    }
    run_mlp_cpu(experts[e], xs.data(), m, hidden, ys.data(), pool);
    for (int64_t i = 0; i < m; ++i) {
      int64_t slot = slots[size_t(i)];
      int64_t row = slot / k;
      float w = weights[slot];
      float* o = out + row * hidden;
      const float* y = ys.data() + i * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += w * y[h];
    }
  }
}

}  // namespace tandem
