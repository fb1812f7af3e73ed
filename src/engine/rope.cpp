// Rotary embeddings (see rope.h).
#include "engine/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

Rope::Rope(const ModelConfig& cfg, int64_t dim) : dim_(dim) {
  TANDEM_ASSERT(dim % 2 == 0, "rotary dim {} must be even", dim);
  const int64_t half = dim / 2;
  const double base = cfg.rope.theta;
  inv_freq_.resize(size_t(half));
  std::vector<double> extra(static_cast<size_t>(half)), inter(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // torch: base ** (arange(0, dim, 2).float() / dim), in float32.
    float expo = float(2 * i) / float(dim);
    float pos_freq = std::pow(float(base), expo);
    extra[size_t(i)] = 1.0 / pos_freq;
    inter[size_t(i)] = 1.0 / (cfg.rope.factor * pos_freq);
  }
  switch (cfg.rope.type) {
    case RopeType::kDefault:
      for (int64_t i = 0; i < half; ++i) inv_freq_[size_t(i)] = float(extra[size_t(i)]);
      break;
    case RopeType::kLinear:
      for (int64_t i = 0; i < half; ++i) inv_freq_[size_t(i)] = float(extra[size_t(i)] / cfg.rope.factor);
      break;
    case RopeType::kYarn: {
      const double max_pos = double(cfg.rope.original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return (double(dim) * std::log(max_pos / (rotations * 2 * M_PI))) / (2 * std::log(base));
      };
      double low = correction_dim(cfg.rope.beta_fast), high = correction_dim(cfg.rope.beta_slow);
      if (cfg.rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, double(dim - 1));
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        double extra_factor = 1.0 - ramp;
        inv_freq_[size_t(i)] = float(inter[size_t(i)] * (1 - extra_factor) + extra[size_t(i)] * extra_factor);
      }
      attention_factor_ = float(cfg.rope_attention_factor());
      break;
    }
  }
}

void Rope::apply(float* x, int64_t n_heads, int64_t pos, bool interleaved) const {
  const int64_t half = dim_ / 2;
  float cs[512], sn[512];
  TANDEM_ASSERT(half <= 512, "rotary dim {} too large", dim_);
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq_[size_t(i)];
    cs[i] = float(std::cos(double(angle))) * attention_factor_;
    sn[i] = float(std::sin(double(angle))) * attention_factor_;
  }
  float tmp[1024];
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * dim_;
    if (interleaved) {  // [a0 b0 a1 b1 ...] -> [a0 a1 ... b0 b1 ...]
      for (int64_t i = 0; i < half; ++i) {
        tmp[i] = v[2 * i];
        tmp[half + i] = v[2 * i + 1];
      }
      std::copy(tmp, tmp + dim_, v);
    }
    for (int64_t i = 0; i < half; ++i) {
      float a = v[i], b = v[half + i];
      v[i] = a * cs[i] - b * sn[i];
      v[half + i] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace tandem
