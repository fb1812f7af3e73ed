// CPU kernels: the public entry points (argument checks, threading, SIMD dispatch) and the scalar
// reference table that every SIMD path is tested against. The SIMD tables live in kernels_avx2.cpp
// and kernels_avx512.cpp; matmul splits the output into cache-sized blocks over m (and n when m alone
// gives too few) and each block runs on one thread, so the thread count never changes a result.
#include "backends/cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "backends/cpu/kernel_table.h"

namespace tandem::cpu {

namespace {

// ---- scalar reference ----------------------------------------------------------------------------

float scalar_dot_row(const float* x, const MatmulArgs& a, int64_t row) {
  const int64_t k = a.k;
  float acc = 0.0f;
  switch (a.w_dtype) {
    case DType::kF32: {
      const float* r = static_cast<const float*>(a.w) + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * r[i];
      return acc;
    }
    case DType::kBF16: {
      const uint16_t* r = static_cast<const uint16_t*>(a.w) + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * bf16_to_f32(r[i]);
      return acc;
    }
    case DType::kF16: {
      const uint16_t* r = static_cast<const uint16_t*>(a.w) + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * f16_to_f32(r[i]);
      return acc;
    }
    case DType::kF8E4M3: {  // dequantized per element (f32 product with the block's scale), f32 accumulate
      const uint8_t* r = static_cast<const uint8_t*>(a.w) + row * k;
      for (int64_t i = 0; i < k; ++i) acc += x[i] * (fp8_e4m3_to_f32(r[i]) * a.w_scale.at(row, i));
      return acc;
    }
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32:
    case DType::kI64: case DType::kBool:
      break;
  }
  TANDEM_ASSERT(false, "matmul weight dtype {}", dtype_name(a.w_dtype));
}

void scalar_matmul_block(const MatmulArgs& a, int64_t n0, int64_t n1, int64_t m0, int64_t m1) {
  for (int64_t r = n0; r < n1; ++r) {
    const float* xr = a.x + r * a.x_stride;
    float* yr = a.y + r * a.y_stride;
    for (int64_t j = m0; j < m1; ++j) {
      float v = scalar_dot_row(xr, a, j);
      yr[j] = a.accumulate ? yr[j] + v : v;
    }
  }
}

float load_weight(const void* w, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(w)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32:
    case DType::kI64: case DType::kBool: case DType::kF8E4M3:
      break;
  }
  TANDEM_ASSERT(false, "weight dtype {}", dtype_name(dtype));
}

void scalar_rms_norm(const float* x, int64_t n, int64_t d, const void* w, DType w_dtype, float eps, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* o = out + r * d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    float scale = float(1.0 / std::sqrt(ss / double(d) + double(eps)));
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * scale * load_weight(w, w_dtype, i);
  }
}

void scalar_silu_mul(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void scalar_softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float scalar_dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void scalar_axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scalar_exp(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

// ---- dispatch ------------------------------------------------------------------------------------

constexpr int kUnresolved = -1;
std::atomic<int> g_path{kUnresolved};

SimdPath best_path() {
  if (simd_supported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  if (simd_supported(SimdPath::kAvx2)) return SimdPath::kAvx2;
  return SimdPath::kScalar;
}

SimdPath path_from_env() {
  const char* env = std::getenv("TANDEM_SIMD");
  if (env == nullptr || *env == '\0') return best_path();
  SimdPath path = simd_path_from_name(env);
  if (!simd_supported(path)) fail("TANDEM_SIMD={}: this CPU does not support that SIMD path", env);
  return path;
}

SimdPath resolve_path() {
  int p = g_path.load(std::memory_order_acquire);
  if (p != kUnresolved) return SimdPath(p);
  SimdPath path = path_from_env();
  g_path.store(int(path), std::memory_order_release);
  return path;
}

const KernelTable& table_for(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar: return scalar_kernel_table();
    case SimdPath::kAvx2: return avx2_kernel_table();
    case SimdPath::kAvx512: return avx512_kernel_table();
  }
  TANDEM_ASSERT(false, "bad SimdPath {}", int(path));
}

const KernelTable& active() { return table_for(resolve_path()); }

// ---- matmul threading ----------------------------------------------------------------------------

// Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelMacs = int64_t(1) << 16;
// Bytes of W one block should span, so the block stays in L2 while every row of x passes over it.
constexpr int64_t kBlockWeightBytes = int64_t(256) << 10;
// Block sizes over m are multiples of this (16 floats = one cache line of y; 4 = the tile width).
constexpr int64_t kMAlign = 16;
// Row blocks over n are multiples of the tile height; n is only split from this many rows up, since
// for decode-sized n a split would stream the same weights from DRAM twice.
constexpr int64_t kNAlign = 4;
constexpr int64_t kMinRowsToSplit = 16;

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct MatmulPlan {
  int64_t m_block = 0, n_block = 0;    // sizes of one task's block
  int64_t m_blocks = 0, n_blocks = 0;  // counts
};

MatmulPlan plan_matmul(int64_t n, int64_t m, int64_t k, DType dtype, int threads) {
  MatmulPlan p;
  const int64_t row_bytes = std::max<int64_t>(1, k * int64_t(dtype_size(dtype)));
  const int64_t cache_rows = std::max(kMAlign, kBlockWeightBytes / row_bytes / kMAlign * kMAlign);
  const int64_t target = threads > 1 ? 4 * int64_t(threads) : 1;
  p.m_block = std::clamp(round_up((m + target - 1) / target, kMAlign), kMAlign, cache_rows);
  p.m_blocks = (m + p.m_block - 1) / p.m_block;
  p.n_block = n;
  if (threads > 1 && p.m_blocks < target && n >= kMinRowsToSplit) {
    const int64_t splits = std::min((target + p.m_blocks - 1) / p.m_blocks, (n + kNAlign - 1) / kNAlign);
    p.n_block = round_up((n + splits - 1) / splits, kNAlign);
  }
  p.n_blocks = (n + p.n_block - 1) / p.n_block;
  return p;
}

void matmul_impl(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                 int64_t x_stride, int64_t y_stride, bool accumulate) {
  TANDEM_ASSERT(dtype_is_linear_weight(w.dtype), "matmul weight dtype {} (want F32, BF16, F16 or F8_E4M3)",
                dtype_name(w.dtype));
  const bool fp8 = w.dtype == DType::kF8E4M3;
  TANDEM_ASSERT(fp8 == !w.scale.empty(), "matmul weight {} {} block scales", dtype_name(w.dtype),
                fp8 ? "without" : "with");
  TANDEM_ASSERT(!fp8 || (w.scale.block_rows > 0 && w.scale.block_cols > 0), "FP8 scale blocks {}x{}",
                w.scale.block_rows, w.scale.block_cols);
  TANDEM_ASSERT(w.shape.ndim == 2, "matmul weight must be 2-D, got {}", w.shape.str());
  const int64_t m = w.rows(), k = w.cols();
  if (x_stride < 0) x_stride = k;
  if (y_stride < 0) y_stride = m;
  TANDEM_ASSERT(n >= 0 && x_stride >= k && y_stride >= m, "matmul n={} x_stride={} y_stride={} for W {}", n,
                x_stride, y_stride, w.shape.str());
  if (n == 0 || m == 0) return;
  const KernelTable& t = fp8 && w.scale.block_cols % kSimdFp8BlockMultiple != 0 ? scalar_kernel_table() : active();
  MatmulArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.w_scale = w.scale;
  a.k = k;
  a.y = y;
  a.y_stride = y_stride;
  a.accumulate = accumulate;
  const int threads = n * m * k < kMinParallelMacs ? 1 : pool.size();
  const MatmulPlan p = plan_matmul(n, m, k, w.dtype, threads);
  auto run_tasks = [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n0 = task / p.m_blocks * p.n_block, m0 = task % p.m_blocks * p.m_block;
      t.matmul_block(a, n0, std::min(n, n0 + p.n_block), m0, std::min(m, m0 + p.m_block));
    }
  };
  const int64_t tasks = p.m_blocks * p.n_blocks;
  if (threads == 1) {
    run_tasks(0, tasks);
  } else {
    pool.parallel_for(tasks, 1, run_tasks);
  }
}

}  // namespace

const KernelTable& scalar_kernel_table() {
  static const KernelTable table{"scalar",       scalar_matmul_block, scalar_rms_norm, scalar_silu_mul,
                                 scalar_softmax, scalar_dot,          scalar_axpy,     scalar_exp};
  return table;
}

bool simd_supported(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar:
      return true;
    case SimdPath::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case SimdPath::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

SimdPath simd_path_from_name(std::string_view name) {
  if (name == "scalar") return SimdPath::kScalar;
  if (name == "avx2") return SimdPath::kAvx2;
  if (name == "avx512") return SimdPath::kAvx512;
  fail("unknown SIMD path '{}' (want scalar, avx2 or avx512)", name);
}

std::string_view simd_path_name(SimdPath path) { return table_for(path).name; }

void set_simd_path(SimdPath path) {
  if (!simd_supported(path)) fail("SIMD path {}: this CPU does not support it", simd_path_name(path));
  g_path.store(int(path), std::memory_order_release);
}

SimdPath current_simd_path() { return resolve_path(); }

void reload_simd_path_from_env() { g_path.store(int(path_from_env()), std::memory_order_release); }

const char* simd_path() { return active().name; }

void matmul(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool, int64_t x_stride,
            int64_t y_stride) {
  matmul_impl(x, n, w, y, pool, x_stride, y_stride, false);
}

void matmul_acc(const float* x, int64_t n, const TensorView& w, float* y, ThreadPool& pool,
                int64_t x_stride, int64_t y_stride) {
  matmul_impl(x, n, w, y, pool, x_stride, y_stride, true);
}

void rms_norm(const float* x, int64_t n, int64_t d, const TensorView& weight, float eps, float* out) {
  TANDEM_ASSERT(dtype_is_float_weight(weight.dtype), "rms_norm weight dtype {}", dtype_name(weight.dtype));
  TANDEM_ASSERT(weight.numel() >= d, "rms_norm weight {} shorter than d={}", weight.shape.str(), d);
  if (n <= 0 || d <= 0) return;
  active().rms_norm(x, n, d, weight.data, weight.dtype, eps, out);
}

void silu_mul(float* gate, const float* up, int64_t count) {
  if (count > 0) active().silu_mul(gate, up, count);
}

void softmax_inplace(float* x, int64_t n) {
  if (n > 0) active().softmax(x, n);
}

float dot_f32(const float* a, const float* b, int64_t n) { return n > 0 ? active().dot(a, b, n) : 0.0f; }

void axpy(float a, const float* x, float* y, int64_t n) {
  if (n > 0) active().axpy(a, x, y, n);
}

void embedding_row(const TensorView& table, int64_t token, float* out) {
  TANDEM_ASSERT(dtype_is_float_weight(table.dtype), "embedding dtype {}", dtype_name(table.dtype));
  TANDEM_ASSERT(token >= 0 && token < table.rows(), "token {} outside the embedding table {}", token,
                table.shape.str());
  const int64_t d = table.cols();
  const void* row = table.row_ptr(token);
  for (int64_t i = 0; i < d; ++i) out[i] = load_weight(row, table.dtype, i);
}

}  // namespace tandem::cpu
