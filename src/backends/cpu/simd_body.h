// The kernels shared by the AVX2 and AVX-512 paths, written once against a small vector API that
// the including file defines (kernels_avx2.cpp, kernels_avx512.cpp), inside an anonymous namespace
// and with that file's target attributes (TANDEM_SIMD_INLINE / TANDEM_SIMD_FN). Include it once,
// after the API, in a file built for no particular CPU: nothing here may run before dispatch.
//
// Vector API: VF, kLanes, vzero, vset1, vload, vload_n (first n lanes, rest 0), vstore, vstore_n,
// vadd, vsub, vmul, vdiv, vfma(a, b, c) = a·b + c, vmax, vmin, vround (to nearest), vscale2(y, n) =
// y·2^n (n integral, |n| <= 160, overflow to inf, underflow to 0), hsum, hmax, wload<D>, wload_n<D>
// (weights widened to f32), wload_fp8, wload_fp8_n (e4m3fn bytes widened to f32 times 2^-8, exactly;
// NaN codes are not decoded: the loader refuses them), sumsq_f64 (Σx² accumulated in f64).
#pragma once

namespace tandem::cpu {
namespace {

template <DType D>
struct WeightType;
template <>
struct WeightType<DType::kF32> {
  using T = float;
};
template <>
struct WeightType<DType::kBF16> {
  using T = uint16_t;
};
template <>
struct WeightType<DType::kF16> {
  using T = uint16_t;
};
template <>
struct WeightType<DType::kF8E4M3> {
  using T = uint8_t;
};
template <DType D>
using WT = typename WeightType<D>::T;

// wload_fp8 returns the weight times 2^-8 (the e4m3 bits placed in an f16, widened by the hardware);
// the block scale is multiplied by this to undo it, exactly (a power of two).
constexpr float kFp8Unscale = 256.0f;

// Weight vectors widened to f32; F8_E4M3 ones also dequantized with their block's scale (`s`, already
// times kFp8Unscale), giving bitwise the f32 product fp8 · scale the scalar reference forms.
template <DType D>
TANDEM_SIMD_INLINE VF wload_scaled(const WT<D>* p, VF s) {
  if constexpr (D == DType::kF8E4M3) return vmul(wload_fp8(p), s);
  else return wload<D>(p);
}
template <DType D>
TANDEM_SIMD_INLINE VF wload_scaled_n(const WT<D>* p, int64_t n, VF s) {
  if constexpr (D == DType::kF8E4M3) return vmul(wload_fp8_n(p, n), s);
  else return wload_n<D>(p, n);
}

// One register tile: R rows of x against the C rows of W from row j, into y (row 0, column j of the
// output). Each output element is one vector accumulator fed in k order, then reduced by hsum, so the
// tile shape never changes a result. k runs in column blocks that share one scale per weight row: for
// F8_E4M3 the scale blocks (a whole number of vectors wide, kSimdFp8BlockMultiple; the last may be
// partial), for the other dtypes one block of k, unscaled.
template <DType D, int R, int C>
TANDEM_SIMD_FN void matmul_tile(const MatmulArgs& a, const float* x, int64_t j, float* y) {
  constexpr bool kFp8 = D == DType::kF8E4M3;
  const int64_t k = a.k, bc = kFp8 ? a.w_scale.block_cols : k;
  const WT<D>* w = static_cast<const WT<D>*>(a.w) + j * k;
  const float* srow[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c)
    srow[c] = kFp8 ? a.w_scale.data + (a.w_scale.row0 + j + c) / a.w_scale.block_rows * a.w_scale.stride : nullptr;
  VF acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (int64_t b0 = 0; b0 < k; b0 += bc) {
    const int64_t b1 = b0 + bc < k ? b0 + bc : k;
    VF sv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) sv[c] = kFp8 ? vset1(srow[c][b0 / bc] * kFp8Unscale) : vzero();
    int64_t i = b0;
    for (; i + kLanes <= b1; i += kLanes) {
      VF wv[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) wv[c] = wload_scaled<D>(w + c * k + i, sv[c]);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        VF xv = vload(x + r * a.x_stride + i);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = vfma(xv, wv[c], acc[r][c]);
      }
    }
    if (i < b1) {
      const int64_t rest = b1 - i;
      VF wv[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) wv[c] = wload_scaled_n<D>(w + c * k + i, rest, sv[c]);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        VF xv = vload_n(x + r * a.x_stride + i, rest);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r][c] = vfma(xv, wv[c], acc[r][c]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      float v = hsum(acc[r][c]);
      float* out = y + r * a.y_stride + c;
      *out = a.accumulate ? *out + v : v;
    }
}

// R rows of x (starting at row r) against W rows [m0, m1).
template <DType D, int R>
TANDEM_SIMD_FN void matmul_rows(const MatmulArgs& a, int64_t r, int64_t m0, int64_t m1) {
  const float* x = a.x + r * a.x_stride;
  float* y = a.y + r * a.y_stride;
  constexpr int kCols = 4;
  int64_t j = m0;
  for (; j + kCols <= m1; j += kCols) matmul_tile<D, R, kCols>(a, x, j, y + j);
  for (; j < m1; ++j) matmul_tile<D, R, 1>(a, x, j, y + j);
}

// Rows [r0, r1) of x against the C rows of W at j, in tiles of up to 4 rows.
template <DType D, int C>
TANDEM_SIMD_FN void matmul_row_tiles(const MatmulArgs& a, int64_t r0, int64_t r1, int64_t j) {
  auto at = [&](int64_t r) { return a.x + r * a.x_stride; };
  auto out = [&](int64_t r) { return a.y + r * a.y_stride + j; };
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) matmul_tile<D, 4, C>(a, at(r), j, out(r));
  switch (r1 - r) {
    case 3: matmul_tile<D, 3, C>(a, at(r), j, out(r)); break;
    case 2: matmul_tile<D, 2, C>(a, at(r), j, out(r)); break;
    case 1: matmul_tile<D, 1, C>(a, at(r), j, out(r)); break;
    default: break;
  }
}

// Decode-sized n (<= kFewRows): one pass over W, every row of x per W tile, so each weight byte comes
// from DRAM once and is used n times while it is in L1 (the next tile streams in meanwhile). One row
// of x takes eight weight rows per tile (eight streams and eight independent accumulators in flight:
// +25–35% on the dev machine's one-row GEMVs, bench/RESULTS.md); results are the same bits, as each
// output is still one accumulator fed in k order.
// Larger n: 4 rows of x at a time against the whole block of W, which the caller sized to stay in L2.
constexpr int64_t kFewRows = 8;

template <DType D>
TANDEM_SIMD_FN void matmul_block_t(const MatmulArgs& a, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
  constexpr int kCols = 4;
  if (n1 - n0 <= kFewRows) {
    int64_t j = m0;
    if (n1 - n0 == 1) {  // one row of x (decode of one sequence): eight weight rows stream at once
      constexpr int kWide = 8;
      const float* x = a.x + n0 * a.x_stride;
      float* y = a.y + n0 * a.y_stride;
      for (; j + kWide <= m1; j += kWide) matmul_tile<D, 1, kWide>(a, x, j, y + j);
    }
    for (; j + kCols <= m1; j += kCols) matmul_row_tiles<D, kCols>(a, n0, n1, j);
    for (; j < m1; ++j) matmul_row_tiles<D, 1>(a, n0, n1, j);
    return;
  }
  constexpr int kRows = 4;
  int64_t r = n0;
  for (; r + kRows <= n1; r += kRows) matmul_rows<D, kRows>(a, r, m0, m1);
  switch (n1 - r) {
    case 3: matmul_rows<D, 3>(a, r, m0, m1); break;
    case 2: matmul_rows<D, 2>(a, r, m0, m1); break;
    case 1: matmul_rows<D, 1>(a, r, m0, m1); break;
    default: break;
  }
}

TANDEM_SIMD_FN void matmul_block(const MatmulArgs& a, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
  switch (a.w_dtype) {
    case DType::kF32: matmul_block_t<DType::kF32>(a, n0, n1, m0, m1); return;
    case DType::kBF16: matmul_block_t<DType::kBF16>(a, n0, n1, m0, m1); return;
    case DType::kF16: matmul_block_t<DType::kF16>(a, n0, n1, m0, m1); return;
    case DType::kF8E4M3: matmul_block_t<DType::kF8E4M3>(a, n0, n1, m0, m1); return;
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32:
    case DType::kI64: case DType::kBool:
      break;
  }
  __builtin_trap();  // kernels.cpp checks the dtype before dispatch
}

// e^x: Cody-Waite reduction x = n·ln2 + r, |r| <= ln2/2, Cephes' degree-7 polynomial for e^r (about
// 1 ulp), then the exact scaling by 2^n. Inputs below -104 give 0, above 89 inf; NaN stays NaN.
TANDEM_SIMD_INLINE VF vexp(VF x) {
  x = vmin(vset1(89.0f), vmax(vset1(-104.0f), x));  // operand order keeps NaN
  VF n = vround(vmul(x, vset1(1.44269504088896341f)));
  VF r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  VF p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vscale2(p, n);
}

TANDEM_SIMD_FN void exp_array(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(out + i, vexp(vload(x + i)));
  if (i < n) vstore_n(out + i, vexp(vload_n(x + i, n - i)), n - i);
}

TANDEM_SIMD_FN void silu_mul(float* gate, const float* up, int64_t count) {
  const VF one = vset1(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    VF g = vload(gate + i);
    VF e = vexp(vsub(vzero(), g));
    vstore(gate + i, vmul(vdiv(g, vadd(one, e)), vload(up + i)));
  }
  if (i < count) {
    const int64_t rest = count - i;
    VF g = vload_n(gate + i, rest);
    VF e = vexp(vsub(vzero(), g));
    vstore_n(gate + i, vmul(vdiv(g, vadd(one, e)), vload_n(up + i, rest)), rest);
  }
}

TANDEM_SIMD_FN float dot(const float* a, const float* b, int64_t n) {
  VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    s0 = vfma(vload(a + i), vload(b + i), s0);
    s1 = vfma(vload(a + i + kLanes), vload(b + i + kLanes), s1);
    s2 = vfma(vload(a + i + 2 * kLanes), vload(b + i + 2 * kLanes), s2);
    s3 = vfma(vload(a + i + 3 * kLanes), vload(b + i + 3 * kLanes), s3);
  }
  for (; i + kLanes <= n; i += kLanes) s0 = vfma(vload(a + i), vload(b + i), s0);
  if (i < n) s0 = vfma(vload_n(a + i, n - i), vload_n(b + i, n - i), s0);
  return hsum(vadd(vadd(s0, s1), vadd(s2, s3)));
}

TANDEM_SIMD_FN void axpy(float alpha, const float* x, float* y, int64_t n) {
  const VF a = vset1(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(y + i, vfma(a, vload(x + i), vload(y + i)));
  if (i < n) vstore_n(y + i, vfma(a, vload_n(x + i, n - i), vload_n(y + i, n - i)), n - i);
}

TANDEM_SIMD_FN void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  VF mv = vset1(-__builtin_inff());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) mv = vmax(mv, vload(x + i));
  float mx = hmax(mv);
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  const VF m = vset1(mx);
  VF sv = vzero();
  for (i = 0; i + kLanes <= n; i += kLanes) {
    VF e = vexp(vsub(vload(x + i), m));
    vstore(x + i, e);
    sv = vadd(sv, e);
  }
  if (i < n) {
    VF e = vexp(vsub(vload_n(x + i, n - i), m));
    vstore_n(x + i, e, n - i);
    sv = vadd(sv, vload_n(x + i, n - i));  // re-read so the lanes past n count as 0
  }
  const VF inv = vset1(1.0f / hsum(sv));
  for (i = 0; i + kLanes <= n; i += kLanes) vstore(x + i, vmul(vload(x + i), inv));
  if (i < n) vstore_n(x + i, vmul(vload_n(x + i, n - i), inv), n - i);
}

template <DType D>
TANDEM_SIMD_FN void rms_norm_t(const float* x, int64_t n, int64_t d, const WT<D>* w, float eps, float* out) {
  for (int64_t row = 0; row < n; ++row) {
    const float* xr = x + row * d;
    float* o = out + row * d;
    const double ss = sumsq_f64(xr, d);
    const VF scale = vset1(float(1.0 / __builtin_sqrt(ss / double(d) + double(eps))));
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) vstore(o + i, vmul(vmul(vload(xr + i), scale), wload<D>(w + i)));
    if (i < d) vstore_n(o + i, vmul(vmul(vload_n(xr + i, d - i), scale), wload_n<D>(w + i, d - i)), d - i);
  }
}

TANDEM_SIMD_FN void rms_norm(const float* x, int64_t n, int64_t d, const void* w, DType w_dtype, float eps,
                             float* out) {
  switch (w_dtype) {
    case DType::kF32: rms_norm_t<DType::kF32>(x, n, d, static_cast<const float*>(w), eps, out); return;
    case DType::kBF16: rms_norm_t<DType::kBF16>(x, n, d, static_cast<const uint16_t*>(w), eps, out); return;
    case DType::kF16: rms_norm_t<DType::kF16>(x, n, d, static_cast<const uint16_t*>(w), eps, out); return;
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32:
    case DType::kI64: case DType::kBool: case DType::kF8E4M3:
      break;
  }
  __builtin_trap();  // kernels.cpp checks the dtype before dispatch
}

}  // namespace
}  // namespace tandem::cpu
