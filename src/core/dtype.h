// Element types of tensors and their conversions. bf16/f16 are stored as uint16_t bit patterns;
// conversions to f32 are exact, f32 -> bf16 rounds to nearest even (NaN stays NaN).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                     // safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view s);  // nullopt for unknown names
inline bool dtype_is_float_weight(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace tandem
