// Routers (see router.h). Selection is a stable partial sort on (score desc, id asc), so ties are
// deterministic; the reference's torch.topk agrees on untied scores.
#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem {

namespace {

// Indices of the k largest values of v[0..n) (restricted to `allowed` when given), largest first.
void top_k(const float* v, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  idx.resize(size_t(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [v](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  idx.resize(size_t(k));
}

void route_softmax(const ModelConfig& c, const float* logits, int64_t n_rows, Routing& r) {
  const int64_t n = c.n_expert, k = c.n_expert_used;
  std::vector<float> p(static_cast<size_t>(n));
  std::vector<int32_t> idx;
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* l = logits + row * n;
    float mx = *std::max_element(l, l + n);
    float sum = 0.0f;
    for (int64_t e = 0; e < n; ++e) sum += (p[size_t(e)] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < n; ++e) p[size_t(e)] /= sum;
    top_k(p.data(), n, k, idx);
    float ksum = 0.0f;
    for (int64_t j = 0; j < k; ++j) ksum += p[size_t(idx[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      r.ids[size_t(row * k + j)] = idx[size_t(j)];
      float w = p[size_t(idx[size_t(j)])];
      r.weights[size_t(row * k + j)] = c.norm_topk_prob ? w / ksum : w;
    }
  }
}

void route_sigmoid_group(const ModelConfig& c, const float* logits, int64_t n_rows, const TensorView& bias,
                         Routing& r) {
  const int64_t n = c.n_expert, k = c.n_expert_used, groups = c.n_group, per_group = n / groups;
  std::vector<float> score(static_cast<size_t>(n)), choice(static_cast<size_t>(n)), masked(static_cast<size_t>(n)),
      group_score(static_cast<size_t>(groups));
  std::vector<int32_t> group_idx, idx, pair;
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* l = logits + row * n;
    for (int64_t e = 0; e < n; ++e) {
      score[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[size_t(e)] = score[size_t(e)] + (bias.empty() ? 0.0f : load_f32(bias, e));
    }
    // Group score: sum of the two best choice scores in the group (one when a group has one expert).
    for (int64_t g = 0; g < groups; ++g) {
      int64_t take = std::min<int64_t>(2, per_group);
      top_k(choice.data() + g * per_group, per_group, take, pair);
      float s = 0.0f;
      for (int64_t j = 0; j < take; ++j) s += choice[size_t(g * per_group + pair[size_t(j)])];
      group_score[size_t(g)] = s;
    }
    top_k(group_score.data(), groups, c.topk_group, group_idx);
    // Experts outside the chosen groups score 0 (the reference masks with 0.0, not -inf).
    std::fill(masked.begin(), masked.end(), 0.0f);
    for (int32_t g : group_idx)
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) masked[size_t(e)] = choice[size_t(e)];
    top_k(masked.data(), n, k, idx);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += score[size_t(idx[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      float w = score[size_t(idx[size_t(j)])];
      if (c.norm_topk_prob) w /= (sum + 1e-20f);
      r.ids[size_t(row * k + j)] = idx[size_t(j)];
      r.weights[size_t(row * k + j)] = float(w * c.routed_scaling_factor);
    }
  }
}

}  // namespace

void route(const ModelConfig& cfg, const float* logits, int64_t n_rows, const TensorView& bias, Routing& routing) {
  routing.n_rows = n_rows;
  routing.k = cfg.n_expert_used;
  routing.ids.resize(size_t(n_rows * routing.k));
  routing.weights.resize(size_t(n_rows * routing.k));
  switch (cfg.router) {
    case RouterKind::kSoftmaxTopK: route_softmax(cfg, logits, n_rows, routing); break;
    case RouterKind::kSigmoidGroupTopK: route_sigmoid_group(cfg, logits, n_rows, bias, routing); break;
  }
}

}  // namespace tandem
