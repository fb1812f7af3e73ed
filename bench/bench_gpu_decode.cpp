// Decode speed of the CUDA engine's lanes: for each batch size, prefill that many sequences, then
// time decode steps (graph replays, logits back to the host each step) and compare the step time with
// its memory bound: bytes the step must read (all non-expert weights but the embedding, plus every
// routed expert the step touched, counted from the routing of a probe step) over HBM bandwidth, and
// for the host lane the cold experts' bytes over the PCIe link. Prints a table; --json writes it.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"

#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"

namespace tandem {
namespace {

constexpr double kHbm = 4.4e12, kPcie = 51e9;  // measured on the H200 box (BRIEF)

struct Args {
  std::string model, lanes = "local,host", batches = "1,8,16,32", json;
  double cold_fraction = 89.0 / 384.0;
  int steps = 64, prompt = 16, ctx = 1024;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) out.push_back(t);
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int run(const Args& a) {
  auto model = Model::load(a.model);
  const auto& c = model->cfg;
  // Bytes every step reads whatever the routing: all weights but the embedding and the routed experts.
  size_t routed = 0;
  const size_t total = model->store.total_bytes();
  for (const auto& L : model->layers)
    for (const auto& e : L.experts) routed += e.present() ? e.nbytes() : 0;
  const size_t fixed = total - routed - model->embed.nbytes();
  const size_t expert_bytes = c.n_expert > 0 ? 3 * size_t(c.moe_intermediate_size) * c.hidden_size *
                                                   dtype_size(model->layers.back().experts[0].gate.dtype)
                                             : 0;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> table;
  for (const std::string& lane : split(a.lanes)) {
    CudaOptions co;
    std::vector<std::vector<int32_t>> cold(size_t(c.n_layer));
    if (lane == "host") {
      co.lane = CudaLane::kHost;
      co.cold = cold = cold_tail(c, a.cold_fraction);
    } else if (lane != "local") {
      fail("--lanes: unknown lane '{}'", lane);
    }
    EngineOptions eo;
    eo.max_seqs = 32;
    eo.max_ctx = a.ctx;
    double t0 = now();
    auto engine = make_cuda_engine(*model, eo, co);
    fmt::print(stderr, "{} lane: engine ready in {:.1f} s\n", lane, now() - t0);
    for (const std::string& bs : split(a.batches)) {
      const int B = std::stoi(bs);
      std::vector<int> seqs;
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B)), next(static_cast<size_t>(B));
      std::vector<Engine::Item> items;
      for (int b = 0; b < B; ++b) {
        seqs.push_back(engine->add_sequence());
        for (int i = 0; i < a.prompt; ++i) prompts[size_t(b)].push_back(int32_t((b * 131 + i * 17 + 3) % c.vocab_size));
        items.push_back({seqs.back(), prompts[size_t(b)]});
      }
      engine->forward(items);
      auto step = [&](int s) {
        items.clear();
        for (int b = 0; b < B; ++b) {
          next[size_t(b)] = {int32_t((s * 7919 + b * 104729) % c.vocab_size)};
          items.push_back({seqs[size_t(b)], next[size_t(b)]});
        }
        engine->forward(items);
      };
      // Probe step (eager, hooked): which experts a step touches, hot and cold.
      size_t hot_b = 0, cold_b = 0;
      engine->hooks.on_routing = [&](int64_t l, const Routing& r) {
        std::set<int32_t> used(r.ids.begin(), r.ids.end());
        std::set<int32_t> cl(cold[size_t(l)].begin(), cold[size_t(l)].end());
        for (int32_t e : used) (cl.count(e) ? cold_b : hot_b) += expert_bytes;
      };
      step(0);
      engine->hooks = {};
      for (int s = 1; s <= 3; ++s) step(s);  // eager, capture, replay
      const double t1 = now();
      for (int s = 0; s < a.steps; ++s) step(4 + s);
      const double ms = (now() - t1) / a.steps * 1e3;
      for (int s : seqs) engine->remove_sequence(s);
      const double bytes = double(fixed + hot_b + cold_b);
      const double hbm_ms = double(fixed + hot_b + cold_b) / kHbm * 1e3;
      const double link_ms = double(cold_b) / kPcie * 1e3;
      const double bound = std::max(double(fixed + hot_b) / kHbm * 1e3, link_ms);
      rows.push_back({{"lane", lane}, {"batch", B}, {"ms_per_step", ms}, {"tokens_per_s", B / ms * 1e3},
                      {"bytes_per_step", bytes}, {"cold_bytes_per_step", cold_b}, {"hbm_bound_ms", hbm_ms},
                      {"link_bound_ms", link_ms}, {"bound_ms", bound}});
      table.push_back(fmt::format("{:<6} {:>3} {:>9.3f} {:>10.0f} {:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f} {:>6.2f}", lane, B, ms,
                                  B / ms * 1e3, bytes / 1e9, double(cold_b) / 1e9, hbm_ms, bound, ms / bound));
      fmt::print(stderr, "{}\n", table.back());
    }
  }
  fmt::print("{:<6} {:>3} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>6}\n", "lane", "B", "ms/step", "tok/s", "GB/step",
             "cold GB", "HBM ms", "bound ms", "x bnd");
  for (const auto& t : table) fmt::print("{}\n", t);
  if (!a.json.empty()) std::ofstream(a.json) << rows.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--lanes") a.lanes = v;
    else if (k == "--batches") a.batches = v;
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--prompt") a.prompt = std::stoi(v);
    else if (k == "--ctx") a.ctx = std::stoi(v);
    else if (k == "--cold-fraction") a.cold_fraction = std::stod(v);
    else if (k == "--json") a.json = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "usage: bench_gpu_decode --model DIR [--lanes local,host] [--batches 1,8,16,32] "
                         "[--steps N] [--prompt N] [--ctx N] [--cold-fraction F] [--json FILE]\n");
    return 2;
  }
  try {
    return tandem::run(a);
  } catch (const tandem::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
#else
int main() {
  std::fprintf(stderr, "bench_gpu_decode: built without the CUDA backend\n");
  return 77;
}
#endif
