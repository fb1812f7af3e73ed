// Rotary position embedding tables and application, as transformers computes them in float32:
// inv_freq (default, linear or YaRN), cos/sin of pos · inv_freq (times YaRN's attention factor),
// rotate-half layout, and DeepSeek's interleaved variant (de-interleave, then rotate-half).
#pragma once

#include <cstdint>
#include <vector>

#include "io/config.h"

namespace tandem {

class Rope {
 public:
  Rope() = default;
  Rope(const ModelConfig& cfg, int64_t dim);  // dim: rotary width (head_dim, or qk_rope_head_dim for MLA)
  // Rotates n_heads consecutive vectors of width dim at `x` (stride dim) for position pos.
  void apply(float* x, int64_t n_heads, int64_t pos, bool interleaved) const;
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_ = 0;
  float attention_factor_ = 1.0f;
  std::vector<float> inv_freq_;  // [dim / 2]
};

}  // namespace tandem
