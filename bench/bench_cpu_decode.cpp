// CPU decode benchmark: tokens/s for 1 and N sequences on a model (the `mid` preset by default),
// next to the memory-bandwidth bound: bytes of weights each step touches (non-expert weights plus the
// distinct experts the step's routing selected, counted from the routing itself) ÷ the machine's
// measured read bandwidth. Usage:
//   bench_cpu_decode --model DIR [--users 1,4] [--tokens 32] [--threads N] [--out FILE.json]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"
#include "engine/generate.h"

using namespace tandem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Multi-threaded read bandwidth over a buffer much larger than the caches (GB/s, best of 5).
double measure_read_bandwidth(ThreadPool& pool, size_t bytes) {
  std::vector<uint64_t> buf(bytes / 8);
  pool.parallel_for(int64_t(buf.size()), 1 << 16, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) buf[size_t(i)] = uint64_t(i);
  });
  double best = 0;
  std::vector<uint64_t> sums(size_t(pool.size()) * 8);
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = now();
    pool.run_on_all([&](int t) {
      const int64_t n = int64_t(buf.size()), per = (n + pool.size() - 1) / pool.size();
      const int64_t a = std::min(n, t * per), b = std::min(n, a + per);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = a; i + 3 < b; i += 4) {
        s0 += buf[size_t(i)];
        s1 += buf[size_t(i + 1)];
        s2 += buf[size_t(i + 2)];
        s3 += buf[size_t(i + 3)];
      }
      sums[size_t(t) * 8] = s0 + s1 + s2 + s3;
    });
    best = std::max(best, double(bytes) / (now() - t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU decode tokens/s next to the memory-bandwidth bound"};
  std::string model_dir, out;
  std::vector<int> users{1, 4};
  int tokens = 32, threads = 0;
  app.add_option("--model", model_dir)->required();
  app.add_option("--users", users)->delimiter(',');
  app.add_option("--tokens", tokens, "decode steps per run");
  app.add_option("--threads", threads);
  app.add_option("--out", out, "write JSON here");
  CLI11_PARSE(app, argc, argv);
  set_global_threads(threads);
  ThreadPool& pool = global_pool();
  auto model = Model::load(model_dir);
  const auto& c = model->cfg;

  // Non-expert bytes every token reads: everything except routed experts, embeddings (one row) and
  // the output head counted whole.
  size_t total = model->store.total_bytes(), routed = 0, expert_bytes = 0;
  for (const auto& L : model->layers)
    for (const auto& e : L.experts)
      if (e.present()) {
        routed += e.nbytes();
        expert_bytes = e.nbytes();
      }
  const size_t fixed = total - routed - model->embed.nbytes() + (c.tie_word_embeddings ? model->embed.nbytes() : 0);
  const double bw = measure_read_bandwidth(pool, size_t(1) << 30);
  fmt::print("model {} | {} threads | simd {} | read bandwidth {:.1f} GB/s\n", model_dir, pool.size(),
             cpu::simd_path(), bw);

  nlohmann::json rows = nlohmann::json::array();
  for (int u : users) {
    CpuEngine engine(*model, EngineOptions{u, 4096});
    std::vector<GenerateRequest> reqs(static_cast<size_t>(u));
    for (int i = 0; i < u; ++i) {
      for (int t = 0; t < 16; ++t) reqs[size_t(i)].prompt.push_back(int32_t((i * 131 + t * 17) % c.vocab_size));
      reqs[size_t(i)].max_tokens = tokens + 1;
    }
    // Count distinct experts per decode step (rows == users) from the routing.
    double touched_sum = 0;
    int64_t decode_layers = 0;
    engine.hooks.on_routing = [&](int64_t, const Routing& r) {
      if (r.n_rows != u) return;
      std::set<int32_t> distinct(r.ids.begin(), r.ids.end());
      touched_sum += double(distinct.size());
      ++decode_layers;
    };
    GenerateStats st;
    generate(engine, reqs, {}, &st);
    const double steps = double(st.decode_steps);
    const double step_s = st.decode_seconds / steps;
    const double experts_per_step = decode_layers ? touched_sum / double(decode_layers) * double(c.n_moe_layers()) : 0;
    const double bytes = double(fixed) + experts_per_step * double(expert_bytes);
    const double bound_s = bytes / (bw * 1e9);
    const double tps = double(u) / step_s;
    fmt::print("users {:>2}: {:8.2f} tokens/s total ({:7.2f} ms/step); bound {:.2f} ms/step "
               "({:.1f} MB/step); {:.0f}% of bound\n",
               u, tps, step_s * 1e3, bound_s * 1e3, bytes / 1e6, 100.0 * bound_s / step_s);
    rows.push_back({{"users", u}, {"tokens_per_second", tps}, {"step_ms", step_s * 1e3}, {"bound_ms", bound_s * 1e3},
                    {"bytes_per_step", bytes}, {"fraction_of_bound", bound_s / step_s}, {"decode_steps", steps}});
  }
  if (!out.empty()) {
    nlohmann::json j = {{"bench", "cpu_decode"}, {"model", model_dir}, {"threads", pool.size()},
                        {"simd", cpu::simd_path()}, {"read_bandwidth_gbps", bw}, {"hardware_threads", std::thread::hardware_concurrency()},
                        {"results", rows}};
    std::ofstream(out) << j.dump(2) << "\n";
  }
  return 0;
}
