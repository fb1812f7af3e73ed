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
// on row's "vs off" is the mean of the two off runs over it). --variants V1,V2,...: instead, the timed
// runs of each batch size go through these configurations in turn on one engine (Variant below:
// PDL, the engine's kernel policy, a kernel launched twice; cuda_diagnostics.h), each row against the
// mean of the first variant's runs ("base,x2:attention,base": attention's share of the step).
// --breakdown N: instead of timing steps, runs N eager steps (no graphs, no PDL) under a KernelProfile
// and prints each kernel's GPU time per step (launches of one kernel on different grids apart). The
// HBM bandwidth of the bound is measured on
// the device at start (cuda_read_bandwidth_gbps: a kernel streaming 2 GiB once, best of five) unless
// --hbm-gbps gives it; the link's (the host lane's cold bytes) likewise, cuda_host_read_bandwidth_gbps
// (the GPU reading 512 MiB of pinned host memory), when a lane other than local runs, unless --link-gbps
// gives it. Prints a table; --json writes it.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"
#include "runtime/lane_plan.h"

#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_diagnostics.h"
#include "backends/cuda/cuda_engine.h"

namespace tandem {
namespace {

// One timed configuration of the engine (--variants): tokens joined by '+', e.g. "rows2+mma0". Each
// changes one field of the engine's CudaKernelPolicy (kernel_policy.h) from the product's default.
//   base     PDL on, the kernels' default choices (CudaKernelPolicy{})
//   pdl0     PDL off
//   rowsN    expert kernels take at most N rows per pass (1, 2, 4, 8)
//   mmaN     projections of at least N rows on the tensor cores (mma0: never)
//   ksN      warps per feature of the CUDA-core projection at one row (ks0: by the grid; 1, 2, 4)
//   ktN      the choice by the grid (ks0) aims for N blocks a multiprocessor (default 2)
//   chunkN   MLA attention's split blocks take at least N positions (default 16)
//   prep     MLA decode steps launch mla_prep (q_a's norm, the new cache entries) as prefill does
//   fusedN   MLA decode steps of at most N rows run as one cluster launch (mla_decode.cuh; fused0: never)
//   route0|1 one-row steps without a peer route in a launch of their own (route0) or in the expert
//            gate_up blocks (route1, the default: expert_gate_up_routed_kernel)
//   pfm0|1   the fused MLA decode asks L2 for its layer's o_proj, router and shared expert weights
//            (pfm1, the default) or not (pfm0)
//   ef0|1    the expert kernels' weight loads evict-first in L2 (ef1, the default) or evict-normal (ef0)
//   cl4|8    the fused MLA decode's blocks per (row, head) cluster (default 4; mla_decode.cuh)
//   x2:NAME  kernels whose name contains NAME are launched twice (KernelRepeat): the step's time
//            less the reference's is their share of the critical path (the results are wrong)
// Variants that lost their A/B were removed with their code (count, nprep, coN, cl16): git keeps
// them, bench/RESULTS.md says why.
struct Variant {
  std::string label;
  bool pdl = true;
  CudaKernelPolicy policy;
  std::string twice;
};

Variant parse_variant(const std::string& spec) {
  Variant v;
  v.label = spec;
  std::stringstream ss(spec);
  std::string t;
  auto number = [&](size_t skip) {
    const std::string d = t.substr(skip);
    if (d.empty() || d.size() > 4 || d.find_first_not_of("0123456789") != std::string::npos)
      fail("--variants: '{}' needs a number after '{}'", t, t.substr(0, skip));
    return std::stoi(d);
  };
  while (std::getline(ss, t, '+')) {
    if (t == "base") continue;
    if (t == "pdl0") v.pdl = false;
    else if (t == "rows1" || t == "rows2" || t == "rows4" || t == "rows8") v.policy.expert_max_rows = number(4);
    else if (t.rfind("mma", 0) == 0) v.policy.linear_mma_min_rows = number(3);
    else if (t == "ks0" || t == "ks1" || t == "ks2" || t == "ks4") v.policy.linear_row_split = number(2);
    else if (t.rfind("kt", 0) == 0) v.policy.linear_split_target = number(2);
    else if (t.rfind("chunk", 0) == 0) v.policy.mla_min_chunk = number(5);
    else if (t == "prep") v.policy.mla_fresh_rows = false;
    else if (t.rfind("fused", 0) == 0) v.policy.mla_fused_rows = number(5);
    else if (t == "route0" || t == "route1") v.policy.moe_route_in_gate_up = t == "route1";
    else if (t == "pfm0" || t == "pfm1") v.policy.mla_prefetch_moe = t == "pfm1";
    else if (t == "ef0" || t == "ef1") v.policy.expert_evict_first = t == "ef1";
    else if (t == "cl4" || t == "cl8") v.policy.mla_cluster = number(2);
    else if (t.rfind("x2:", 0) == 0 && t.size() > 3) v.twice = t.substr(3);
    else if (t == "count" || t == "nprep" || t == "cl16" || (t.rfind("co", 0) == 0 && t.size() > 2 && std::isdigit(t[2])))
      fail("--variants: '{}' was removed with its kernel variant, which lost its A/B (bench/RESULTS.md, \"Why the "
           "defaults are what they are\"; the code is in git)", t);
    else fail("--variants: unknown token '{}' (base, pdl0, rows1|2|4|8, mmaN, ks0|1|2|4, ktN, chunkN, prep, fusedN, route0|1, pfm0|1, ef0|1, cl4|8, x2:NAME)", t);
  }
  return v;
}

struct Args {
  std::string model, lanes = "local,host", batches = "1,8,16,32", json, peer, rowmap, write_rowmap, pdl = "1",
      variants;
  uint64_t spin_limit_us = 2000;
  double cold_fraction = 89.0 / 384.0;
  int steps = 64, prompt = 16, ctx = 1024, breakdown = 0;
  double hbm_gbps = 0;   // 0: measured on the device
  double link_gbps = 0;  // 0: measured on the device when a lane reads over the link
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
    const Rowmap rm = cold_tail_rowmap(c, model_fingerprint(c, model->store), a.cold_fraction);
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
  const bool hbm_measured = !(a.hbm_gbps > 0);
  const double hbm_gbps = hbm_measured ? cuda_read_bandwidth_gbps(0) : a.hbm_gbps;
  const double kHbm = hbm_gbps * 1e9;
  fmt::print(stderr, "HBM bandwidth for the bound: {:.0f} GB/s ({})\n", hbm_gbps,
             hbm_measured ? "measured: 2 GiB read once, best of 5" : "--hbm-gbps");
  const auto lane_list = split(a.lanes);
  const bool uses_link = std::any_of(lane_list.begin(), lane_list.end(), [](const auto& l) { return l != "local"; });
  const bool link_measured = uses_link && !(a.link_gbps > 0);
  const double link_gbps = link_measured ? cuda_host_read_bandwidth_gbps(0) : a.link_gbps;
  const double kPcie = link_gbps * 1e9;
  if (uses_link)
    fmt::print(stderr, "link bandwidth for the bound: {:.1f} GB/s ({})\n", link_gbps,
               link_measured ? "measured: the GPU reading 512 MiB of pinned host memory" : "--link-gbps");
  std::vector<Variant> variants;
  auto variant = [&](const std::string& spec) { return parse_variant(spec); };
  if (!a.variants.empty()) {
    for (const std::string& spec : split(a.variants)) variants.push_back(variant(spec));
  } else if (a.pdl == "0") {
    variants = {variant("pdl0")};
  } else if (a.pdl == "1") {
    variants = {variant("base")};
  } else if (a.pdl == "both") {
    variants = {variant("pdl0"), variant("base"), variant("pdl0")};
  } else {
    fail("--pdl: expected 0, 1 or both, got '{}'", a.pdl);
  }
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> table;
  for (const std::string& lane : lane_list) {
    // The lane's plan as every command makes it (runtime/lane_plan.h): the rowmap's cold lists, or the
    // host lane's stand-in; for the peer lane the fingerprint its peer publishes.
    const Lane ln = parse_lane(lane, "--lanes");
    if (ln == Lane::kSplit) fail("--lanes split: use `tandem bench` (its peer chooses the cut)");
    if (ln == Lane::kPeer && (a.peer.empty() || !rowmap))
      fail("--lanes peer needs --peer NAME and --rowmap R (a running `tandem peer`)");
    LanePlan plan = LanePlan::local(c.n_layer);
    if (ln == Lane::kHost)
      plan = rowmap ? LanePlan::from_rowmap(ln, *rowmap, c.n_layer) : LanePlan::from_stand_in(ln, c, a.cold_fraction);
    if (ln == Lane::kPeer)
      plan = LanePlan::from_rowmap(ln, *rowmap, c.n_layer, a.peer, 0, cold_weights_fingerprint(*model, *rowmap));
    CudaOptions co;
    co.lane = ln == Lane::kHost ? CudaLane::kHost : ln == Lane::kPeer ? CudaLane::kPeer : CudaLane::kLocal;
    co.cold = plan.cold;
    co.peer = plan.peer;
    co.peer_fingerprint = plan.lane_fp;
    co.peer_spin_limit_us = a.spin_limit_us;
    const auto& cold = plan.cold;
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
      const double link_ms = cold_b > 0 ? double(cold_b) / kPcie * 1e3 : 0.0;
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
                        {"kernel_us_per_step", sum / n}, {"hbm_bound_ms", hbm_ms}, {"hbm_gbps", hbm_gbps},
                        {"hbm_gbps_measured", hbm_measured}, {"kernels", ks}});
        for (int s : seqs) engine->remove_sequence(s);
        continue;
      }
      std::vector<double> ref_ms;  // runs of the first variant
      struct Run {
        size_t row;  // in table and rows
        double ms;
      };
      std::vector<Run> other_runs;
      for (const Variant& v : variants) {
        const bool pdl = cuda_set_pdl(*engine, v.pdl);  // drops the graphs
        cuda_set_kernel_policy(*engine, v.policy);
        double ms = 0;
        std::optional<CudaPeerStats> p0, p1;
        {
          std::optional<KernelRepeat> twice;
          if (!v.twice.empty()) twice.emplace(v.twice);
          fresh();
          int s_next = 1;
          for (int i = 0; i < 3; ++i) step(s_next++);  // eager, capture, replay
          p0 = cuda_peer_stats(*engine);
          const double t1 = now();
          for (int s = 0; s < a.steps; ++s) step(s_next++);
          ms = (now() - t1) / a.steps * 1e3;
          p1 = cuda_peer_stats(*engine);
        }
        cuda_drop_graphs(*engine);  // none captured with a repeat outlives it
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
        rows.push_back({{"lane", lane}, {"batch", B}, {"pdl", pdl}, {"variant", v.label}, {"ms_per_step", ms},
                        {"tokens_per_s", B / ms * 1e3}, {"bytes_per_step", bytes}, {"cold_bytes_per_step", cold_b},
                        {"hbm_bound_ms", hbm_ms}, {"link_bound_ms", link_ms}, {"bound_ms", bound},
                        {"hbm_gbps", hbm_gbps}, {"hbm_gbps_measured", hbm_measured}, {"link_gbps", link_gbps},
                        {"link_gbps_measured", link_measured}, {"peer", peer_json},
                        {"expert_max_rows", v.policy.expert_max_rows},
                        {"linear_mma_min_rows", v.policy.linear_mma_min_rows},
                        {"linear_row_split", v.policy.linear_row_split},
                        {"linear_split_target", v.policy.linear_split_target},
                        {"mla_min_chunk", v.policy.mla_min_chunk},
                        {"mla_fresh_rows", v.policy.mla_fresh_rows},
                        {"mla_fused_rows", v.policy.mla_fused_rows},
                        {"moe_route_in_gate_up", v.policy.moe_route_in_gate_up},
                        {"mla_prefetch_moe", v.policy.mla_prefetch_moe},
                        {"mla_cluster", v.policy.mla_cluster},
                        {"expert_evict_first", v.policy.expert_evict_first}});
        table.push_back(fmt::format("{:<6} {:>3} {:>3} {:>9.3f} {:>10.0f} {:>8.3f} {:>8.3f} {:>9.3f} {:>9.3f} {:>6.2f}", lane,
                                    B, pdl ? "on" : "off", ms, B / ms * 1e3, bytes / 1e9, double(cold_b) / 1e9, hbm_ms,
                                    bound, ms / bound) +
                        (variants.size() > 1 || v.label != "base" ? "  " + v.label : "") + peer_cols);
        fmt::print(stderr, "{}\n", table.back());
        if (v.label == variants.front().label) ref_ms.push_back(ms);
        else other_runs.push_back({table.size() - 1, ms});
      }
      // Bracketed runs: every other variant against the mean of the first variant's runs, with their
      // spread (--pdl both: the on run against the off runs around it).
      if (!ref_ms.empty()) {
        const auto [lo, hi] = std::minmax_element(ref_ms.begin(), ref_ms.end());
        double ref_mean = 0;
        for (double m : ref_ms) ref_mean += m / double(ref_ms.size());
        const std::string& ref = variants.front().label;
        for (const auto& o : other_runs) {
          table[o.row] += fmt::format("  vs {} {:.3f}x, {:+.1f} us ({} {:.3f}..{:.3f} ms)", ref, ref_mean / o.ms,
                                      (o.ms - ref_mean) * 1e3, ref, *lo, *hi);
          rows[o.row]["vs_first_variant"] = ref_mean / o.ms;
          if (ref == "pdl0") rows[o.row]["speedup_vs_pdl_off"] = ref_mean / o.ms;
        }
      }
      for (int s : seqs) engine->remove_sequence(s);
    }
  }
  if (uses_link)
    fmt::print("bound: HBM {:.0f} GB/s ({}), link {:.1f} GB/s ({})\n", hbm_gbps, hbm_measured ? "measured" : "given",
               link_gbps, link_measured ? "measured" : "given");
  else
    fmt::print("bound: HBM {:.0f} GB/s ({})\n", hbm_gbps, hbm_measured ? "measured" : "given");
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
    else if (k == "--variants") a.variants = v;
    else if (k == "--breakdown") a.breakdown = std::stoi(v);
    else if (k == "--hbm-gbps" || k == "--link-gbps") {
      char* end = nullptr;
      double& gbps = k == "--hbm-gbps" ? a.hbm_gbps : a.link_gbps;
      gbps = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(gbps > 0)) {
        std::fprintf(stderr, "error: %s: '%s' is not a bandwidth in GB/s above 0\n", k.c_str(), v.c_str());
        return 2;
      }
    }
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.model.empty()) {
    std::fprintf(stderr, "usage: bench_gpu_decode --model DIR [--lanes local,host] [--batches 1,8,16,32] "
                         "[--steps N] [--prompt N] [--ctx N] [--cold-fraction F] [--json FILE] [--peer NAME --rowmap R] "
                         "[--peer-spin-limit US] [--write-rowmap R] [--pdl 0|1|both] [--variants V1,V2,...] "
                         "[--breakdown STEPS] [--hbm-gbps GBPS (default: measured)] [--link-gbps GBPS (default: measured)]\n");
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
