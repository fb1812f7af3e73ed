// FP8 linear weights and their block scales (see fp8_weights.h).
#include "io/fp8_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tandem {

void check_fp8_codes(const TensorView& w, std::string_view what) {
  TANDEM_ASSERT(w.dtype == DType::kF8E4M3, "check_fp8_codes on {}", dtype_name(w.dtype));
  const uint8_t* p = w.as<uint8_t>();
  const size_t n = size_t(w.numel());
  // Eight bytes at a time: with every high bit set, a NaN code (x1111111) is exactly a 0xff byte,
  // i.e. a zero byte of the complement.
  constexpr uint64_t kLow = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    const uint64_t c = ~(v | kHigh);
    if (((c - kLow) & ~c & kHigh) != 0) break;
  }
  for (; i < n; ++i)
    if (fp8_e4m3_is_nan(p[i]))
      fail("{} holds the NaN code 0x{:02x} at row {}, column {}: NaN weights are refused", what, p[i],
           int64_t(i) / w.cols(), int64_t(i) % w.cols());
}

TensorView require_linear(const TensorStore& store, const QuantConfig& quant, std::string_view name,
                          std::initializer_list<int64_t> shape) {
  const TensorView* found = store.find(name);
  if (!found) fail("tensor '{}' missing from {}", name, store.source());
  const std::string& file = store.file_of(name);
  TensorView v = *found;
  const Shape want(shape);
  if (!(v.shape == want)) fail("tensor '{}' in {} has shape {}, expected {}", name, file, v.shape.str(), want.str());
  const std::string scale_name = std::string(name) + std::string(kFp8ScaleSuffix);
  const TensorView* scale = store.find(scale_name);
  if (dtype_is_float_weight(v.dtype)) {
    if (scale)
      fail("tensor '{}' in {} is {} but has block scales '{}': scales are only read for F8_E4M3 weights", name,
           file, dtype_name(v.dtype), scale_name);
    return v;
  }
  if (v.dtype != DType::kF8E4M3)
    fail("tensor '{}' in {} has dtype {}, expected a float dtype (F32, BF16, F16) or F8_E4M3 with block scales",
         name, file, dtype_name(v.dtype));
  TANDEM_ASSERT(v.shape.ndim == 2, "linear weight {} is not 2-D", name);
  if (!quant.fp8)
    fail("tensor '{}' in {} is F8_E4M3, but {}/config.json has no FP8 quantization_config (quant_method \"fp8\" "
         "with weight_block_size), so its scale blocks are unknown",
         name, file, store.source());
  if (!scale)
    fail("tensor '{}' in {} is F8_E4M3 but its block scales '{}' are missing (per-tensor or per-channel scales "
         "are not supported)",
         name, file, scale_name);
  const std::string& scale_file = store.file_of(scale_name);
  const int64_t grid_rows = (v.rows() + quant.block_rows - 1) / quant.block_rows;
  const int64_t grid_cols = (v.cols() + quant.block_cols - 1) / quant.block_cols;
  if (scale->dtype != DType::kF32)
    fail("block scales '{}' in {} have dtype {}, expected F32", scale_name, scale_file, dtype_name(scale->dtype));
  if (!(scale->shape == Shape{grid_rows, grid_cols}))
    fail("block scales '{}' in {} have shape {}, expected [{}, {}]: one scale per {}x{} block (weight_block_size) "
         "of the {} weight, edge blocks included (per-tensor or per-channel scales are not supported)",
         scale_name, scale_file, scale->shape.str(), grid_rows, grid_cols, quant.block_rows, quant.block_cols,
         v.shape.str());
  const float* s = scale->as<float>();
  for (int64_t i = 0; i < grid_rows * grid_cols; ++i)
    if (!(std::isfinite(s[i]) && s[i] > 0.0f && s[i] <= kFp8MaxScale))
      fail("block scales '{}' in {}: scale [{}, {}] is {}, expected a finite value in (0, 2^100]", scale_name,
           scale_file, i / grid_cols, i % grid_cols, s[i]);
  check_fp8_codes(v, fmt::format("tensor '{}' in {}", name, file));
  v.scale.data = s;
  v.scale.stride = grid_cols;
  v.scale.block_rows = quant.block_rows;
  v.scale.block_cols = quant.block_cols;
  v.scale.row0 = 0;
  return v;
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t* codes,
                         float* scales) {
  TANDEM_ASSERT(rows >= 0 && cols >= 0 && br > 0 && bc > 0, "quantize_fp8_blocks {}x{} in {}x{}", rows, cols, br, bc);
  const int64_t grid_cols = (cols + bc - 1) / bc;
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      scales[r0 / br * grid_cols + c0 / bc] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = f32_to_fp8_e4m3(w[r * cols + c] / scale);
    }
}

}  // namespace tandem
