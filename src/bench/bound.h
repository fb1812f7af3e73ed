// The memory bound of a decode step, for `tandem bench`: which bytes a step reads (every weight but
// the routed experts, plus the distinct experts its rows were routed to, hot or cold by the rowmap),
// which path each part takes on a lane (HBM, the peer's DRAM, the link), and the paths' bandwidths,
// given or measured on this machine. bound_ms (report.h) turns them into milliseconds.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/report.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"

namespace tandem::bench {

// What a hooked run over a cell's prompts saw per decode step (greedy: its steps are the timed run's).
struct Probe {
  double hot_bytes = 0, cold_bytes = 0;  // distinct experts touched per step, split by the rowmap
  double cold_rows = 0;                  // rows with at least one cold slot, per step and MoE layer summed
  double cold_share = 0;                 // cold slots / routed slots
  int64_t k = 0;                         // experts per row
};
// Runs `reqs` for `tokens` tokens each on `engine` with a routing hook, counting the decode steps only;
// `rowmap` null: every expert hot. The engine's hooks are cleared afterwards (also on an exception).
Probe probe_routing(Engine& engine, const Rowmap* rowmap, std::vector<GenerateRequest> reqs, int64_t tokens);

// Bytes per decode step of every weight but the routed experts (and the embedding, of which a step
// reads only its rows; a tied lm_head is read whole).
double fixed_bytes(const Model& model);

// Which path each part of a step's bytes takes in `lane` on `device`: on the CPU every byte is DRAM
// (primary and peer read the same memory); on a GPU local = all HBM, host = cold experts over the link,
// peer = cold experts from the peer's DRAM and the rows (f32 there and back, ids and weights) over the
// link, split = split_share of each cold expert over the link and the rest from the peer's DRAM.
PathBytes path_bytes(const Device& device, Lane lane, double fixed, const Probe& p, int64_t hidden,
                     double split_share);

// The paths whose bandwidth is still to be measured.
struct ToMeasure {
  bool hbm = false, link = false, dram = false;
  bool any() const { return hbm || link || dram; }
};
// Sets each bandwidth's source ("not used", "command line" or "measured") for lanes on `device` that
// use the link (link_used) and a peer's DRAM (dram_used; always on the CPU), and returns those left 0.
ToMeasure bandwidths_to_measure(Bandwidths& bw, const Device& device, bool link_used, bool dram_used);
// Measures them on this machine (a few seconds): the GPU reading its HBM and mapped host memory, the
// CPU its DRAM with `threads` threads. InputError for a GPU path in a build without the CUDA backend.
void measure_bandwidths(Bandwidths& bw, const ToMeasure& m, const Device& device, int threads);

}  // namespace tandem::bench
