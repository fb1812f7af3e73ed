// Token sampling from logits: greedy (temperature 0), or temperature with top-k and top-p, seeded.
// Greedy picks the lowest id among equal maxima (as torch.argmax does).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace tandem {

struct SamplerParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: all
  float top_p = 1.0f;        // 1: all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams params);  // InputError on invalid parameters
  int32_t sample(const float* logits, int64_t vocab);
  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

int32_t argmax(const float* logits, int64_t n);

}  // namespace tandem
