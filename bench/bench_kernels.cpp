// Kernel benchmark: the machine's read bandwidth (the bound for decode), the pool's dispatch
// overhead, and GEMV/GEMM throughput of cpu::matmul on model-shaped weights for 1..N threads, with
// the weights rotated through a buffer larger than the caches so they stream from DRAM as in decode.
// Prints a table and writes JSON (--out). Usage: bench_kernels [--threads N] [--out FILE.json]
//   [--simd scalar|avx2|avx512] [--bw-mib 1024] [--weights-mib 1024] [--min-ms 150]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::DType;
using tandem::ThreadPool;
namespace cpu = tandem::cpu;

// Seconds per call of f(i), i counting calls, repeated until at least min_s has passed.
template <class F>
double seconds_per_call(F&& f, double min_s) {
  f(0);
  int64_t iters = 1;
  for (;;) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) f(i + 1);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s >= min_s || iters >= (int64_t(1) << 30)) return s / double(iters);
    iters = s <= 0 ? iters * 16 : std::max(iters * 2, int64_t(double(iters) * min_s * 1.2 / s));
  }
}

// GB/s of a multi-threaded sum over `floats` floats (best of 3 passes).
double read_bandwidth(const std::vector<float>& buf, ThreadPool& pool) {
  const int64_t n = int64_t(buf.size());
  std::vector<double> partial(size_t(pool.size()) * 8);  // one cache line per thread
  double best = 0.0, sink = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    pool.run_on_all([&](int t) {
      const int64_t per = (n / pool.size()) / 32 * 32;
      const int64_t b = per * t, e = t == pool.size() - 1 ? n : b + per;
      float acc[32] = {};
      for (int64_t i = b; i + 32 <= e; i += 32)
        for (int j = 0; j < 32; ++j) acc[j] += buf[size_t(i + j)];
      double s = 0.0;
      for (float a : acc) s += a;
      partial[size_t(t) * 8] = s;
    });
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    for (int t = 0; t < pool.size(); ++t) sink += partial[size_t(t) * 8];
    best = std::max(best, double(n) * 4.0 / secs / 1e9);
  }
  if (sink == 1.2345) fmt::print(" ");  // keeps the sum alive
  return best;
}

struct WeightSet {
  std::vector<uint8_t> bytes;  // `copies` consecutive [m, k] matrices
  int64_t m = 0, k = 0, copies = 0;
  DType dtype = DType::kBF16;
  size_t matrix_bytes() const { return size_t(m * k) * tandem::dtype_size(dtype); }
  tandem::TensorView view(int64_t i) const {
    return {bytes.data() + size_t(i % copies) * matrix_bytes(), dtype, tandem::Shape{m, k}};
  }
};

WeightSet make_weights(int64_t m, int64_t k, DType dtype, int64_t total_bytes) {
  WeightSet w;
  w.m = m;
  w.k = k;
  w.dtype = dtype;
  w.copies = std::max<int64_t>(1, total_bytes / int64_t(w.matrix_bytes()));
  w.bytes.resize(w.matrix_bytes() * size_t(w.copies));
  // One random matrix, copied: the copies only have to be distinct memory.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  const size_t count = size_t(m * k);
  for (size_t i = 0; i < count; ++i) {
    float v = dist(rng);
    switch (dtype) {
      case DType::kF32: std::memcpy(w.bytes.data() + 4 * i, &v, 4); break;
      case DType::kBF16: {
        uint16_t h = tandem::f32_to_bf16(v);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        break;
      }
      default: {
        uint16_t h = tandem::f32_to_f16(v);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        break;
      }
    }
  }
  for (int64_t c = 1; c < w.copies; ++c)
    std::memcpy(w.bytes.data() + size_t(c) * w.matrix_bytes(), w.bytes.data(), w.matrix_bytes());
  return w;
}

struct GemvShape {
  const char* name;
  int64_t m, k;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU kernel benchmark"};
  int max_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::string out_path, simd;
  int64_t bw_mib = 1024, weights_mib = 1024;  // above the L3 of big servers (300 MiB)
  double min_ms = 150;
  app.add_option("--threads", max_threads, "largest thread count (runs 1..N)")->check(CLI::PositiveNumber);
  app.add_option("--out", out_path, "write the results as JSON to this file");
  app.add_option("--simd", simd, "force a SIMD path: scalar, avx2, avx512");
  app.add_option("--bw-mib", bw_mib, "buffer for the read-bandwidth test (MiB)")->check(CLI::PositiveNumber);
  app.add_option("--weights-mib", weights_mib, "weight copies rotated per shape (MiB)")->check(CLI::PositiveNumber);
  app.add_option("--min-ms", min_ms, "minimum time per measurement (ms)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    if (!simd.empty()) cpu::set_simd_path(cpu::simd_path_from_name(simd));
    const double min_s = min_ms / 1e3;
    nlohmann::json report;
    report["simd_path"] = cpu::simd_path();
    report["max_threads"] = max_threads;
    fmt::print("SIMD path: {}   threads: 1..{}\n", cpu::simd_path(), max_threads);

    std::vector<int> thread_counts;
    for (int t = 1; t <= max_threads; t = t < 4 ? t + 1 : t * 2) thread_counts.push_back(t);
    if (thread_counts.back() != max_threads) thread_counts.push_back(max_threads);
    std::vector<std::unique_ptr<ThreadPool>> pools;
    for (int t : thread_counts) pools.push_back(std::make_unique<ThreadPool>(t));

    // Read bandwidth.
    std::vector<double> bw(thread_counts.size());
    {
      std::vector<float> buf(size_t(bw_mib) << 18, 1.0f);
      fmt::print("\nread bandwidth ({} MiB buffer)\n", bw_mib);
      for (size_t i = 0; i < pools.size(); ++i) {
        bw[i] = read_bandwidth(buf, *pools[i]);
        fmt::print("  {:3d} threads  {:7.1f} GB/s\n", thread_counts[i], bw[i]);
        report["read_bandwidth"].push_back({{"threads", thread_counts[i]}, {"gb_s", bw[i]}});
      }
    }

    // Pool overhead: an empty parallel_for over 4 items per thread, and run_on_all.
    fmt::print("\nthread pool overhead (per call)\n");
    for (size_t i = 0; i < pools.size(); ++i) {
      ThreadPool& pool = *pools[i];
      const int64_t items = 4 * pool.size();
      double pf = seconds_per_call([&](int64_t) { pool.parallel_for(items, 1, [](int64_t, int64_t) {}); }, min_s);
      double all = seconds_per_call([&](int64_t) { pool.run_on_all([](int) {}); }, min_s);
      fmt::print("  {:3d} threads  parallel_for {:6.2f} us   run_on_all {:6.2f} us\n", pool.size(), pf * 1e6,
                 all * 1e6);
      report["pool_overhead"].push_back(
          {{"threads", pool.size()}, {"parallel_for_us", pf * 1e6}, {"run_on_all_us", all * 1e6}});
    }

    // matmul.
    const GemvShape shapes[] = {{"attn 2048x2048", 2048, 2048},        {"dense ffn 5632x2048", 5632, 2048},
                                {"ffn down 2048x5632", 2048, 5632},    {"expert up 512x2048", 512, 2048},
                                {"expert down 2048x512", 2048, 512}};
    const int64_t row_counts[] = {1, 4, 8, 64};
    fmt::print("\nmatmul y[n,m] = x[n,k]·W[m,k]^T, bf16 weights streamed from a {} MiB rotation\n", weights_mib);
    fmt::print("  {:<22} {:>3} {:>4}  {:>9} {:>8} {:>8} {:>8}\n", "shape", "n", "thr", "us/call", "GB/s", "%bw",
               "GFLOP/s");
    for (const GemvShape& s : shapes) {
      WeightSet w = make_weights(s.m, s.k, DType::kBF16, weights_mib << 20);
      for (int64_t n : row_counts) {
        std::vector<float> x(size_t(n * s.k), 0.5f), y(size_t(n * s.m));
        for (size_t i = 0; i < pools.size(); ++i) {
          ThreadPool& pool = *pools[i];
          double t = seconds_per_call([&](int64_t it) { cpu::matmul(x.data(), n, w.view(it), y.data(), pool); }, min_s);
          const double gbs = double(w.matrix_bytes()) / t / 1e9;
          const double gflops = 2.0 * double(n * s.m * s.k) / t / 1e9;
          fmt::print("  {:<22} {:>3} {:>4}  {:9.1f} {:8.1f} {:7.0f}% {:8.1f}\n", s.name, n, pool.size(), t * 1e6, gbs,
                     100.0 * gbs / bw[i], gflops);
          report["matmul"].push_back({{"shape", s.name}, {"m", s.m}, {"k", s.k}, {"n", n}, {"dtype", "BF16"},
                                      {"threads", pool.size()}, {"us", t * 1e6}, {"weight_gb_s", gbs},
                                      {"fraction_of_read_bw", gbs / bw[i]}, {"gflop_s", gflops}});
        }
      }
    }

    // Every weight dtype and every supported path, one shape, all threads: how the paths compare.
    fmt::print("\npaths and dtypes, 2048x2048, {} threads\n", pools.back()->size());
    const cpu::SimdPath chosen = cpu::current_simd_path();
    for (cpu::SimdPath path : {cpu::SimdPath::kScalar, cpu::SimdPath::kAvx2, cpu::SimdPath::kAvx512}) {
      if (!cpu::simd_supported(path)) continue;
      cpu::set_simd_path(path);
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        WeightSet w = make_weights(2048, 2048, dtype, weights_mib << 20);
        for (int64_t n : {int64_t(1), int64_t(8)}) {
          std::vector<float> x(size_t(n * 2048), 0.5f), y(size_t(n * 2048));
          double t = seconds_per_call([&](int64_t it) { cpu::matmul(x.data(), n, w.view(it), y.data(), *pools.back()); },
                                      min_s);
          const double gbs = double(w.matrix_bytes()) / t / 1e9;
          fmt::print("  {:<7} {:<5} n={:<2} {:9.1f} us {:8.1f} GB/s {:8.1f} GFLOP/s\n", cpu::simd_path(),
                     tandem::dtype_name(dtype), n, t * 1e6, gbs, 2.0 * double(n) * 2048 * 2048 / t / 1e9);
          report["paths"].push_back({{"path", cpu::simd_path()}, {"dtype", tandem::dtype_name(dtype)}, {"n", n},
                                     {"us", t * 1e6}, {"weight_gb_s", gbs}});
        }
      }
    }
    cpu::set_simd_path(chosen);

    // Elementwise kernels (single thread, in cache).
    fmt::print("\nelementwise (1 thread)\n");
    {
      std::vector<float> a(8192, 0.25f), b(8192, 0.5f);
      std::vector<uint16_t> wn(4096, tandem::f32_to_bf16(1.0f));
      tandem::TensorView norm_w{wn.data(), DType::kBF16, tandem::Shape{4096}};
      float sink = 0.0f;
      struct Item {
        const char* name;
        double us;
      };
      std::vector<Item> items = {
          {"rms_norm d=4096 bf16", 1e6 * seconds_per_call([&](int64_t) { cpu::rms_norm(a.data(), 1, 4096, norm_w, 1e-6f, b.data()); }, min_s)},
          {"silu_mul 5632", 1e6 * seconds_per_call([&](int64_t) { cpu::silu_mul(a.data(), b.data(), 5632); std::fill(a.begin(), a.begin() + 5632, 0.25f); }, min_s)},
          {"softmax 4096", 1e6 * seconds_per_call([&](int64_t) { std::fill(a.begin(), a.begin() + 4096, 0.25f); cpu::softmax_inplace(a.data(), 4096); }, min_s)},
          {"dot 128", 1e6 * seconds_per_call([&](int64_t) { sink += cpu::dot_f32(a.data(), b.data(), 128); }, min_s)},
          {"axpy 128", 1e6 * seconds_per_call([&](int64_t) { cpu::axpy(1e-9f, a.data(), b.data(), 128); }, min_s)},
      };
      for (const Item& it : items) {
        fmt::print("  {:<22} {:8.3f} us\n", it.name, it.us);
        report["elementwise"].push_back({{"kernel", it.name}, {"us", it.us}});
      }
      if (sink == 1.2345f) fmt::print(" ");
    }

    if (!out_path.empty()) {
      std::ofstream f(out_path);
      if (!f) tandem::fail("cannot write {}", out_path);
      f << report.dump(2) << "\n";
      fmt::print("\nwrote {}\n", out_path);
    }
  } catch (const tandem::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return tandem::kExitBadInput;
  }
  return 0;
}
