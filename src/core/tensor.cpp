// Tensor view helpers (see tensor.h).
#include "core/tensor.h"

#include <fmt/format.h>

namespace tandem {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", dims[i]);
  return s + "]";
}

float load_f32(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kF32: return v.as<float>()[i];
    case DType::kBF16: return bf16_to_f32(v.as<uint16_t>()[i]);
    case DType::kF16: return f16_to_f32(v.as<uint16_t>()[i]);
    case DType::kF64: return float(v.as<double>()[i]);
    case DType::kF8E4M3:
      TANDEM_ASSERT(!v.scale.empty(), "load_f32 on an F8_E4M3 view without block scales");
      return fp8_e4m3_to_f32(v.as<uint8_t>()[i]) * v.scale.at(i / v.cols(), i % v.cols());
    case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32: case DType::kI64: case DType::kBool:
      break;
  }
  TANDEM_ASSERT(false, "load_f32 on non-float dtype {}", dtype_name(v.dtype));
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[size_t(i)] = load_f32(v, i);
  return out;
}

}  // namespace tandem
