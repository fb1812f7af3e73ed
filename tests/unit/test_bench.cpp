// `tandem bench`: the statistics and writers of src/bench/report (ratio, spreads, histogram percentiles,
// bounds, JSON/Markdown/SVG), the memory bound's paths and routing probe (src/bench/bound), and the
// command end to end on the tiny synthetic model with a real `tandem peer` (lanes local,peer,local on
// the CPU), plus its bad-input errors.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../lane_tools/process.h"
#include "../lane_tools/rowmap_util.h"
#include "bench/bound.h"
#include "bench/report.h"
#include "engine/engine.h"
#include "models/model.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem {
namespace {

using bench::LaneRun;

// A minimal well-formedness check: every tag closes in order, text holds no raw '<' and every '&'
// starts one of the five XML entities. Returns "" when fine, else what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  bool root_seen = false;
  while (i < s.size()) {
    if (s[i] == '&') {
      bool ok = false;
      for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) ok = ok || s.compare(i, strlen(e), e) == 0;
      if (!ok) return "bare & at " + std::to_string(i);
      ++i;
      continue;
    }
    if (s[i] != '<') {
      ++i;
      continue;
    }
    size_t end = s.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag.find('<') != std::string::npos) return "'<' inside tag " + tag;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "unexpected </" + tag.substr(1) + ">";
      stack.pop_back();
      continue;
    }
    std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (stack.empty()) {
      if (root_seen) return "second root element " + name;
      root_seen = true;
    }
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return root_seen ? "" : "no element";
}

LaneRun run_of(const std::string& lane, int64_t users, int64_t steps, double decode_s) {
  LaneRun r;
  r.lane = lane;
  r.users = users;
  r.decode_steps = steps;
  r.decode_s = decode_s;
  return r;
}

TEST(BenchStats, HistogramPercentiles) {
  std::vector<uint64_t> empty(32, 0);
  EXPECT_FALSE(bench::hist_percentile_us(empty, 0.5));
  std::vector<uint64_t> h(32, 0);
  h[0] = 2;  // < 1 µs
  h[3] = 1;  // [4, 8) µs
  h[6] = 1;  // [32, 64) µs
  EXPECT_EQ(*bench::hist_percentile_us(h, 0.5), 1.0);   // 2 of 4 under 1 µs
  EXPECT_EQ(*bench::hist_percentile_us(h, 0.75), 8.0);  // the third wait
  EXPECT_EQ(*bench::hist_percentile_us(h, 0.99), 64.0);
  EXPECT_EQ(*bench::hist_percentile_us(h, 1.0), 64.0);
}

TEST(BenchStats, SpreadAndBound) {
  std::vector<double> v = {100, 110, 90};
  EXPECT_NEAR(*bench::relative_spread(v), 0.2, 1e-12);
  std::vector<double> one = {5};
  EXPECT_EQ(*bench::relative_spread(one), 0.0);
  EXPECT_FALSE(bench::relative_spread(std::vector<double>{}));
  EXPECT_FALSE(bench::relative_spread(std::vector<double>{0, 0}));

  bench::Bandwidths bw;
  bw.hbm_gbps = 4400, bw.dram_gbps = 80, bw.link_gbps = 51;
  bench::PathBytes b;
  b.hbm = 4.4e9;   // 1 ms
  b.link = 102e6;  // 2 ms
  b.dram = 40e6;   // 0.5 ms
  EXPECT_NEAR(bench::bound_ms(b, bw), 2.0, 1e-9);
  b.link = 0;
  EXPECT_NEAR(bench::bound_ms(b, bw), 1.0, 1e-9);
  bw.link_gbps = 0;  // a path without bytes counts 0, whatever its bandwidth (not measured: 0)
  EXPECT_NEAR(bench::bound_ms(b, bw), 1.0, 1e-9);
}

TEST(BenchStats, AbaRatioAndSpread) {
  bench::Cell cell{"prose", 2, {}};
  cell.runs.push_back(run_of("host", 2, 10, 0.1));    // 200 tok/s
  cell.runs.push_back(run_of("peer", 2, 10, 0.05));   // 400 tok/s
  cell.runs.push_back(run_of("host", 2, 10, 0.125));  // 160 tok/s
  bench::LaneCounters c;
  c.handoffs = 12;
  cell.runs[1].counters = c;
  auto s = bench::summarize(cell);
  ASSERT_EQ(s.lanes.size(), 2u);
  EXPECT_EQ(s.lanes[0].lane, "host");
  EXPECT_EQ(s.lanes[0].repeats, 2);
  EXPECT_NEAR(s.lanes[0].mean_tokens_per_s, 180, 1e-9);
  EXPECT_NEAR(*s.lanes[0].spread, 40.0 / 180, 1e-12);
  EXPECT_FALSE(s.lanes[0].ratio);
  EXPECT_FALSE(s.lanes[0].counters);  // host runs carry none
  EXPECT_NEAR(*s.lanes[1].ratio, 400.0 / 180, 1e-12);
  EXPECT_EQ(s.lanes[1].counters->handoffs, 12u);
  EXPECT_NEAR(*s.aba_ratio, 400.0 / 180, 1e-12);
  EXPECT_NEAR(*s.aba_spread, 40.0 / 180, 1e-12);
  EXPECT_NEAR(s.lanes[1].mean_step_ms, 5.0, 1e-12);
}

TEST(BenchStats, LongerListsReportEveryLaneAgainstTheFirst) {
  bench::Cell cell{"json", 1, {}};
  for (auto [lane, s] : std::vector<std::pair<std::string, double>>{
           {"host", 0.1}, {"peer", 0.05}, {"local", 0.025}, {"peer", 0.0625}, {"host", 0.1}})
    cell.runs.push_back(run_of(lane, 1, 10, s));
  auto s = bench::summarize(cell);
  ASSERT_EQ(s.lanes.size(), 3u);
  EXPECT_FALSE(s.aba_ratio);  // not an A, B, A list
  EXPECT_EQ(s.lanes[1].lane, "peer");
  EXPECT_NEAR(s.lanes[1].mean_tokens_per_s, 180, 1e-9);
  EXPECT_NEAR(*s.lanes[1].ratio, 1.8, 1e-12);
  EXPECT_NEAR(*s.lanes[2].ratio, 4.0, 1e-12);
  EXPECT_EQ(*s.lanes[0].spread, 0.0);
  EXPECT_EQ(*s.lanes[2].spread, 0.0);  // one run
  // A, A, B is not bracketed either.
  bench::Cell aab{"json", 1, {run_of("a", 1, 1, 1), run_of("a", 1, 1, 1), run_of("b", 1, 1, 1)}};
  EXPECT_FALSE(bench::summarize(aab).aba_ratio);
}

TEST(BenchStats, CountersAddUpOverRepeats) {
  bench::Cell cell{"prose", 1, {run_of("local", 1, 4, 1), run_of("peer", 1, 4, 1), run_of("peer", 1, 4, 1)}};
  bench::LaneCounters a{10, 0, 2.0, 2.0, 8.0}, b{30, 1, 4.0, 4.0, 16.0};
  cell.runs[1].counters = a;
  cell.runs[2].counters = b;
  auto s = bench::summarize(cell);
  const auto& c = *s.lanes[1].counters;
  EXPECT_EQ(c.handoffs, 40u);
  EXPECT_EQ(c.overruns, 1u);
  EXPECT_NEAR(c.wait_mean_us, (10 * 2.0 + 30 * 4.0) / 40, 1e-12);
  EXPECT_EQ(*c.wait_p50_us, 4.0);
  EXPECT_EQ(*c.wait_p99_us, 16.0);
}

bench::Report sample_report() {
  bench::Report r;
  r.date = "2026-12-03";
  r.label = "flash mini/x";
  r.model = "/m/flash-mini";
  r.device = "cuda";
  r.command = "tandem bench --model /m --lanes host,peer,host";
  r.machine = {{"hostname", "box"}, {"nproc", 16}};
  r.options = {{"tokens", 8}};
  r.bandwidths = {4400, 80, 51, "measured", "command line", "not used"};
  for (const char* kind : {"prose", "a<b&c"}) {
    for (int64_t users : {1, 8}) {
      bench::Cell cell{kind, users, {}};
      cell.runs.push_back(run_of("host", users, 10, 0.1));
      cell.runs.push_back(run_of("peer", users, 10, 0.07));
      cell.runs.push_back(run_of("host", users, 10, 0.11));
      cell.runs[1].counters = bench::LaneCounters{100, 0, 15.0, 16.0, 64.0};
      for (auto& run : cell.runs) {
        run.bytes.hbm = 1e9;
        run.bound_ms = 0.5;
        run.cold_share = 0.25;
        run.cold_share_source = "probe";
      }
      r.cells.push_back(cell);
    }
  }
  r.notes.push_back("a note");
  return r;
}

// Every lane reads the same bytes per step; only their paths differ. The rows a lane with a peer
// sends (f32 there and back, with ids and weights) come on top, over the link.
TEST(BenchBound, PathsOfEachLaneAddUpToTheStepsBytes) {
  bench::Probe p;
  p.hot_bytes = 3e6;
  p.cold_bytes = 1e6;
  p.cold_rows = 5;
  p.k = 8;
  const double fixed = 2e6, all = fixed + p.hot_bytes + p.cold_bytes;
  const int64_t hidden = 64;
  const double rows = 5 * (2.0 * 64 * 4 + 8 * 8);
  const Device cpu, gpu{true, 0};

  for (Lane l : {Lane::kLocal, Lane::kPeer}) {  // the CPU: one DRAM for the primary and the peer
    const bench::PathBytes b = bench::path_bytes(cpu, l, fixed, p, hidden, 0.0);
    EXPECT_EQ(b.dram, all) << lane_name(l);
    EXPECT_EQ(b.hbm + b.link, 0.0) << lane_name(l);
  }
  const bench::PathBytes local = bench::path_bytes(gpu, Lane::kLocal, fixed, p, hidden, 0.0);
  EXPECT_EQ(local.hbm, all);
  EXPECT_EQ(local.dram + local.link, 0.0);
  const bench::PathBytes host = bench::path_bytes(gpu, Lane::kHost, fixed, p, hidden, 0.0);
  EXPECT_EQ(host.hbm, fixed + p.hot_bytes);
  EXPECT_EQ(host.link, p.cold_bytes);
  EXPECT_EQ(host.dram, 0.0);
  const bench::PathBytes peer = bench::path_bytes(gpu, Lane::kPeer, fixed, p, hidden, 0.0);
  EXPECT_EQ(peer.hbm, fixed + p.hot_bytes);
  EXPECT_EQ(peer.dram, p.cold_bytes);
  EXPECT_EQ(peer.link, rows);
  const bench::PathBytes split = bench::path_bytes(gpu, Lane::kSplit, fixed, p, hidden, 0.25);
  EXPECT_EQ(split.hbm, fixed + p.hot_bytes);
  EXPECT_DOUBLE_EQ(split.dram, 0.75 * p.cold_bytes);
  EXPECT_DOUBLE_EQ(split.link, 0.25 * p.cold_bytes + rows);
  EXPECT_DOUBLE_EQ(split.total() - rows, all);
}

TEST(BenchBound, OnlyTheUnknownBandwidthsOfUsedPathsAreMeasured) {
  bench::Bandwidths bw;
  bw.dram_gbps = 100;
  bench::ToMeasure m = bench::bandwidths_to_measure(bw, Device{}, true, false);
  EXPECT_FALSE(m.hbm || m.link || m.dram);  // the CPU: DRAM only, and it was given
  EXPECT_EQ(bw.hbm_source, "not used");
  EXPECT_EQ(bw.link_source, "not used");
  EXPECT_EQ(bw.dram_source, "command line");

  bench::Bandwidths gpu;
  gpu.link_gbps = 50;
  m = bench::bandwidths_to_measure(gpu, Device{true, 0}, true, false);  // host lanes: no peer's DRAM
  EXPECT_TRUE(m.hbm && m.any());
  EXPECT_FALSE(m.link || m.dram);
  EXPECT_EQ(gpu.hbm_source, "measured");
  EXPECT_EQ(gpu.link_source, "command line");
  EXPECT_EQ(gpu.dram_source, "not used");
#ifndef TANDEM_HAVE_CUDA
  bench::ToMeasure hbm;
  hbm.hbm = true;
  EXPECT_THROW(bench::measure_bandwidths(gpu, hbm, Device{true, 0}, 1), InputError);
#endif
}

// The routing probe on a real model: with every expert cold, every touched byte is cold and so is
// every slot; with no rowmap, none is. The engine's hooks are gone afterwards.
TEST(BenchBound, ProbeSplitsTheTouchedExpertsByTheRowmap) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  const auto model = Model::bind(load_config(dir), TensorStore::open_dir(dir), dir);
  CpuEngine engine(*model, EngineOptions{});
  const Rowmap all_cold = test::make_rowmap(dir, [](int64_t, int64_t) { return true; });
  std::vector<GenerateRequest> reqs(2);
  reqs[0].prompt = {1, 2, 3};
  reqs[1].prompt = {4, 5};
  const bench::Probe cold = bench::probe_routing(engine, &all_cold, reqs, 4);
  EXPECT_FALSE(engine.hooks.on_routing);
  EXPECT_GT(cold.cold_bytes, 0.0);
  EXPECT_EQ(cold.hot_bytes, 0.0);
  EXPECT_EQ(cold.cold_share, 1.0);
  EXPECT_EQ(cold.k, model->cfg.n_expert_used);
  EXPECT_GT(cold.cold_rows, 0.0);
  const bench::Probe hot = bench::probe_routing(engine, nullptr, reqs, 4);
  EXPECT_EQ(hot.cold_bytes, 0.0);
  EXPECT_EQ(hot.cold_share, 0.0);
  EXPECT_EQ(hot.cold_rows, 0.0);
  EXPECT_EQ(hot.hot_bytes, cold.cold_bytes);  // greedy: the same steps touch the same experts
  const double fixed = bench::fixed_bytes(*model);
  EXPECT_GT(fixed, 0.0);
  EXPECT_LT(fixed, double(model->store.total_bytes()));
}

TEST(BenchReport, Json) {
  auto j = bench::to_json(sample_report());
  EXPECT_EQ(j["schema"], "tandem-bench/1");
  EXPECT_EQ(j["bandwidths_gbps"]["hbm"], 4400.0);
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["hbm"], "measured");
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["dram"], "command line");
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["link"], "not used");
  ASSERT_EQ(j["cells"].size(), 4u);
  const auto& cell = j["cells"][1];
  EXPECT_EQ(cell["users"], 8);
  ASSERT_EQ(cell["runs"].size(), 3u);
  EXPECT_NEAR(cell["runs"][0]["tokens_per_s"].get<double>(), 800, 1e-9);
  EXPECT_NEAR(cell["runs"][0]["tokens_per_s_per_user"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(cell["runs"][0]["x_bound"].get<double>(), 20, 1e-9);  // 10 ms per step vs 0.5 ms
  EXPECT_TRUE(cell["runs"][0]["counters"].is_null());
  EXPECT_EQ(cell["runs"][1]["counters"]["handoffs"], 100);
  EXPECT_EQ(cell["runs"][1]["counters"]["wait_p99_us_le"], 64.0);
  const double a = (800 + 8 / 0.11 * 10) / 2;
  EXPECT_NEAR(cell["summary"]["aba_ratio"].get<double>(), 8 / 0.07 * 10 / a, 1e-9);
  EXPECT_NEAR(cell["summary"]["aba_spread"].get<double>(), (800 - 8 / 0.11 * 10) / a, 1e-9);
  EXPECT_EQ(cell["summary"]["baseline"], "host");
  EXPECT_TRUE(cell["summary"]["lanes"][0]["ratio_to_first"].is_null());
  EXPECT_EQ(j["notes"][0], "a note");
}

TEST(BenchReport, MarkdownHasTheRatioTableAndEveryCell) {
  const std::string md = bench::to_markdown(sample_report());
  EXPECT_NE(md.find("## peer / host"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 user | 8 users |"), std::string::npos) << md;
  const double ratio = (1 / 0.07) / ((1 / 0.1 + 1 / 0.11) / 2);
  EXPECT_NE(md.find(fmt::format("×{:.2f}", ratio)), std::string::npos) << md;
  EXPECT_NE(md.find("| a<b&c | 8 | peer |"), std::string::npos) << md;
  EXPECT_NE(md.find("<16 / <64"), std::string::npos) << md;
  EXPECT_NE(md.find("n/a"), std::string::npos) << md;  // host lanes have no counters
  EXPECT_NE(md.find("HBM 4400 GB/s (measured), CPU DRAM 80 GB/s (command line), PCIe link not used"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- a note"), std::string::npos) << md;
}

// A cell whose baseline runs differ by more than 5% is flagged: in the summary (JSON), with a dagger on
// its ratios and its baseline spread, and with a count above the tables; a steady cell is not.
TEST(BenchReport, UnsteadyCellsAreMarked) {
  bench::Report r;
  r.label = "m";
  r.device = "cuda";
  bench::Cell steady{"prose", 1, {}}, shaky{"json", 1, {}};
  for (double host2 : {0.104, 0.125}) {  // host runs at 100 and 96 tok/s (4%), then 100 and 80 (22%)
    bench::Cell& c = host2 < 0.11 ? steady : shaky;
    c.runs.push_back(run_of("host", 1, 10, 0.1));
    c.runs.push_back(run_of("peer", 1, 10, 0.07));
    c.runs.push_back(run_of("host", 1, 10, host2));
  }
  r.cells = {steady, shaky};
  EXPECT_TRUE(bench::summarize(steady).steady);
  EXPECT_FALSE(bench::summarize(shaky).steady);
  const auto j = bench::to_json(r);
  EXPECT_EQ(j["cells"][0]["summary"]["steady"], true);
  EXPECT_EQ(j["cells"][1]["summary"]["steady"], false);
  const std::string md = bench::to_markdown(r);
  EXPECT_NE(md.find("**1 of 2 cells were not steady**"), std::string::npos) << md;
  EXPECT_NE(md.find("host runs differ by more than 5%"), std::string::npos) << md;
  const size_t table = md.find("## peer / host");
  ASSERT_NE(table, std::string::npos) << md;
  const std::string prose_row = md.substr(md.find("| prose |", table), md.find('\n', md.find("| prose |", table)) - md.find("| prose |", table));
  const std::string json_row = md.substr(md.find("| json |", table), md.find('\n', md.find("| json |", table)) - md.find("| json |", table));
  EXPECT_EQ(prose_row.find("†"), std::string::npos) << prose_row;
  EXPECT_NE(json_row.find("(22.2%) †"), std::string::npos) << json_row;
  EXPECT_NE(md.find("| json | 1 | host | 2 | 90.0 | 90.0 | 22.2% † |"), std::string::npos) << md;
  EXPECT_EQ(bench::to_markdown(bench::Report{}).find("not steady"), std::string::npos);
  const std::string svg = bench::to_svg(r);
  EXPECT_NE(svg.find(fmt::format("×{:.2f} †", 10 / 0.07 / 90.0)), std::string::npos) << svg;  // json's ratio
  EXPECT_NE(svg.find(fmt::format("×{:.2f}<", 10 / 0.07 / ((100 + 10 / 0.104) / 2))), std::string::npos) << svg;
  EXPECT_NE(svg.find("not steady"), std::string::npos);
}

TEST(BenchReport, SvgIsWellFormedAndEscaped) {
  const std::string svg = bench::to_svg(sample_report());
  EXPECT_EQ(xml_problem(svg), "") << svg;
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("a&lt;b&amp;c"), std::string::npos);
  EXPECT_NE(svg.find("×1."), std::string::npos);  // the ratio above the peer bars
  // 2 kinds × 2 users × 2 lanes bars.
  size_t bars = 0;
  for (size_t p = svg.find("<title>"); p != std::string::npos; p = svg.find("<title>", p + 1)) ++bars;
  EXPECT_EQ(bars, 8u);
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");  // the checker itself can fail
  EXPECT_NE(xml_problem("<svg>a & b</svg>"), "");
}

TEST(BenchReport, FileStem) {
  EXPECT_EQ(bench::result_stem(sample_report()), "2026-12-03-flash-mini-x-cuda");
}

// ---- The command on the tiny model ----

void write_rowmap(const std::string& dir, const std::string& path) {
  test::write_rowmap(dir, path, [](int64_t, int64_t e) { return e % 3 == 1; });
}

class BenchCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    model_ = tmp_->path + "/tiny";
    auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", model_, "--seed", "5"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rowmap_ = tmp_->path + "/tiny.rowmap.json";
    write_rowmap(model_, rowmap_);
    corpus_ = tmp_->path + "/corpus.jsonl";
    std::string lines;
    for (int i = 0; i < 3; ++i)
      lines += nlohmann::json{{"kind", "prose"},
                              {"name", fmt::format("p{}", i)},
                              {"text", fmt::format("Document {}: the sidecar keeps the cold experts and computes them, "
                                                   "while only activations cross between the devices.", i)}}
                   .dump() +
               "\n";
    lines += nlohmann::json{{"kind", "code_c"}, {"name", "short"}, {"text", "int x;"}}.dump() + "\n";
    test::write_file(corpus_, lines);
  }
  static void TearDownTestSuite() { delete tmp_; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline std::string model_, rowmap_, corpus_;
  test::TempDir tmp;

  std::vector<std::string> args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"bench", "--model", model_, "--rowmap", rowmap_, "--corpus", corpus_, "--threads", "1",
                                  "--prompt-tokens", "16", "--out-dir", tmp.path + "/out"};
    a.insert(a.end(), extra.begin(), extra.end());
    if (std::find(extra.begin(), extra.end(), "--tokens") == extra.end()) a.insert(a.end(), {"--tokens", "4"});
    return a;
  }
};

TEST_F(BenchCli, LocalPeerLocalWritesJsonMarkdownAndSvg) {
  const std::string lane = fmt::format("bench-{}", getpid());
  test::Child peer = test::spawn({test::tandem_binary(), "peer", "--model", model_, "--rowmap", rowmap_, "--lane", lane,
                                  "--threads", "1"},
                                 tmp.file("peer.out"), tmp.file("peer.log"));
  ASSERT_TRUE(test::wait_until(
      [&] { return test::read_file(tmp.file("peer.log")).find("serving") != std::string::npos || test::try_reap(peer); },
      30));
  ASSERT_FALSE(peer.reaped) << test::read_file(tmp.file("peer.log"));
  auto r = test::run_tandem(args({"--device", "cpu", "--lanes", "local,peer,local", "--users", "1,2", "--kinds", "prose",
                                  "--peer", lane, "--label", "tiny test"}));
  const bool peer_done = test::wait_exit(peer, 10);  // the bench closing the lane stops the peer
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(peer_done);
  EXPECT_EQ(peer.exit_code, 0) << test::read_file(tmp.file("peer.log"));
  EXPECT_NE(r.err.find("cell prose x 2 users done"), std::string::npos) << r.err;  // progress per cell
  EXPECT_NE(r.out.find("| prose | 2 | peer |"), std::string::npos) << r.out;       // the table on stdout

  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(tmp.path + "/out")) files.push_back(f.path().filename());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 3u);
  const std::string stem = files[0].substr(0, files[0].size() - 5);  // "<date>-tiny-test-cpu" + ".json"
  EXPECT_EQ(files[0], stem + ".json");
  EXPECT_EQ(files[1], stem + ".md");
  EXPECT_EQ(files[2], stem + ".svg");
  EXPECT_NE(stem.find("-tiny-test-cpu"), std::string::npos) << stem;

  auto j = nlohmann::json::parse(test::read_file(tmp.path + "/out/" + files[0]));
  EXPECT_NE(j["command"].get<std::string>().find("--lanes local,peer,local"), std::string::npos) << j["command"];
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_GT(j["machine"]["nproc"].get<int>(), 0);
  // On the CPU only DRAM is a path, and with no --dram-gbps its bandwidth was measured at start.
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["dram"], "measured");
  EXPECT_GT(j["bandwidths_gbps"]["dram"].get<double>(), 0.1);
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["hbm"], "not used");
  EXPECT_EQ(j["bandwidths_gbps"]["source"]["link"], "not used");
  EXPECT_NE(r.err.find("measuring read bandwidths"), std::string::npos) << r.err;
  ASSERT_EQ(j["cells"].size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    const auto& cell = j["cells"][c];
    EXPECT_EQ(cell["kind"], "prose");
    EXPECT_EQ(cell["users"], int(c + 1));
    ASSERT_EQ(cell["runs"].size(), 3u);
    const auto& local = cell["runs"][0];
    const auto& peer_run = cell["runs"][1];
    EXPECT_EQ(local["lane"], "local");
    EXPECT_EQ(peer_run["lane"], "peer");
    EXPECT_EQ(cell["runs"][2]["lane"], "local");
    for (const auto& run : cell["runs"]) {
      EXPECT_EQ(run["decode_steps"], 3);  // 4 tokens: one from prefill, three decode steps
      EXPECT_GT(run["tokens_per_s"].get<double>(), 0);
      EXPECT_GT(run["bound_ms"].get<double>(), 0);
      EXPECT_EQ(run["bytes_per_step"]["hbm"], 0.0);  // cpu: everything from DRAM
    }
    EXPECT_TRUE(local["counters"].is_null());
    EXPECT_EQ(local["cold_share_source"], "probe");
    // The peer's counters over its 3 decode steps: 3 MoE layers, one handoff each when a row went cold.
    EXPECT_EQ(peer_run["cold_share_source"], "counters");
    const auto& pc = peer_run["counters"];
    EXPECT_GT(pc["handoffs"].get<int>(), 0);
    EXPECT_LE(pc["handoffs"].get<int>(), 3 * 3);
    EXPECT_TRUE(pc["overruns"].is_number());
    EXPECT_TRUE(pc["wait_p50_us_le"].is_number());
    // The probe saw the same three decode steps as the timed run (greedy, same prompts): same share.
    EXPECT_NEAR(peer_run["cold_share"].get<double>(), local["cold_share"].get<double>(), 1e-12);
    const auto& s = cell["summary"];
    const double a = (local["tokens_per_s"].get<double>() + cell["runs"][2]["tokens_per_s"].get<double>()) / 2;
    EXPECT_NEAR(s["aba_ratio"].get<double>(), peer_run["tokens_per_s"].get<double>() / a, 1e-9 * s["aba_ratio"].get<double>());
    EXPECT_TRUE(s["aba_spread"].is_number());
    EXPECT_EQ(s["lanes"][0]["repeats"], 2);
  }
  EXPECT_EQ(xml_problem(test::read_file(tmp.path + "/out/" + files[2])), "");
  EXPECT_NE(test::read_file(tmp.path + "/out/" + files[1]).find("## peer / local"), std::string::npos);
}

TEST_F(BenchCli, BadInputFailsBeforeAnyRun) {
  struct Case {
    std::vector<std::string> extra;
    std::string words;
  };
  const std::vector<Case> cases = {
      {{"--lanes", "local,gpu2", "--kinds", "prose"}, "unknown lane 'gpu2'"},
      {{"--lanes", "local,host,local", "--kinds", "prose"}, "--lane host"},  // cpu has no host lane
      {{"--lanes", "local,peer,local", "--kinds", "prose"}, "give --peer NAME"},
      {{"--lanes", "local,peer,local", "--kinds", "prose", "--peer", fmt::format("nobody-{}", getpid())},
       "no lane is being served"},
      {{"--lanes", "local", "--kinds", ""}, "--kinds is empty"},
      {{"--lanes", "local", "--kinds", "poetry"}, "poetry"},
      {{"--lanes", "local", "--kinds", "code_c"}, "no document of this kind"},
      {{"--lanes", "local", "--kinds", "prose", "--users", "0"}, "--users: 0"},
      {{"--lanes", "local", "--kinds", "prose", "--tokens", "1"}, "--tokens 1"},
      {{"--lanes", "local", "--kinds", "prose", "--link-gbps", "-1"}, "must be > 0"},
      {{"--lanes", "local", "--kinds", "prose", "--dram-gbps", "inf"}, "must be > 0"},
  };
  for (const Case& c : cases) {
    auto r = test::run_tandem(args(c.extra));
    EXPECT_EQ(r.exit_code, 2) << c.words << ": " << r.err;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << c.words << " not in: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp.path + "/out")) << c.words;
  }
}

}  // namespace
}  // namespace tandem
