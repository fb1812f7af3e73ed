// CPU kernels: portable reference implementations (see kernels.h). SIMD variants are chosen at run
// time per CPU in the same file set; the scalar path is the reference every variant is tested against.
#include "backends/cpu/kernels.h"

#include <cmath>

namespace tandem::cpu {

namespace {

template <class W>
float widen(W v);
template <>
inline float widen<float>(float v) { return v; }

inline float dot_row(const float* x, const TensorView& w, int64_t row, int64_t k) {
  float acc = 0.0f;
  switch (w.dtype) {
    case DType::kF32: {
      const float* r = w.as<float>() + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * r[i];
      return acc;
    }
    case DType::kBF16: {
      const uint16_t* r = w.as<uint16_t>() + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * bf16_to_f32(r[i]);
      return acc;
    }
    case DType::kF16: {
      const uint16_t* r = w.as<uint16_t>() + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * f16_to_f32(r[i]);
      return acc;
    }
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32:
    case DType::kI64: case DType::kBool:
      break;
  }
  TANDEM_ASSERT(false, "matmul weight dtype {}", dtype_name(w.dtype));
}

void matmul_impl(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                 int64_t x_stride, int64_t y_stride, bool accumulate) {
  const int64_t m = w.rows(), k = w.cols();
  if (x_stride < 0) x_stride = k;
  if (y_stride < 0) y_stride = m;
  pool.parallel_for(m, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * x_stride;
      float* yr = y + r * y_stride;
      for (int64_t j = m0; j < m1; ++j) {
        float v = dot_row(xr, w, j, k);
        yr[j] = accumulate ? yr[j] + v : v;
      }
    }
  });
}

}  // namespace

void matmul(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool, int64_t x_stride,
            int64_t y_stride) {
  matmul_impl(x, n, w, y, pool, x_stride, y_stride, false);
}

void matmul_acc(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                int64_t x_stride, int64_t y_stride) {
  matmul_impl(x, n, w, y, pool, x_stride, y_stride, true);
}

void rms_norm(const float* x, int64_t n, int64_t d, const TensorView& weight, float eps, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* o = out + r * d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    float scale = float(1.0 / std::sqrt(ss / double(d) + double(eps)));
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * scale * load_f32(weight, i);
  }
}

void silu_mul(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void embedding_row(const TensorView& table, int64_t token, float* out) {
  const int64_t d = table.cols();
  for (int64_t i = 0; i < d; ++i) out[i] = load_f32(table, token * d + i);
}

const char* simd_path() { return "scalar"; }

}  // namespace tandem::cpu
