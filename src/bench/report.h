// `tandem bench` results and their writers: the numbers of every timed lane run, the per-cell
// summary (each lane's mean, the spread of its repeats, the ratio to the first lane = B / mean(A) for
// an A,B,A list), and the JSON, Markdown and SVG renderings. Pure functions of their inputs (no
// clock, no files), so they are unit-tested; the bench command (src/cli/bench.cpp) measures and
// writes the files.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem::bench {

// Upper edge in µs of the bucket holding the q-quantile of a power-of-two wait histogram (bucket 0:
// < 1 µs -> 1; bucket i: [2^(i-1), 2^i) µs -> 2^i). nullopt when the histogram is empty. q in (0, 1].
std::optional<double> hist_percentile_us(std::span<const uint64_t> hist, double q);

// (max - min) / mean of the values: 0 for one value; nullopt when empty or the mean is 0.
std::optional<double> relative_spread(std::span<const double> values);

// Bytes a decode step must move, per path: HBM of the primary GPU, DRAM of the CPU (the peer's, or
// the primary's on --device cpu), and the PCIe link.
struct PathBytes {
  double hbm = 0, dram = 0, link = 0;
  double total() const { return hbm + dram + link; }
};
struct Bandwidths {
  double hbm_gbps = 0, dram_gbps = 0, link_gbps = 0;  // GB/s (1e9 bytes); `tandem bench` measures those left 0
  // How each was obtained: "measured" (at start, on this machine), "command line", or "not used".
  std::string hbm_source = "command line", dram_source = "command line", link_source = "command line";
};
// The memory bound of a step: the paths run in parallel, so max over paths of bytes / bandwidth, in ms
// (a path without bytes counts 0 whatever its bandwidth).
double bound_ms(const PathBytes& bytes, const Bandwidths& bw);

// The shared-memory lane's counters over the decode phase of one timed run (deltas).
struct LaneCounters {
  uint64_t handoffs = 0;
  uint64_t overruns = 0;
  double wait_mean_us = 0;
  std::optional<double> wait_p50_us, wait_p99_us;  // bucket upper edges (hist_percentile_us)
};

// One timed run of one lane in one cell.
struct LaneRun {
  std::string lane;
  int64_t users = 0;
  int64_t decode_steps = 0;
  double prefill_s = 0;
  double decode_s = 0;
  std::optional<LaneCounters> counters;  // nullopt: the lane exposes none (local, host, GPU peer today)
  double cold_share = 0;                 // rows routed to cold experts / all routed (row, expert) slots
  std::string cold_share_source;         // "counters" (the lane's own) or "probe" (routing of a probe run)
  PathBytes bytes;                       // per decode step
  double bound_ms = 0;

  double tokens_per_s() const { return decode_s > 0 ? double(users * decode_steps) / decode_s : 0; }
  double step_ms() const { return decode_steps > 0 ? decode_s / double(decode_steps) * 1e3 : 0; }
};

// One lane's runs within a cell, in the order the lanes were listed.
struct LaneSummary {
  std::string lane;
  int64_t repeats = 0;
  double mean_tokens_per_s = 0;
  double min_tokens_per_s = 0, max_tokens_per_s = 0;
  std::optional<double> spread;            // relative_spread of the repeats' tokens/s
  std::optional<double> ratio;             // mean / mean of the first lane; nullopt for the first lane
  double mean_step_ms = 0;
  double bound_ms = 0;                     // of the first run (the bytes are the cell's, not the run's)
  std::optional<LaneCounters> counters;    // summed handoffs/overruns, worst p50/p99 over the repeats
  double cold_share = 0;
  PathBytes bytes;
};

struct Cell {
  std::string kind;
  int64_t users = 0;
  std::vector<LaneRun> runs;  // in the --lanes order
};

// A cell whose baseline runs (lanes[0]'s repeats) differ by more than this is not steady: the machine
// changed speed while the cell ran, and its ratios are not measurements to rely on.
constexpr double kSteadySpread = 0.05;

struct CellSummary {
  std::vector<LaneSummary> lanes;  // distinct lanes, first appearance first; lanes[0] is the baseline A
  // B / mean(A) when the runs are exactly A, B, A (A != B); the spread of the two A runs with it.
  std::optional<double> aba_ratio, aba_spread;
  bool steady = true;  // lanes[0]'s spread ≤ kSteadySpread (a baseline run once counts as steady)
};
CellSummary summarize(const Cell& cell);

struct Report {
  std::string date;    // YYYY-MM-DD
  std::string label;   // --label, or the model folder's name
  std::string model;   // --model as given
  std::string device;
  std::string command;  // the exact command line
  nlohmann::json machine;  // hostname, nproc, cpu, gpu, ...
  nlohmann::json options;  // lanes, users, kinds, tokens, ...
  Bandwidths bandwidths;
  std::vector<Cell> cells;
  std::vector<std::string> notes;  // caveats printed with every rendering
};

nlohmann::json to_json(const Report& report);
// A heading, the command, the bandwidth assumption, one table row per (cell, lane), the notes.
std::string to_markdown(const Report& report);
// Grouped bars of total decode tokens/s per lane for each users value (whiskers: min..max of the
// repeats), one panel per kind, the ratio to the first lane above each bar, rotated. Self-contained SVG 1.1.
std::string to_svg(const Report& report);
// "<date>-<label>-<device>" with every character outside [A-Za-z0-9._-] replaced by '-'.
std::string result_stem(const Report& report);

}  // namespace tandem::bench
