// The CPU peer's expert pass on a few rows: run_experts_cpu over experts of one shape (default
// flash-mini's: hidden 2048, inter 512, bf16), rotated through more memory than the caches hold, as the
// peer streams its cold experts every step. Per (pages, threads, rows, cold slots per row): µs per call
// (median, p90) and the touched experts' bytes ÷ median time; beside it the same bytes read by a plain
// sum in one fork/join over the same threads (what one pass of that size could reach).
// Usage: bench_expert_pass [--threads 8,12] [--rows 1,8] [--slots 1,2] [--pages 4k,huge]
//   [--hidden 2048] [--inter 512] [--pool-mib 1024] [--calls 1500] [--out FILE.json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "moe/experts.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::ExpertWeights;
using tandem::HostBuffer;
using tandem::ThreadPool;

struct ExpertPool {
  HostBuffer buf;
  std::vector<ExpertWeights> experts;
  size_t expert_bytes = 0;
};

// n experts of [inter, hidden] gate/up and [hidden, inter] down in bf16, one after another in `buf`.
ExpertPool make_experts(int64_t hidden, int64_t inter, size_t pool_bytes, bool huge) {
  ExpertPool p;
  const size_t mat = size_t(hidden * inter) * 2;
  p.expert_bytes = 3 * mat;
  const int64_t n = std::max<int64_t>(4, int64_t(pool_bytes / p.expert_bytes));
  p.buf = HostBuffer(size_t(n) * p.expert_bytes, huge);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  std::vector<uint16_t> one(size_t(hidden * inter));
  for (auto& v : one) v = tandem::f32_to_bf16(dist(rng));
  for (int64_t e = 0; e < n; ++e) {
    uint8_t* base = p.buf.data() + size_t(e) * p.expert_bytes;
    for (int m = 0; m < 3; ++m) std::memcpy(base + size_t(m) * mat, one.data(), mat);
    ExpertWeights w;
    w.gate = {base, tandem::DType::kBF16, tandem::Shape{inter, hidden}};
    w.up = {base + mat, tandem::DType::kBF16, tandem::Shape{inter, hidden}};
    w.down = {base + 2 * mat, tandem::DType::kBF16, tandem::Shape{hidden, inter}};
    p.experts.push_back(w);
  }
  return p;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU peer expert pass on a few rows"};
  std::vector<int> thread_counts = {8, 12}, row_counts = {1, 8}, slot_counts = {1, 2};
  std::vector<std::string> page_kinds = {"4k", "huge"};
  std::string out_path;
  int64_t hidden = 2048, inter = 512, pool_mib = 1024, calls = 1500;
  app.add_option("--threads", thread_counts, "thread counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--rows", row_counts, "token rows per call, comma-separated")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--slots", slot_counts, "cold experts per row (distinct across the call), comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--pages", page_kinds, "memory backing the experts: 4k, huge, or both comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"4k", "huge"}));
  app.add_option("--hidden", hidden, "hidden size")->check(CLI::PositiveNumber);
  app.add_option("--inter", inter, "expert intermediate size")->check(CLI::PositiveNumber);
  app.add_option("--pool-mib", pool_mib, "experts rotated through (MiB; above the L3)")->check(CLI::PositiveNumber);
  app.add_option("--calls", calls, "timed calls per cell")->check(CLI::PositiveNumber);
  app.add_option("--out", out_path, "write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    nlohmann::json report;
    report["hidden"] = hidden;
    report["inter"] = inter;
    report["thp"] = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled");
    report["cpus"] = std::thread::hardware_concurrency();
    fmt::print("experts {}x{} bf16 ({:.2f} MB each), THP: {}\n", inter, hidden, 6.0 * double(hidden * inter) / 1e6,
               report["thp"].get<std::string>());
    fmt::print("{:>5} {:>4} {:>4} {:>5}  {:>9} {:>9} {:>8}  {:>11} {:>8}\n", "pages", "thr", "rows", "slots", "p50 us",
               "p90 us", "GB/s", "sum p50 us", "GB/s");
    for (const std::string& pages : page_kinds) {
      ExpertPool pool = make_experts(hidden, inter, size_t(pool_mib) << 20, pages == "huge");
      const int64_t n_exp = int64_t(pool.experts.size());
      const double huge_share = double(pool.buf.huge_bytes()) / double(pool.buf.size());
      for (int threads : thread_counts) {
        ThreadPool tp(threads);
        for (int rows : row_counts) {
          for (int slots : slot_counts) {
            if (int64_t(rows) * slots > n_exp / 2) tandem::fail("{} rows x {} slots need a larger --pool-mib", rows, slots);
            std::vector<float> x(size_t(rows * hidden), 0.01f), out(size_t(rows * hidden));
            std::vector<int32_t> ids(size_t(rows * slots));
            std::vector<float> w(ids.size(), 0.5f);
            int64_t cursor = 0;
            std::vector<double> pass, sum;
            std::vector<double> partial(size_t(threads) * 8);
            for (int64_t c = 0; c < calls + 50; ++c) {
              for (auto& id : ids) id = int32_t(cursor++ % n_exp);
              auto t0 = Clock::now();
              tandem::run_experts_cpu(pool.experts, x.data(), rows, hidden, ids.data(), w.data(), slots, out.data(), tp);
              auto t1 = Clock::now();
              // The same experts' bytes read once more by a plain sum (other experts: not in cache).
              for (auto& id : ids) id = int32_t(cursor++ % n_exp);
              auto t2 = Clock::now();
              tp.run_on_all([&](int t) {
                float acc[16] = {};
                for (int32_t id : ids) {
                  const auto* f = reinterpret_cast<const float*>(pool.experts[size_t(id)].gate.data);
                  const int64_t n = int64_t(pool.expert_bytes / 4), per = n / threads / 16 * 16;
                  const int64_t b = per * t, e = t == threads - 1 ? n : b + per;
                  for (int64_t i = b; i + 16 <= e; i += 16)
                    for (int j = 0; j < 16; ++j) acc[j] += f[i + j];
                }
                double s = 0;
                for (float a : acc) s += a;
                partial[size_t(t) * 8] = s;
              });
              auto t3 = Clock::now();
              if (c < 50) continue;
              pass.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
              sum.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
            }
            const double bytes = double(pool.expert_bytes) * double(rows * slots);
            const double p50 = percentile(pass, 0.5), p90 = percentile(pass, 0.9), s50 = percentile(sum, 0.5);
            fmt::print("{:>5} {:>4} {:>4} {:>5}  {:9.1f} {:9.1f} {:8.1f}  {:11.1f} {:8.1f}\n", pages, threads, rows,
                       slots, p50, p90, bytes / p50 / 1e3, s50, bytes / s50 / 1e3);
            report["cells"].push_back({{"pages", pages}, {"huge_share", huge_share}, {"threads", threads},
                                       {"rows", rows}, {"slots", slots}, {"pass_p50_us", p50},
                                       {"pass_p90_us", p90}, {"pass_gb_s", bytes / p50 / 1e3},
                                       {"sum_p50_us", s50}, {"sum_gb_s", bytes / s50 / 1e3}});
            if (partial[0] == 1.2345) fmt::print(" ");
          }
        }
      }
      fmt::print("  ({} pages: {:.0f}% of the experts' memory huge-page backed)\n", pages, 100.0 * huge_share);
    }
    if (!out_path.empty()) {
      std::ofstream f(out_path);
      if (!f) tandem::fail("cannot write {}", out_path);
      f << report.dump(2) << "\n";
      fmt::print("wrote {}\n", out_path);
    }
  } catch (const tandem::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return tandem::kExitBadInput;
  }
  return 0;
}
