// dtype names and half-precision conversions (see dtype.h).
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 11> kDTypes{{{DType::kF32, "F32", 4},
                                             {DType::kF16, "F16", 2},
                                             {DType::kBF16, "BF16", 2},
                                             {DType::kF64, "F64", 8},
                                             {DType::kI8, "I8", 1},
                                             {DType::kU8, "U8", 1},
                                             {DType::kI16, "I16", 2},
                                             {DType::kI32, "I32", 4},
                                             {DType::kI64, "I64", 8},
                                             {DType::kBool, "BOOL", 1},
                                             {DType::kF8E4M3, "F8_E4M3", 1}}};
}  // namespace

size_t dtype_size(DType t) { return kDTypes[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kDTypes[size_t(t)].name; }

std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& info : kDTypes)
    if (info.name == s) return info.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;
  if (a < 6.103515625e-05f) {  // subnormal in f16: round a / 2^-24 to nearest even
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t e = ((u >> 23) & 0xffu) - 112;
  uint32_t m = u & 0x7fffffu;
  uint32_t r = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | uint16_t(r);
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a == 0.0f) return sign;
  // Spacing of representable values around a: 2^(e-3) for normals (e = floor(log2 a) >= -6),
  // 2^-9 for subnormals. a / spacing rounded to nearest even gives the code's significand.
  int e = 0;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  const int exp = std::max(e - 1, -6);
  const float q = std::nearbyint(std::ldexp(a, 3 - exp));  // significand in units of the spacing, [0, 16]
  int mant = int(q), biased = exp + 7;
  if (biased == 1 && mant < 8) return sign | uint8_t(mant);  // subnormal
  if (mant == 16) {  // rounded up to the next binade
    mant = 8;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mant - 8 > 6)) return sign | 0x7e;
  return sign | uint8_t(biased << 3) | uint8_t(mant - 8);
}

}  // namespace tandem
