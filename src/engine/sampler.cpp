// Sampling (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

Sampler::Sampler(SamplerParams params) : params_(params), rng_(params.seed) {
  if (!(params_.temperature >= 0.0f) || !std::isfinite(params_.temperature))
    fail("temperature must be >= 0, got {}", params_.temperature);
  if (params_.top_k < 0) fail("top-k must be >= 0, got {}", params_.top_k);
  if (!(params_.top_p > 0.0f && params_.top_p <= 1.0f)) fail("top-p must be in (0, 1], got {}", params_.top_p);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0f) return argmax(logits, vocab);
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i] / params_.temperature, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
  cand_.resize(size_t(keep));
  // Softmax over the kept candidates (sorted, largest first).
  const float mx = cand_[0].first;
  double sum = 0.0;
  for (auto& c : cand_) sum += (c.first = std::exp(c.first - mx));
  for (auto& c : cand_) c.first = float(c.first / sum);
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < cand_.size()) {
      cum += cand_[n++].first;
      if (cum >= params_.top_p) break;
    }
    cand_.resize(n);
    double s = 0.0;
    for (auto& c : cand_) s += c.first;
    for (auto& c : cand_) c.first = float(c.first / s);
  }
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0.0;
  for (const auto& c : cand_) {
    cum += c.first;
    if (u < cum) return c.second;
  }
  return cand_.back().second;
}

}  // namespace tandem
