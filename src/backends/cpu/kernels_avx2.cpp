// The AVX2 + FMA + F16C kernel table: 8-lane f32 FMAs, bf16/f16/fp8 weights widened in registers, tails
// through small zero-padded copies. Built with per-function target attributes, never -march, and only
// entered after kernels.cpp checked the CPU (see simd_body.h for the kernels themselves).
#include "backends/cpu/kernel_table.h"

#if defined(__x86_64__)

#include <immintrin.h>

#define TANDEM_SIMD_TARGET "avx2,fma,f16c"
#define TANDEM_SIMD_INLINE __attribute__((target(TANDEM_SIMD_TARGET), always_inline)) inline
#define TANDEM_SIMD_FN __attribute__((target(TANDEM_SIMD_TARGET)))

namespace tandem::cpu {
namespace {

using VF = __m256;
constexpr int64_t kLanes = 8;

TANDEM_SIMD_INLINE VF vzero() { return _mm256_setzero_ps(); }
TANDEM_SIMD_INLINE VF vset1(float a) { return _mm256_set1_ps(a); }
TANDEM_SIMD_INLINE VF vload(const float* p) { return _mm256_loadu_ps(p); }
TANDEM_SIMD_INLINE VF vload_n(const float* p, int64_t n) {
  alignas(32) float buf[8] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return _mm256_load_ps(buf);
}
TANDEM_SIMD_INLINE void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
TANDEM_SIMD_INLINE void vstore_n(float* p, VF v, int64_t n) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
}
TANDEM_SIMD_INLINE VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
TANDEM_SIMD_INLINE VF vsub(VF a, VF b) { return _mm256_sub_ps(a, b); }
TANDEM_SIMD_INLINE VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
TANDEM_SIMD_INLINE VF vdiv(VF a, VF b) { return _mm256_div_ps(a, b); }
TANDEM_SIMD_INLINE VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
// max/min return the second operand when either is NaN.
TANDEM_SIMD_INLINE VF vmax(VF a, VF b) { return _mm256_max_ps(a, b); }
TANDEM_SIMD_INLINE VF vmin(VF a, VF b) { return _mm256_min_ps(a, b); }
TANDEM_SIMD_INLINE VF vround(VF a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// y·2^n as y·2^(n/2)·2^(n - n/2): each factor stays a normal float for |n| <= 160.
TANDEM_SIMD_INLINE VF vscale2(VF y, VF n) {
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i n1 = _mm256_srai_epi32(ni, 1);
  __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  VF p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  VF p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}

TANDEM_SIMD_INLINE float hsum(VF v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
TANDEM_SIMD_INLINE float hmax(VF v) {
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

TANDEM_SIMD_INLINE VF widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
TANDEM_SIMD_INLINE __m128i load8_u16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
TANDEM_SIMD_INLINE __m128i load8_u16_n(const void* p, int64_t n) {
  alignas(16) uint16_t buf[8] = {};
  const uint16_t* s = static_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i) buf[i] = s[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
}

template <DType D>
TANDEM_SIMD_INLINE VF wload(const void* p);
template <>
TANDEM_SIMD_INLINE VF wload<DType::kF32>(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
template <>
TANDEM_SIMD_INLINE VF wload<DType::kBF16>(const void* p) { return widen_bf16(load8_u16(p)); }
template <>
TANDEM_SIMD_INLINE VF wload<DType::kF16>(const void* p) { return _mm256_cvtph_ps(load8_u16(p)); }

template <DType D>
TANDEM_SIMD_INLINE VF wload_n(const void* p, int64_t n);
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kF32>(const void* p, int64_t n) { return vload_n(static_cast<const float*>(p), n); }
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kBF16>(const void* p, int64_t n) { return widen_bf16(load8_u16_n(p, n)); }
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kF16>(const void* p, int64_t n) { return _mm256_cvtph_ps(load8_u16_n(p, n)); }

// e4m3fn bytes → f16 bits (sign to bit 15, exponent and mantissa shifted under the f16 exponent field,
// so the value is the e4m3 value · 2^-8, subnormals included) → f32 by F16C, exactly. 8 bytes at p.
TANDEM_SIMD_INLINE VF widen_fp8(__m128i b) {
  const __m128i h = _mm_cvtepu8_epi16(b);
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8);
  const __m128i rest = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7f)), 7);
  return _mm256_cvtph_ps(_mm_or_si128(sign, rest));
}
TANDEM_SIMD_INLINE VF wload_fp8(const uint8_t* p) { return widen_fp8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
TANDEM_SIMD_INLINE VF wload_fp8_n(const uint8_t* p, int64_t n) {
  alignas(16) uint8_t buf[16] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return widen_fp8(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
}

TANDEM_SIMD_INLINE double sumsq_f64(const float* x, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  __m256d s = _mm256_add_pd(s0, s1);
  __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double acc = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  for (; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

}  // namespace
}  // namespace tandem::cpu

#include "backends/cpu/simd_body.h"

namespace tandem::cpu {

const KernelTable& avx2_kernel_table() {
  static const KernelTable table{"avx2", matmul_block, rms_norm, silu_mul, softmax, dot, axpy, exp_array};
  return table;
}

}  // namespace tandem::cpu

#else

namespace tandem::cpu {
const KernelTable& avx2_kernel_table() { return scalar_kernel_table(); }
}  // namespace tandem::cpu

#endif
