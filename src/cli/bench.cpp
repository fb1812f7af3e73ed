// `tandem bench`: bracketed lane comparisons on one box in one run. For every cell (corpus kind ×
// number of users) the listed lanes run in order (A, B, A), each greedy over the same prompts, and
// the report gives decode tokens/s, the ratio to the first lane with the spread of its repeats, the
// peer's handoff waits and overruns, the cold share of routed slots, and the step time next to its
// memory bound. Every runtime is built before the first timed run, so a missing peer fails early.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "bench/bound.h"
#include "bench/report.h"
#include "cli/command.h"
#include "cli/common.h"
#include "engine/generate.h"
#include "io/corpus.h"
#include "io/tokenizer.h"
#include "runtime/runtime.h"

namespace tandem::cli {
namespace {

using bench::LaneRun;

struct Opts {
  ModelOptions model;
  std::vector<std::string> lanes, kinds;
  std::vector<int64_t> users = {1, 8, 16, 32};
  std::string corpus, out_dir = "bench/results", label, machine;
  int64_t tokens = 64, prompt_tokens = 64, warmup_tokens = 5, probe_tokens = 0;  // probe 0: --tokens
  bench::Bandwidths bw;
};

std::string today() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), out;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    std::string arg = all.substr(start, end - start);
    const bool plain = !arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789-_./:=,+@%") == std::string::npos;
    if (!out.empty()) out += ' ';
    if (plain) {
      out += arg;
    } else {
      out += '\'';
      for (char ch : arg) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      out += '\'';
    }
    start = end + 1;
  }
  return out;
}

nlohmann::json machine_info(const Opts& o) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json m = {{"hostname", host}, {"nproc", sysconf(_SC_NPROCESSORS_ONLN)}, {"threads", o.model.threads}};
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      m["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  if (o.model.device != "cpu") {
    // The driver's own description, readable without the CUDA runtime.
    std::vector<std::string> gpus;
    std::error_code ec;
    for (const auto& d : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
      std::ifstream info(d.path() / "information");
      for (std::string line; std::getline(info, line);)
        if (line.rfind("Model:", 0) == 0) gpus.push_back(line.substr(line.find_first_not_of(" \t", 6)));
    }
    m["gpu"] = gpus.empty() ? nlohmann::json(nullptr) : nlohmann::json(gpus);
  }
  if (!o.machine.empty()) m["note"] = o.machine;
  return m;
}

// The first prompt_tokens tokens of up to `want` documents of `kind` that have that many.
std::vector<std::vector<int32_t>> prompts_of(const std::vector<CorpusDoc>& docs, const std::string& kind,
                                             const Tokenizer& tok, int64_t prompt_tokens, size_t want,
                                             const std::string& corpus) {
  std::vector<std::vector<int32_t>> out;
  for (const CorpusDoc& d : docs) {
    if (d.kind != kind || out.size() >= want) continue;
    // Tokenize a prefix first (documents can be long); cut at a UTF-8 character boundary.
    size_t cut = std::min(d.text.size(), size_t(prompt_tokens) * 16);
    while (cut < d.text.size() && (static_cast<unsigned char>(d.text[cut]) & 0xC0) == 0x80) --cut;
    std::vector<int32_t> ids = tok.encode(std::string_view(d.text).substr(0, cut));
    if (int64_t(ids.size()) < prompt_tokens && cut < d.text.size()) ids = tok.encode(d.text);
    if (int64_t(ids.size()) < prompt_tokens) continue;
    ids.resize(size_t(prompt_tokens));
    out.push_back(std::move(ids));
  }
  if (out.empty())
    fail("--kinds {}: no document of this kind in {} has {} tokens (--prompt-tokens)", kind, corpus, prompt_tokens);
  return out;
}

std::vector<GenerateRequest> requests_for(const std::vector<std::vector<int32_t>>& prompts, int64_t users,
                                          int64_t max_tokens) {
  std::vector<GenerateRequest> reqs(static_cast<size_t>(users));
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = prompts[i % prompts.size()];
    reqs[i].max_tokens = max_tokens;  // greedy (default sampling), no stop ids: EOS is ignored
  }
  return reqs;
}

LaneRun timed_run(Runtime& rt, const std::vector<GenerateRequest>& reqs) {
  std::optional<LaneCounters> after_prefill;
  size_t chosen = 0;
  GenerateOptions go;
  go.on_token = [&](size_t, int32_t) {
    if (++chosen == reqs.size()) after_prefill = rt.lane_counters();
  };
  GenerateStats st;
  generate(*rt.engine, reqs, go, &st);
  const std::optional<LaneCounters> end = rt.lane_counters();
  LaneRun r;
  r.lane = lane_name(rt.lane());
  r.users = int64_t(reqs.size());
  r.decode_steps = st.decode_steps;
  r.prefill_s = st.prefill_seconds;
  r.decode_s = st.decode_seconds;
  if (after_prefill && end) {
    bench::LaneCounters c;
    const auto &a = after_prefill->client, &b = end->client;
    c.handoffs = b.handoffs - a.handoffs;
    c.overruns = b.overruns - a.overruns;
    c.wait_mean_us = c.handoffs ? double(b.wait_ns_total - a.wait_ns_total) / double(c.handoffs) / 1e3 : 0;
    std::vector<uint64_t> hist(b.wait_hist.size());
    for (size_t i = 0; i < hist.size(); ++i) hist[i] = b.wait_hist[i] - a.wait_hist[i];
    c.wait_p50_us = bench::hist_percentile_us(hist, 0.5);
    c.wait_p99_us = bench::hist_percentile_us(hist, 0.99);
    r.counters = c;
    const uint64_t routed = end->routed_slots - after_prefill->routed_slots;
    if (routed) {
      r.cold_share = double(end->cold_slots - after_prefill->cold_slots) / double(routed);
      r.cold_share_source = "counters";
    }
  }
  return r;
}

int run(Opts o) {
  for (auto* list : {&o.lanes, &o.kinds}) std::erase(*list, std::string());
  if (o.lanes.empty()) fail("--lanes is empty (e.g. host,peer,host)");
  std::vector<Lane> lanes;
  for (const std::string& l : o.lanes) lanes.push_back(parse_lane(l, "--lanes"));
  if (o.kinds.empty()) fail("--kinds is empty (e.g. prose,code_python)");
  if (o.users.empty()) fail("--users is empty (e.g. 1,8,16,32)");
  for (int64_t u : o.users)
    if (u < 1) fail("--users: {} is not a number of users (>= 1)", u);
  if (o.tokens < 2) fail("--tokens {}: need at least 2 (the first token comes from prefill)", o.tokens);
  if (o.prompt_tokens < 1) fail("--prompt-tokens {}: need at least 1", o.prompt_tokens);
  if (o.probe_tokens == 0) o.probe_tokens = o.tokens;
  if (o.warmup_tokens < 1 || o.probe_tokens < 2) fail("--warmup-tokens must be >= 1 and --probe-tokens >= 2");
  for (double g : {o.bw.hbm_gbps, o.bw.dram_gbps, o.bw.link_gbps})
    if (!(g >= 0) || !std::isfinite(g))
      fail("bandwidths (--hbm-gbps, --dram-gbps, --link-gbps) must be > 0 GB/s, or 0 to measure them");
  std::vector<Lane> distinct;
  for (Lane l : lanes)
    if (std::find(distinct.begin(), distinct.end(), l) == distinct.end()) distinct.push_back(l);
  auto wants = [&](Lane lane) { return std::find(distinct.begin(), distinct.end(), lane) != distinct.end(); };
  if (wants(Lane::kPeer) && wants(Lane::kSplit) && (o.model.split_peer.empty() || o.model.split_peer == o.model.peer))
    fail("--lanes has peer and split: give the split lane its own peer with --split-peer NAME (a `tandem peer --split-share "
         "F|auto` serves it)");
  const RuntimeOptions base = runtime_options(o.model, *std::max_element(o.users.begin(), o.users.end()));
  for (Lane lane : distinct) {
    if (!lane_has_peer(lane)) continue;
    RuntimeOptions ro = base;
    ro.lane = lane;
    if (peer_lane_name(ro).empty())
      fail("--lanes has {}: give --peer NAME (the lane `tandem peer` serves)", lane_name(lane));
    require_peer_served(ro);
  }

  // Inputs first, so bad corpora fail before any model is loaded.
  const auto docs = load_corpus(o.corpus, o.kinds);
  const int64_t max_users = *std::max_element(o.users.begin(), o.users.end());
  const Tokenizer tok = Tokenizer::load(o.model.model_dir + "/tokenizer.json");
  std::map<std::string, std::vector<std::vector<int32_t>>> prompts;
  for (const std::string& kind : o.kinds)
    prompts[kind] = prompts_of(docs, kind, tok, o.prompt_tokens, size_t(max_users), o.corpus);

  const bench::ToMeasure measure =
      bench::bandwidths_to_measure(o.bw, base.device, wants(Lane::kHost) || wants(Lane::kPeer) || wants(Lane::kSplit),
                                   wants(Lane::kPeer) || wants(Lane::kSplit));
  if (measure.any()) {
    const auto t0 = std::chrono::steady_clock::now();
    fmt::print(stderr, "bench: measuring read bandwidths ({}{}{})...\n", measure.hbm ? "HBM " : "",
               measure.link ? "link " : "", measure.dram ? "DRAM" : "");
    bench::measure_bandwidths(o.bw, measure, base.device, o.model.threads);
    fmt::print(stderr, "bench: HBM {:.0f}, link {:.1f}, DRAM {:.1f} GB/s ({:.1f} s)\n", o.bw.hbm_gbps, o.bw.link_gbps,
               o.bw.dram_gbps, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  std::map<Lane, Runtime> runtimes;
  for (Lane lane : distinct) {
    RuntimeOptions ro = base;
    ro.lane = lane;
    if (!lane_has_peer(lane)) {
      ro.peer.clear();
      ro.peer_check = 0;
    }
    if (ro.max_ctx == 0) ro.max_ctx = o.prompt_tokens + std::max({o.tokens, o.warmup_tokens, o.probe_tokens});
    const auto t0 = std::chrono::steady_clock::now();
    try {
      runtimes.emplace(lane, Runtime::open(ro));
    } catch (const OutOfMemoryError& e) {
      // Every lane's engine holds its own copy of the hot weights on the device: name the way out
      // when the lanes already built fill it (three lanes of flash-mini need more than an 80 GB card).
      if (runtimes.empty()) throw;
      std::string held;
      for (const auto& [name, rt] : runtimes) held += (held.empty() ? "" : ", ") + std::string(lane_name(name));
      fail_out_of_memory("lane {}: {}. The lanes built before it ({}) hold their weights on {} too: bench fewer lanes "
                         "in one run, e.g. --lanes {},{},{}",
                         lane_name(lane), e.what(), held, o.model.device, o.lanes[0], lane_name(lane), o.lanes[0]);
    }
    fmt::print(stderr, "bench: lane {} ready on {} in {:.1f} s\n", lane_name(lane), o.model.device,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const Rowmap* rowmap = nullptr;
  std::unique_ptr<Rowmap> own_rowmap;
  for (const auto& [lane, rt] : runtimes)
    if (rt.rowmap) rowmap = rt.rowmap.get();
  Runtime& first = runtimes.at(lanes[0]);
  const Model& model = *first.model;
  if (!rowmap && !o.model.rowmap.empty()) {
    own_rowmap = load_rowmap_for(model, o.model.rowmap);  // the probe's hot/cold when no lane reads it
    rowmap = own_rowmap.get();
  }
  const double fixed = bench::fixed_bytes(model);

  bench::Report report;
  report.date = today();
  std::string dir = o.model.model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  report.label = o.label.empty() ? std::filesystem::path(dir).filename().string() : o.label;
  report.model = o.model.model_dir;
  report.device = o.model.device;
  report.command = command_line();
  report.machine = machine_info(o);
  report.options = {{"lanes", o.lanes},       {"users", o.users},
                    {"kinds", o.kinds},       {"corpus", o.corpus},
                    {"tokens", o.tokens},     {"prompt_tokens", o.prompt_tokens},
                    {"warmup_tokens", o.warmup_tokens}, {"probe_tokens", o.probe_tokens},
                    {"rowmap", o.model.rowmap}, {"peer", o.model.peer}, {"split", o.model.split}, {"split_peer", o.model.split_peer},
                    {"threads", o.model.threads}, {"peer_spin_limit_us", o.model.peer_spin_limit_us},
                    {"host_wait", o.model.host_wait}};
  for (Lane l : lanes)  // what --host-wait (auto by default) came to on each lane
    report.options["host_wait_by_lane"][lane_name(l)] = host_wait_sleeps(base.host_wait, l) ? "sleep" : "spin";
  report.bandwidths = o.bw;
  for (Lane lane : distinct)
    if (lane_has_peer(lane) && !runtimes.at(lane).lane_counters())
      report.notes.push_back(fmt::format("lane {} on {}: the runtime exposes no handoff counters yet; wait, overrun "
                                         "fields are null and the cold share comes from the routing probe",
                                         lane_name(lane), o.model.device));
  report.notes.push_back(fmt::format(
      "Bytes per step: every weight but the routed experts and the embedding ({:.3f} GB), plus the distinct routed "
      "experts the step touched, from a hooked probe run over the same prompts (its first {} decode steps); hot/cold "
      "by the rowmap{}.",
      fixed / 1e9, std::min(o.probe_tokens, o.tokens) - 1, rowmap ? "" : " (none given: every expert hot)"));
  report.notes.push_back(base.device.is_cpu()
                             ? "Paths on --device cpu: the primary and the peer read the same DRAM, so every byte "
                               "counts against --dram-gbps."
                             : "Paths on cuda: local = all HBM; host = cold experts over the link; peer = cold experts "
                               "from the peer CPU's DRAM, activations (f32 rows there and back) over the link; split = "
                               "the split peer's share of each cold expert over the link (options.split_share_used), "
                               "the rest from the peer's DRAM.");

  // The split lane's share of each cold expert read over the link (the features the GPU holds: the cut
  // its runtime took, from --split-share or, with auto, from its peer).
  const int64_t inter = first.model->cfg.moe_intermediate_size;
  const int64_t cut = wants(Lane::kSplit) ? runtimes.at(Lane::kSplit).split_column() : 0;
  const double split_share = double(cut) / double(inter);
  if (wants(Lane::kSplit)) {
    report.options["split_column"] = cut;
    report.options["split_share_used"] = split_share;
    report.notes.push_back(fmt::format("Split lane: each cold expert cut at feature {} of {} ({:.3f} over the link; "
                                       "--split-share {}{}).",
                                       cut, inter, split_share, o.model.split,
                                       o.model.split == "auto" ? ": the cut its peer chose" : ""));
  }
  std::set<std::pair<Lane, int64_t>> warmed;
  for (const std::string& kind : o.kinds) {
    for (int64_t users : o.users) {
      const auto reqs = requests_for(prompts[kind], users, o.tokens);
      const bench::Probe probe =
          bench::probe_routing(*first.engine, rowmap, reqs, std::min(o.probe_tokens, o.tokens));
      bench::Cell cell{kind, users, {}};
      for (Lane lane : lanes) {
        Runtime& rt = runtimes.at(lane);
        if (warmed.insert({lane, users}).second) {
          auto warm = reqs;
          for (auto& r : warm) r.max_tokens = o.warmup_tokens;
          generate(*rt.engine, warm);
        }
        LaneRun r = timed_run(rt, reqs);
        if (r.cold_share_source.empty()) {
          r.cold_share = probe.cold_share;
          r.cold_share_source = "probe";
        }
        r.bytes = bench::path_bytes(base.device, lane, fixed, probe, model.cfg.hidden_size, split_share);
        r.bound_ms = bench::bound_ms(r.bytes, o.bw);
        fmt::print(stderr, "bench: {} x {} users, {}: {:.1f} tok/s ({:.1f}/user), {:.3f} ms/step, bound {:.3f} ms{}\n",
                   kind, users, r.lane, r.tokens_per_s(), r.tokens_per_s() / double(users), r.step_ms(), r.bound_ms,
                   r.counters ? fmt::format(", {} handoffs, {} overruns", r.counters->handoffs, r.counters->overruns)
                              : "");
        cell.runs.push_back(std::move(r));
      }
      const bench::CellSummary s = bench::summarize(cell);
      std::string line = fmt::format("bench: cell {} x {} users done:", kind, users);
      for (const auto& l : s.lanes)
        line += fmt::format(" {} {:.1f} tok/s{}", l.lane, l.mean_tokens_per_s,
                            l.ratio ? fmt::format(" (x{:.3f})", *l.ratio) : "");
      if (s.aba_spread) line += fmt::format("; A spread {:.1f}%", *s.aba_spread * 100);
      fmt::print(stderr, "{}\n", line);
      report.cells.push_back(std::move(cell));
    }
  }

  std::filesystem::create_directories(o.out_dir);
  const std::string stem = o.out_dir + "/" + bench::result_stem(report);
  const std::string md = bench::to_markdown(report);
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    if (!f) fail("{}: cannot write", path);
  };
  write(stem + ".json", bench::to_json(report).dump(2) + "\n");
  write(stem + ".md", md);
  write(stem + ".svg", bench::to_svg(report));
  fmt::print("{}", md);
  fmt::print(stderr, "bench: wrote {0}.json, {0}.md, {0}.svg\n", stem);
  for (const auto& [lane, rt] : runtimes)
    if (std::string s = rt.lane_summary(); !s.empty()) fmt::print(stderr, "{}\n", s);
  return 0;
}

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  add_model_options(app, o->model);
  app.remove_option(app.get_option("--lane"));
  app.add_option("--lanes", o->lanes,
                 "Lanes in run order, e.g. host,peer,host (A, B, A): local, host, peer, split (ratios are to the first)")
      ->delimiter(',')
      ->required();
  app.add_option("--users", o->users, "Concurrent sequences per cell (default 1,8,16,32)")->delimiter(',');
  app.add_option("--kinds", o->kinds, "Corpus kinds, one cell row each (e.g. prose,code_python)")
      ->delimiter(',')
      ->required();
  app.add_option("--corpus", o->corpus, "JSON-lines corpus the prompts come from")->required();
  app.add_option("--tokens", o->tokens, "Tokens generated per user (default 64)");
  app.add_option("--prompt-tokens", o->prompt_tokens, "Prompt length in tokens (default 64)");
  app.add_option("--warmup-tokens", o->warmup_tokens, "Tokens of the untimed warm-up per lane and users (default 5)");
  app.add_option("--probe-tokens", o->probe_tokens, "Tokens of the hooked routing probe per cell (default: --tokens, so it sees every timed step)");
  app.add_option("--out-dir", o->out_dir, "Where the JSON, Markdown and SVG go (default bench/results)");
  app.add_option("--label", o->label, "Name in the file names and titles (default: the model folder's name)");
  app.add_option("--machine", o->machine, "Free text about the machine, stored with the results");
  app.add_option("--hbm-gbps", o->bw.hbm_gbps,
                 "GPU HBM read bandwidth for the bound, GB/s (default 0: measured at start, 2 GiB read once)");
  app.add_option("--link-gbps", o->bw.link_gbps,
                 "PCIe link bandwidth for the bound, GB/s (default 0: measured at start, the GPU reading 512 MiB of "
                 "mapped host memory)");
  app.add_option("--dram-gbps", o->bw.dram_gbps,
                 "CPU DRAM read bandwidth for the bound, GB/s (default 0: measured at start, 2 GiB read by --threads "
                 "threads)");
  return [o] { return run(*o); };
}

}  // namespace
TANDEM_COMMAND(bench, "bench", "Bracketed lane comparison (A, B, A) by traffic kind and number of users", setup);
}  // namespace tandem::cli
