// The AVX-512 (F/BW/VL/DQ) kernel table: 16-lane f32 FMAs, bf16/f16/fp8 weights widened in registers,
// masked loads for the tails. Built with per-function target attributes, never -march, and only
// entered after kernels.cpp checked the CPU (see simd_body.h for the kernels themselves).
#include "backends/cpu/kernel_table.h"

#if defined(__x86_64__)

// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#define TANDEM_SIMD_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define TANDEM_SIMD_INLINE __attribute__((target(TANDEM_SIMD_TARGET), always_inline)) inline
#define TANDEM_SIMD_FN __attribute__((target(TANDEM_SIMD_TARGET)))

namespace tandem::cpu {
namespace {

using VF = __m512;
constexpr int64_t kLanes = 16;

TANDEM_SIMD_INLINE __mmask16 lanes_mask(int64_t n) { return __mmask16((1u << n) - 1u); }
TANDEM_SIMD_INLINE VF vzero() { return _mm512_setzero_ps(); }
TANDEM_SIMD_INLINE VF vset1(float a) { return _mm512_set1_ps(a); }
TANDEM_SIMD_INLINE VF vload(const float* p) { return _mm512_loadu_ps(p); }
TANDEM_SIMD_INLINE VF vload_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(lanes_mask(n), p); }
TANDEM_SIMD_INLINE void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
TANDEM_SIMD_INLINE void vstore_n(float* p, VF v, int64_t n) { _mm512_mask_storeu_ps(p, lanes_mask(n), v); }
TANDEM_SIMD_INLINE VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
TANDEM_SIMD_INLINE VF vsub(VF a, VF b) { return _mm512_sub_ps(a, b); }
TANDEM_SIMD_INLINE VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
TANDEM_SIMD_INLINE VF vdiv(VF a, VF b) { return _mm512_div_ps(a, b); }
TANDEM_SIMD_INLINE VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
// max/min return the second operand when either is NaN.
TANDEM_SIMD_INLINE VF vmax(VF a, VF b) { return _mm512_max_ps(a, b); }
TANDEM_SIMD_INLINE VF vmin(VF a, VF b) { return _mm512_min_ps(a, b); }
TANDEM_SIMD_INLINE VF vround(VF a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
TANDEM_SIMD_INLINE VF vscale2(VF y, VF n) { return _mm512_scalef_ps(y, n); }

TANDEM_SIMD_INLINE __m128 fold256(__m256 a) { return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); }
TANDEM_SIMD_INLINE float hsum(VF v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = fold256(a);
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
TANDEM_SIMD_INLINE float hmax(VF v) {
  __m256 a = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_max_ps(b, _mm_movehl_ps(b, b));
  b = _mm_max_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

TANDEM_SIMD_INLINE VF widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

template <DType D>
TANDEM_SIMD_INLINE VF wload(const void* p);
template <>
TANDEM_SIMD_INLINE VF wload<DType::kF32>(const void* p) { return _mm512_loadu_ps(p); }
template <>
TANDEM_SIMD_INLINE VF wload<DType::kBF16>(const void* p) { return widen_bf16(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
template <>
TANDEM_SIMD_INLINE VF wload<DType::kF16>(const void* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }

template <DType D>
TANDEM_SIMD_INLINE VF wload_n(const void* p, int64_t n);
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kF32>(const void* p, int64_t n) { return _mm512_maskz_loadu_ps(lanes_mask(n), p); }
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kBF16>(const void* p, int64_t n) { return widen_bf16(_mm256_maskz_loadu_epi16(lanes_mask(n), p)); }
template <>
TANDEM_SIMD_INLINE VF wload_n<DType::kF16>(const void* p, int64_t n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_mask(n), p)); }

// e4m3fn bytes → f16 bits (sign to bit 15, exponent and mantissa shifted under the f16 exponent field,
// so the value is the e4m3 value · 2^-8, subnormals included) → f32 by the hardware, exactly.
TANDEM_SIMD_INLINE VF widen_fp8(__m128i b) {
  const __m256i h = _mm256_cvtepu8_epi16(b);
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
  const __m256i rest = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7f)), 7);
  return _mm512_cvtph_ps(_mm256_or_si256(sign, rest));
}
TANDEM_SIMD_INLINE VF wload_fp8(const uint8_t* p) { return widen_fp8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
TANDEM_SIMD_INLINE VF wload_fp8_n(const uint8_t* p, int64_t n) { return widen_fp8(_mm_maskz_loadu_epi8(lanes_mask(n), p)); }

TANDEM_SIMD_INLINE double sumsq_f64(const float* x, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  if (i < n) {
    __m512 v = _mm512_maskz_loadu_ps(lanes_mask(n - i), x + i);
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

}  // namespace
}  // namespace tandem::cpu

#include "backends/cpu/simd_body.h"

namespace tandem::cpu {

const KernelTable& avx512_kernel_table() {
  static const KernelTable table{"avx512", matmul_block, rms_norm, silu_mul, softmax, dot, axpy, exp_array};
  return table;
}

}  // namespace tandem::cpu

#pragma GCC diagnostic pop

#else

namespace tandem::cpu {
const KernelTable& avx512_kernel_table() { return scalar_kernel_table(); }
}  // namespace tandem::cpu

#endif
