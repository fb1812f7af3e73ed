// CPU kernels on every SIMD path this CPU supports, against double-precision references computed
// here: matmul for every weight dtype over awkward shapes, strides and accumulate; rms_norm, silu_mul,
// softmax, dot, axpy, exp; results bitwise identical across thread counts; path selection; and the
// thread pool the kernels run on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <random>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace tandem::cpu {
namespace {

constexpr SimdPath kAllPaths[] = {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Switches to a path for one test and restores the previous one.
class PathScope {
 public:
  explicit PathScope(SimdPath p) : saved_(current_simd_path()) { set_simd_path(p); }
  ~PathScope() { set_simd_path(saved_); }

 private:
  SimdPath saved_;
};

ThreadPool& pool_of(int threads) {
  static ThreadPool p1(1), p2(2), p3(3);
  switch (threads) {
    case 1: return p1;
    case 2: return p2;
    default: return p3;
  }
}

std::vector<float> random_floats(size_t count, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& f : v) f = dist(rng);
  return v;
}

// A weight matrix [m, k] stored in `dtype`, plus its exact f32 widening.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> widened;
  TensorView view;
};

Weights make_weights(DType dtype, int64_t m, int64_t k, uint32_t seed) {
  Weights w;
  std::vector<float> v = random_floats(size_t(m * k), seed);
  w.bytes.resize(size_t(m * k) * dtype_size(dtype) + 1);  // +1: data() is valid even for k = 0
  w.widened.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(w.bytes.data() + 4 * i, &v[i], 4);
        w.widened[i] = v[i];
        break;
      case DType::kBF16: {
        uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        w.widened[i] = bf16_to_f32(h);
        break;
      }
      default: {
        uint16_t h = f32_to_f16(v[i]);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        w.widened[i] = f16_to_f32(h);
        break;
      }
    }
  }
  w.view.data = w.bytes.data();
  w.view.dtype = dtype;
  w.view.shape = Shape{m, k};
  return w;
}

struct MatmulCase {
  int64_t n, m, k;
  DType dtype;
  bool accumulate;
  uint32_t seed;
};

// Runs one matmul with padded strides: x padding is NaN (must never be read), y padding is NaN
// (must never be written). Leaves y (with padding) in *y_out for bitwise comparisons.
void run_and_check_matmul(const MatmulCase& c, ThreadPool& pool, std::vector<float>* y_out = nullptr) {
  const int64_t xs = c.k + 3, ys = c.m + 5;
  Weights w = make_weights(c.dtype, c.m, c.k, c.seed);
  std::vector<float> x(size_t(c.n * xs), kNaN);
  std::vector<float> xv = random_floats(size_t(c.n * c.k), c.seed + 1);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t i = 0; i < c.k; ++i) x[size_t(r * xs + i)] = xv[size_t(r * c.k + i)];
  std::vector<float> y(size_t(c.n * ys), kNaN);
  std::vector<float> y0 = random_floats(size_t(c.n * c.m), c.seed + 2, -4.0f, 4.0f);
  if (c.accumulate)
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t j = 0; j < c.m; ++j) y[size_t(r * ys + j)] = y0[size_t(r * c.m + j)];

  if (c.accumulate) {
    matmul_acc(x.data(), c.n, w.view, y.data(), pool, xs, ys);
  } else {
    matmul(x.data(), c.n, w.view, y.data(), pool, xs, ys);
  }

  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t j = 0; j < c.m; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t i = 0; i < c.k; ++i) {
        double p = double(x[size_t(r * xs + i)]) * double(w.widened[size_t(j * c.k + i)]);
        ref += p;
        mag += std::fabs(p);
      }
      double tol = 1e-5 * mag + 1e-30;
      if (c.accumulate) {
        double base = y0[size_t(r * c.m + j)];
        ref += base;
        tol += 1.2e-7 * (std::fabs(base) + mag);
      }
      const float got = y[size_t(r * ys + j)];
      ASSERT_LE(std::fabs(double(got) - ref), tol) << "y[" << r << ", " << j << "] = " << got << ", want " << ref;
    }
    for (int64_t j = c.m; j < ys; ++j) ASSERT_TRUE(std::isnan(y[size_t(r * ys + j)])) << "padding y[" << r << ", " << j << "] written";
  }
  if (y_out != nullptr) *y_out = std::move(y);
}

class CpuKernels : public ::testing::TestWithParam<SimdPath> {
 protected:
  void SetUp() override {
    if (!simd_supported(GetParam())) GTEST_SKIP() << "CPU lacks " << simd_path_name(GetParam());
    scope_.emplace(GetParam());
  }
  void TearDown() override { scope_.reset(); }
  std::optional<PathScope> scope_;
};

TEST_P(CpuKernels, ReportsThePathInUse) { EXPECT_EQ(simd_path(), simd_path_name(GetParam())); }

TEST_P(CpuKernels, MatmulMatchesDoubleReferenceForAllDtypesAndShapes) {
  uint32_t seed = 1;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t k : {1, 7, 16, 33, 64, 257, 1000})
      for (int64_t m : {1, 3, 17, 64, 130})
        for (int64_t n : {1, 2, 5, 64}) {
          if (n == 64 && k * m > 64 * 130) continue;  // the biggest shapes are covered by the n <= 5 loops
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " m=" << m << " k=" << k);
          run_and_check_matmul({n, m, k, dtype, (seed % 2) == 0, seed}, pool_of(3));
          if (HasFatalFailure()) return;
          ++seed;
        }
}

TEST_P(CpuKernels, MatmulAccumulateOnLargeShapes) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    run_and_check_matmul({64, 130, 1000, dtype, true, 77}, pool_of(2));
    run_and_check_matmul({64, 130, 257, dtype, false, 78}, pool_of(2));
  }
}

TEST_P(CpuKernels, MatmulIsBitwiseIdenticalAcrossThreadCounts) {
  struct Shape3 {
    int64_t n, m, k;
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (Shape3 s : {Shape3{1, 130, 1000}, Shape3{5, 130, 257}, Shape3{64, 17, 257}, Shape3{64, 130, 64},
                     Shape3{37, 64, 1000}, Shape3{3, 1030, 64}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << s.n << " m=" << s.m << " k=" << s.k);
      MatmulCase c{s.n, s.m, s.k, dtype, false, 99};
      std::vector<float> y1, y2, y3;
      run_and_check_matmul(c, pool_of(1), &y1);
      run_and_check_matmul(c, pool_of(2), &y2);
      run_and_check_matmul(c, pool_of(3), &y3);
      ASSERT_FALSE(HasFatalFailure());
      ASSERT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
      ASSERT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * 4));
    }
}

// A row's result does not depend on how many rows share the call (one row takes wider weight tiles
// than several; each output is still one accumulator fed in k order).
TEST_P(CpuKernels, MatmulRowIsBitwiseTheSameWhateverTheRowCount) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t k : {257, 1000}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " k=" << k);
      const int64_t m = 130;  // 16 tiles of 8 rows and two single rows, or 32 of 4 and two
      Weights w = make_weights(dtype, m, k, 123);
      std::vector<float> x = random_floats(size_t(9 * k), 124);
      std::vector<float> y1(static_cast<size_t>(m)), yn(static_cast<size_t>(9 * m));
      matmul(x.data(), 1, w.view, y1.data(), pool_of(1));
      for (int64_t n : {2, 5, 9}) {
        matmul(x.data(), n, w.view, yn.data(), pool_of(2));
        ASSERT_EQ(0, std::memcmp(y1.data(), yn.data(), size_t(m) * 4)) << "n=" << n;
      }
    }
}

TEST_P(CpuKernels, MatmulWidensEveryHalfPrecisionBitPattern) {
  // W [65536, 1] holds every 16-bit pattern; x = 1, so y[j] is exactly the widened weight.
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint16_t(i);
  const float one = 1.0f;
  std::vector<float> y(bits.size());
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    TensorView w{bits.data(), dtype, Shape{65536, 1}};
    matmul(&one, 1, w, y.data(), pool_of(2));
    for (size_t i = 0; i < bits.size(); ++i) {
      float want = dtype == DType::kBF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(y[i])) << dtype_name(dtype) << " pattern " << i;
      } else {
        ASSERT_EQ(y[i], want) << dtype_name(dtype) << " pattern " << i;
      }
    }
  }
}

TEST_P(CpuKernels, MatmulWithEmptyDimensions) {
  Weights w = make_weights(DType::kBF16, 5, 0, 3);
  std::vector<float> y(5, kNaN);
  matmul(nullptr, 1, w.view, y.data(), pool_of(2));
  for (float v : y) EXPECT_EQ(v, 0.0f);  // k = 0: the empty sum
  std::vector<float> y2(5, 2.0f);
  matmul_acc(nullptr, 1, w.view, y2.data(), pool_of(2));
  for (float v : y2) EXPECT_EQ(v, 2.0f);
  Weights w2 = make_weights(DType::kF32, 5, 8, 3);
  matmul(nullptr, 0, w2.view, nullptr, pool_of(2));  // n = 0: nothing touched
}

TEST_P(CpuKernels, RmsNormMatchesDoubleReference) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t d : {1, 7, 16, 33, 257, 1000}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " d=" << d);
      const int64_t n = 3;
      Weights w = make_weights(dtype, 1, d, uint32_t(d));
      w.view.shape = Shape{d};
      std::vector<float> x = random_floats(size_t(n * d), uint32_t(d) + 5, -3.0f, 3.0f);
      std::vector<float> out(x.size()), inplace = x;
      const float eps = 1e-5f;
      rms_norm(x.data(), n, d, w.view, eps, out.data());
      rms_norm(inplace.data(), n, d, w.view, eps, inplace.data());
      for (int64_t r = 0; r < n; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < d; ++i) ss += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
        const double scale = 1.0 / std::sqrt(ss / double(d) + double(eps));
        for (int64_t i = 0; i < d; ++i) {
          const double ref = double(x[size_t(r * d + i)]) * scale * w.widened[size_t(i)];
          const size_t at = size_t(r * d + i);
          ASSERT_LE(std::fabs(out[at] - ref), 4e-7 * std::fabs(ref) + 1e-30) << "row " << r << " i " << i;
          ASSERT_EQ(out[at], inplace[at]);
        }
      }
    }
}

TEST_P(CpuKernels, SiluMulMatchesDoubleReference) {
  std::vector<float> g = random_floats(1000, 11, -20.0f, 20.0f);
  for (float s : {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.8f, -88.8f, 100.0f, -100.0f, 200.0f, -200.0f,
                  std::numeric_limits<float>::infinity()})
    g.push_back(s);
  std::vector<float> up = random_floats(g.size(), 12, -2.0f, 2.0f);
  for (size_t count : {size_t(1), size_t(7), size_t(33), g.size()}) {
    std::vector<float> out(g.begin(), g.begin() + ptrdiff_t(count));
    silu_mul(out.data(), up.data(), int64_t(count));
    for (size_t i = 0; i < count; ++i) {
      const double gd = g[i];
      const double ref = gd / (1.0 + std::exp(-gd)) * up[i];
      if (std::isinf(ref)) {
        ASSERT_EQ(double(out[i]), ref) << "g=" << g[i];
        continue;
      }
      ASSERT_LE(std::fabs(out[i] - ref), 1e-6 * std::fabs(ref) + 1e-30) << "g=" << g[i] << " up=" << up[i];
    }
  }
  std::vector<float> nan_gate{kNaN};
  const float one = 1.0f;
  silu_mul(nan_gate.data(), &one, 1);
  EXPECT_TRUE(std::isnan(nan_gate[0]));
}

TEST_P(CpuKernels, ExpIsAccurateOverTheWholeRange) {
  const KernelTable& table = GetParam() == SimdPath::kScalar ? scalar_kernel_table()
                             : GetParam() == SimdPath::kAvx2 ? avx2_kernel_table()
                                                             : avx512_kernel_table();
  std::vector<float> x;
  for (float v = -87.0f; v < 88.5f; v += 0.000731f) x.push_back(v);
  std::vector<float> out(x.size());
  table.exp(x.data(), out.data(), int64_t(x.size()));
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(out[i] / std::exp(double(x[i])) - 1.0));
  EXPECT_LE(worst, 2e-7);
  std::vector<float> edge{-1000.0f, -104.0f, 89.0f, 1000.0f, -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::infinity(), kNaN, 0.0f};
  std::vector<float> e(edge.size());
  table.exp(edge.data(), e.data(), int64_t(edge.size()));
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_LE(e[1], 1e-44f);
  EXPECT_TRUE(std::isinf(e[2]) && e[2] > 0);
  EXPECT_TRUE(std::isinf(e[3]) && e[3] > 0);
  EXPECT_EQ(e[4], 0.0f);
  EXPECT_TRUE(std::isinf(e[5]));
  EXPECT_TRUE(std::isnan(e[6]));
  EXPECT_EQ(e[7], 1.0f);
}

TEST_P(CpuKernels, SoftmaxMatchesDoubleReference) {
  for (int64_t n : {1, 7, 16, 33, 257, 1000}) {
    SCOPED_TRACE(n);
    std::vector<float> x = random_floats(size_t(n), uint32_t(n), -15.0f, 15.0f);
    std::vector<float> got = x;
    softmax_inplace(got.data(), n);
    double mx = x[0], sum = 0.0;
    for (float v : x) mx = std::max(mx, double(v));
    for (float v : x) sum += std::exp(double(v) - mx);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(double(x[size_t(i)]) - mx) / sum;
      ASSERT_LE(std::fabs(got[size_t(i)] - ref), 2e-6 * ref + 1e-30) << "i=" << i;
    }
  }
  std::vector<float> big{-1e30f, 0.0f, 1e30f};  // one dominant element
  softmax_inplace(big.data(), 3);
  EXPECT_EQ(big[0], 0.0f);
  EXPECT_EQ(big[1], 0.0f);
  EXPECT_EQ(big[2], 1.0f);
  softmax_inplace(nullptr, 0);
}

TEST_P(CpuKernels, DotAndAxpyMatchDoubleReference) {
  for (int64_t n : {1, 7, 16, 33, 64, 257, 1000}) {
    SCOPED_TRACE(n);
    std::vector<float> a = random_floats(size_t(n), uint32_t(n)), b = random_floats(size_t(n), uint32_t(n) + 1);
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(a[size_t(i)]) * b[size_t(i)];
      mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
    }
    EXPECT_LE(std::fabs(dot_f32(a.data(), b.data(), n) - ref), 1e-5 * mag + 1e-30);

    std::vector<float> y = b;
    y.push_back(kNaN);  // one past the end: must stay untouched
    axpy(-0.75f, a.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = double(b[size_t(i)]) - 0.75 * double(a[size_t(i)]);
      ASSERT_LE(std::fabs(y[size_t(i)] - want), 1.2e-7 * (std::fabs(b[size_t(i)]) + std::fabs(0.75 * a[size_t(i)])));
    }
    EXPECT_TRUE(std::isnan(y.back()));
  }
  EXPECT_EQ(dot_f32(nullptr, nullptr, 0), 0.0f);
  axpy(1.0f, nullptr, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuKernels, ::testing::ValuesIn(kAllPaths),
                         [](const ::testing::TestParamInfo<SimdPath>& info) {
                           return std::string(simd_path_name(info.param));
                         });

TEST(CpuKernelsDispatch, PathNamesRoundTrip) {
  for (SimdPath p : kAllPaths) EXPECT_EQ(simd_path_from_name(simd_path_name(p)), p);
  EXPECT_THROW(simd_path_from_name("avx1024"), InputError);
  EXPECT_THROW(simd_path_from_name(""), InputError);
  EXPECT_TRUE(simd_supported(SimdPath::kScalar));
}

TEST(CpuKernelsDispatch, UnsupportedPathIsRefused) {
  for (SimdPath p : kAllPaths) {
    if (!simd_supported(p)) {
      EXPECT_THROW(set_simd_path(p), InputError) << simd_path_name(p);
    }
  }
}

TEST(CpuKernelsDispatch, EnvironmentForcesThePath) {
  const SimdPath saved = current_simd_path();
  ASSERT_EQ(0, setenv("TANDEM_SIMD", "scalar", 1));
  reload_simd_path_from_env();
  EXPECT_STREQ(simd_path(), "scalar");
  ASSERT_EQ(0, setenv("TANDEM_SIMD", "sse9", 1));
  try {
    reload_simd_path_from_env();
    ADD_FAILURE() << "TANDEM_SIMD=sse9 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
  for (SimdPath p : kAllPaths) {
    ASSERT_EQ(0, setenv("TANDEM_SIMD", std::string(simd_path_name(p)).c_str(), 1));
    if (simd_supported(p)) {
      reload_simd_path_from_env();
      EXPECT_EQ(current_simd_path(), p);
    } else {
      EXPECT_THROW(reload_simd_path_from_env(), InputError);
    }
  }
  ASSERT_EQ(0, unsetenv("TANDEM_SIMD"));
  reload_simd_path_from_env();  // the best path
  for (SimdPath p : kAllPaths) {
    if (simd_supported(p)) {
      EXPECT_GE(int(current_simd_path()), int(p));
    }
  }
  set_simd_path(saved);
}

TEST(CpuKernelsDeathTest, MatmulRejectsNonFloatWeights) {
  std::vector<int32_t> data(4);
  TensorView w{data.data(), DType::kI32, Shape{2, 2}};
  float x[2] = {1, 2}, y[2];
  EXPECT_DEATH(matmul(x, 1, w, y, pool_of(1)), "matmul weight dtype I32");
}

// ---- the thread pool ------------------------------------------------------------------------------

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool& pool = pool_of(threads);
    for (int64_t n : {0, 1, 2, 5, 16, 17, 100, 1000}) {
      for (int64_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_TRUE(b < e && e <= n && (e - b >= std::min(grain, n) || e == n));
          for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " " << n << " " << i;
      }
    }
  }
}

TEST(ThreadPool, StdFunctionOverloadAndManyBackToBackJobs) {
  ThreadPool& pool = pool_of(3);
  std::vector<int64_t> sums(64);
  const std::function<void(int64_t, int64_t)> fn = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sums[size_t(i)] += i;
  };
  for (int rep = 0; rep < 2000; ++rep) pool.parallel_for(64, 1, fn);
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(sums[size_t(i)], 2000 * i);
}

TEST(ThreadPool, RunOnAllRunsEachThreadOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool& pool = pool_of(threads);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(threads));
      pool.run_on_all([&](int index) {
        ASSERT_TRUE(index >= 0 && index < threads);
        seen[size_t(index)].fetch_add(1);
      });
      for (auto& s : seen) ASSERT_EQ(s.load(), 1);
      // Interleave with range jobs: an all-job must never be mistaken for a range job.
      std::atomic<int64_t> total{0};
      pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
      ASSERT_EQ(total.load(), 10);
    }
  }
}

TEST(ThreadPool, WorkersThatFellAsleepStillJoin) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin time: workers block
    std::vector<std::atomic<int>> seen(3);
    pool.run_on_all([&](int index) { seen[size_t(index)].fetch_add(1); });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

// No spin: every worker sleeps between jobs, so each job goes through the wake-up path.
TEST(ThreadPool, WorkersThatNeverSpinStillCoverEveryJob) {
  ThreadPool pool(3, /*spin_us=*/0);
  std::vector<int64_t> sums(48);
  for (int rep = 0; rep < 300; ++rep) {
    pool.parallel_for(48, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sums[size_t(i)] += i;
    });
    std::vector<std::atomic<int>> seen(3);
    pool.run_on_all([&](int index) { seen[size_t(index)].fetch_add(1); });
    for (auto& x : seen) ASSERT_EQ(x.load(), 1);
  }
  for (int64_t i = 0; i < 48; ++i) ASSERT_EQ(sums[size_t(i)], 300 * i);
}

TEST(ThreadPoolDeathTest, NestedParallelForIsAnError) {
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        pool.parallel_for(8, 1, [&](int64_t, int64_t) { pool.parallel_for(8, 1, [](int64_t, int64_t) {}); });
      },
      "from inside a task");
}

}  // namespace
}  // namespace tandem::cpu
