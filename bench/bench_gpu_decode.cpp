// Decode speed of the CUDA engine's lanes: for each batch size, prefill that many sequences, then
// time decode steps (graph replays, logits back to the host each step) and compare the step time with
// its memory bound: bytes the step must read (all non-expert weights but the embedding, plus every
// routed expert the step touched, counted from the routing of a probe step) over HBM bandwidth, and
// for the host lane the cold experts' bytes over the PCIe link. The peer lane needs a running
// `tandem peer` (--peer NAME) serving --rowmap R; --write-rowmap R writes the stand-in placement (the
// --cold-fraction highest ids of every MoE layer) for it and exits. With --rowmap every split lane uses
// its cold lists. Peer rows add handoffs per step, wait p50/p99 (histogram upper bounds), overruns and
// the cold share of routed slots. --pdl 0|1|both: programmatic dependent launch off, on (default), or
// bracketed off, on, off on the same engine for every batch size (graphs recaptured at each switch; the
// on row's "vs off" is the mean of the two off runs over it). --breakdown N: instead of timing steps,
// runs N eager steps (no graphs, no PDL) under a KernelProfile and prints each kernel's GPU time per
// step (launches of one kernel on different grids apart). Prints a table; --json writes it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"

#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"

namespace tandem {
namespace {

constexpr double kHbm = 4.4e12, kPcie = 51e9;  // measured on the H200 box (BRIEF)

struct Args {
  std::string model, lanes = "local,host", batches = "1,8,16,32", json, peer, rowmap, write_rowmap, pdl = "1";
  uint64_t spin_limit_us = 2000;
  double cold_fraction = 89.0 / 384.0;
  int steps = 64, prompt = 16, ctx = 1024, breakdown = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) out.push_back(t);
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Upper bound (µs) of the bucket holding quantile q of the histogram delta.
uint64_t hist_quantile(const peer::ClientStats& b, const peer::ClientStats& e, double q) {
  uint64_t total = e.handoffs - b.handoffs, seen = 0;
  if (total == 0) return 0;
  const uint64_t target = uint64_t(std::ceil(q * double(total)));
  for (int i = 0; i < peer::kWaitBuckets; ++i) {
    seen += e.wait_hist[size_t(i)] - b.wait_hist[size_t(i)];
    if (seen >= target) return uint64_t(1) << i;
  }
  return 0;
}

int run(const Args& a) {
  auto model = Model::load(a.model);
  const auto& c = model->cfg;
  if (!a.write_rowmap.empty()) {
    auto cold = cold_tail(c, a.cold_fraction);
    Rowmap rm;
    rm.fingerprint = model_fingerprint(c, model->store);
    rm.source.mode = "bench";
    rm.source.policy = "cold-tail";
    rm.source.budget = fmt::format("cold fraction {}", a.cold_fraction);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      if (!c.layer_is_moe[size_t(l)]) continue;
      RowmapLayer layer;
      layer.layer = l;
      std::vector<bool> is_cold(size_t(c.n_expert), false);
      for (int32_t e : cold[size_t(l)]) is_cold[size_t(e)] = true;
      for (int64_t e = 0; e < c.n_expert; ++e) (is_cold[size_t(e)] ? layer.cold : layer.hot).push_back(int32_t(e));
      rm.layers.push_back(layer);
    }
    rm.finalize();
    rm.save(a.write_rowmap);
    fmt::print(stderr, "wrote {}\n", a.write_rowmap);
    return 0;
  }
  std::unique_ptr<Rowmap> rowmap;
  if (!a.rowmap.empty()) {
    rowmap = std::make_unique<Rowmap>(Rowmap::load(a.rowmap));
    validate(*rowmap, c, model_fingerprint(c, model->store), a.rowmap);
  }
  // Bytes every step reads whatever the routing: all weights but the embedding and the routed experts.
  size_t routed = 0;
  const size_t total = model->store.total_bytes();
  for (const auto& L : model->layers)
    for (const auto& e : L.experts) routed += e.present() ? e.nbytes() : 0;
  const size_t fixed = total - routed - model->embed.nbytes();
  const size_t expert_bytes = c.n_expert > 0 ? 3 * size_t(c.moe_intermediate_size) * c.hidden_size *
                                                   dtype_size(model->layers.back().experts[0].gate.dtype)
                                             : 0;
  std::vector<bool> pdl_modes;
  if (a.pdl == "0") pdl_modes = {false};
  else if (a.pdl == "1") pdl_modes = {true};
  else if (a.pdl == "both") pdl_modes = {false, true, false};
  else fail("--pdl: expected 0, 1 or both, got '{}'", a.pdl);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> table;
  for (const std::string& lane : split(a.lanes)) {
    CudaOptions co;
    std::vector<std::vector<int32_t>> cold(size_t(c.n_layer));
    auto cold_lists = [&] {
      if (!rowmap) return cold_tail(c, a.cold_fraction);
      std::vector<std::vector<int32_t>> out(size_t(c.n_layer));
      for (const auto& l : rowmap->layers) out[size_t(l.layer)] = l.cold;
      return out;
    };
    if (lane == "host") {
      co.lane = CudaLane::kHost;
      co.cold = cold = cold_lists();
    } else if (lane == "peer") {
      if (a.peer.empty() || !rowmap) fail("--lanes peer needs --peer NAME and --rowmap R (a running `tandem peer`)");
      co.lane = CudaLane::kPeer;
      co.cold = cold = cold_lists();
      co.peer = a.peer;
      co.peer_fingerprint = lane_fingerprint(*rowmap);
      co.peer_spin_limit_us = a.spin_limit_us;
    } else if (lane != "local") {
      fail("--lanes: unknown lane '{}'", lane);
    }
    if (a.breakdown > 0) co.graphs = false, co.pdl = false;  // eager and serial: every kernel timed alone
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
      // Fresh sequences with the same prompts before every timed run, so each run (PDL off, on, off)
      // decodes over the same context lengths: attention's cost grows with the context.
      auto fresh = [&] {
        for (int s : seqs) engine->remove_sequence(s);
        seqs.clear();
        items.clear();
        for (int b = 0; b < B; ++b) {
          seqs.push_back(engine->add_sequence());
          prompts[size_t(b)].clear();
          for (int i = 0; i < a.prompt; ++i) prompts[size_t(b)].push_back(int32_t((b * 131 + i * 17 + 3) % c.vocab_size));
          items.push_back({seqs.back(), prompts[size_t(b)]});
        }
        engine->forward(items);
      };
      fresh();
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
      const double bytes = double(fixed + hot_b + cold_b);
      const double hbm_ms = double(fixed + hot_b + cold_b) / kHbm * 1e3;
      const double link_ms = double(cold_b) / kPcie * 1e3;
      const double bound = std::max(double(fixed + hot_b) / kHbm * 1e3, link_ms);
      if (a.breakdown > 0) {
        step(1);
        KernelProfile prof;
        for (int s = 0; s < a.breakdown; ++s) {
          prof.begin_step();
          step(2 + s);
          prof.end_step();
        }
        const auto kt = prof.totals();
        double sum = 0;
        for (const auto& k : kt) sum += k.total_us;
        const double n = double(prof.steps());
        table.push_back(fmt::format("{} lane, {} sequence(s), context {}..{}: {:.1f} us of kernels per step "
                                    "(HBM bound {:.1f} us)",
                                    lane, B, a.prompt + 2, a.prompt + 1 + a.breakdown, sum / n, hbm_ms * 1e3));
        table.push_back(fmt::format("  {:>9} {:>6} {:>7} {:>9}  {}", "us/step", "share", "calls", "us/call", "kernel [grid]"));
        nlohmann::json ks = nlohmann::json::array();
        for (const auto& k : kt) {
          table.push_back(fmt::format("  {:>9.1f} {:>5.1f}% {:>7.1f} {:>9.2f}  {}", k.total_us / n, 100 * k.total_us / sum,
                                      double(k.calls) / n, k.total_us / double(k.calls), k.name));
          ks.push_back({{"kernel", k.name}, {"us_per_step", k.total_us / n}, {"calls_per_step", double(k.calls) / n}});
        }
        rows.push_back({{"lane", lane}, {"batch", B}, {"prompt", a.prompt}, {"steps", a.breakdown},
                        {"kernel_us_per_step", sum / n}, {"hbm_bound_ms", hbm_ms}, {"kernels", ks}});
        for (int s : seqs) engine->remove_sequence(s);
        continue;
      }
      std::vector<double> off_ms;
      struct OnRun {
        size_t row;  // in table and rows
        double ms;
      };
      std::vector<OnRun> on_runs;
      for (const bool want_pdl : pdl_modes) {
        const bool pdl = cuda_set_pdl(*engine, want_pdl);
        fresh();
        int s_next = 1;
        for (int i = 0; i < 3; ++i) step(s_next++);  // eager, capture, replay
        const auto p0 = cuda_peer_stats(*engine);
        const double t1 = now();
        for (int s = 0; s < a.steps; ++s) step(s_next++);
        const double ms = (now() - t1) / a.steps * 1e3;
        const auto p1 = cuda_peer_stats(*engine);
        std::string peer_cols;
        nlohmann::json peer_json;
        if (p0 && p1) {
          const uint64_t h = p1->client.handoffs - p0->client.handoffs;
          const double share = p1->routed_slots > p0->routed_slots
                                   ? double(p1->cold_slots - p0->cold_slots) / double(p1->routed_slots - p0->routed_slots)
                                   : 0.0;
          const uint64_t p50 = hist_quantile(p0->client, p1->client, 0.5), p99 = hist_quantile(p0->client, p1->client, 0.99);
          const double mean_us = h ? double(p1->client.wait_ns_total - p0->client.wait_ns_total) / double(h) / 1e3 : 0.0;
          peer_cols = fmt::format("  handoffs/step {:.1f} wait mean {:.1f} us p50 <{} us p99 <{} us overruns {} cold {:.1f}%",
                                  double(h) / a.steps, mean_us, p50, p99, p1->client.overruns - p0->client.overruns,
                                  100 * share);
          peer_json = {{"handoffs", h}, {"wait_mean_us", mean_us}, {"wait_p50_us_below", p50}, {"wait_p99_us_below", p99},
                       {"overruns", p1->client.overruns - p0->client.overruns}, {"cold_share", share}};
        }
        rows.push_back({{"lane", lane}, {"batch", B}, {"pdl", pdl}, {"ms_per_step", ms}, {"tokens_per_s", B / ms * 1e3},
                        {"bytes_per_step", bytes}, {"cold_bytes_per_step", cold_b}, {"hbm_bound_ms", hbm_ms},
                        {"link_bound_ms", link_ms}, {"bound_ms", bound}, {"peer", peer_json}});
        table.push_back(fmt::format("{:<6} {:>3} {:>3} {:>9.3f} {:>10.0f} {:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f} {:>6.2f}", lane,
                                    B, pdl ? "on" : "off", ms, B / ms * 1e3, bytes / 1e9, double(cold_b) / 1e9, hbm_ms,
                                    bound, ms / bound) +
                        peer_cols);
        fmt::print(stderr, "{}\n", table.back());
        if (pdl) on_runs.push_back({table.size() - 1, ms});
        else off_ms.push_back(ms);
      }
      // Bracketed runs: the on run against the mean of the off runs around it, with their spread.
      if (!off_ms.empty()) {
        const auto [lo, hi] = std::minmax_element(off_ms.begin(), off_ms.end());
        double off_mean = 0;
        for (double m : off_ms) off_mean += m / double(off_ms.size());
        for (const auto& on : on_runs) {
          table[on.row] += fmt::format("  vs off {:.3f}x (off {:.3f}..{:.3f} ms)", off_mean / on.ms, *lo, *hi);
          rows[on.row]["speedup_vs_pdl_off"] = off_mean / on.ms;
        }
      }
      for (int s : seqs) engine->remove_sequence(s);
    }
  }
  fmt::print("{:<6} {:>3} {:>3} {:>9} {:>10} {:>8} {:>8} {:>9} {:>9} {:>6}\n", "lane", "B", "pdl", "ms/step", "tok/s",
             "GB/step", "cold GB", "HBM ms", "bound ms", "x bnd");
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
    else if (k == "--peer") a.peer = v;
    else if (k == "--rowmap") a.rowmap = v;
    else if (k == "--write-rowmap") a.write_rowmap = v;
    else if (k == "--peer-spin-limit") a.spin_limit_us = std::stoull(v);
    else if (k == "--pdl") a.pdl = v;
    else if (k == "--breakdown") a.breakdown = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "usage: bench_gpu_decode --model DIR [--lanes local,host] [--batches 1,8,16,32] "
                         "[--steps N] [--prompt N] [--ctx N] [--cold-fraction F] [--json FILE] [--peer NAME --rowmap R] "
                         "[--peer-spin-limit US] [--write-rowmap R] [--pdl 0|1|both] [--breakdown STEPS]\n");
    return 2;
  }
  try {
    return tandem::run(a);
  } catch (const tandem::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
#else
int main() {
  std::fprintf(stderr, "bench_gpu_decode: built without the CUDA backend\n");
  return 77;
}
#endif
