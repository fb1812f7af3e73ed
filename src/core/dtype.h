// Element types of tensors and their conversions. bf16/f16 are stored as uint16_t bit patterns,
// FP8 e4m3fn as uint8_t; conversions to f32 are exact, f32 -> bf16 / f16 / e4m3 round to nearest even.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

// kF8E4M3 is float8_e4m3fn ("F8_E4M3" in safetensors): only used for linear weights with block scales.
enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool, kF8E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                     // safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view s);  // nullopt for unknown names
inline bool dtype_is_float_weight(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }
// A linear layer's weight: a float weight, or F8_E4M3 with block scales (TensorView::scale).
inline bool dtype_is_linear_weight(DType t) { return dtype_is_float_weight(t) || t == DType::kF8E4M3; }

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

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, 0x7f / 0xff are NaN,
// largest finite ±448, subnormals m·2^-9. Exact.
inline bool fp8_e4m3_is_nan(uint8_t b) { return (b & 0x7fu) == 0x7fu; }
inline float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  uint32_t u;
  if (fp8_e4m3_is_nan(b)) {
    u = sign | 0x7fc00000u;
  } else if (exp == 0) {  // subnormal (or zero): mant · 2^-9, exact in f32
    float f = float(mant) * 0x1p-9f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else {
    u = sign | (exp + 120u) << 23 | mant << 20;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Rounds to nearest even; magnitudes beyond 448 saturate to ±448 (the largest finite code; e4m3fn
// has no infinity), NaN gives 0x7f. Used to quantize weights, where saturation is the convention.
uint8_t f32_to_fp8_e4m3(float f);

}  // namespace tandem
