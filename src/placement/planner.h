// The planner: ranks routed experts by decode traffic (routed rows) and splits each MoE layer into
// hot (primary) and cold (peer) experts under one budget. Deterministic: ties break by gate-weight
// sum (desc), then layer and expert id (asc). The global policy never exceeds its hot budget.
// Also evaluates a rowmap on other traffic (the cold share it actually sees).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "placement/memory_model.h"
#include "placement/rowmap.h"
#include "placement/stats.h"

namespace tandem {

// uniform: the same hot count in every MoE layer, ranked within each layer;
// global: one hot budget over all layers, (layer, expert) pairs ranked by their layer's traffic share.
enum class PlanPolicy { kUniform, kGlobal };
std::string_view plan_policy_name(PlanPolicy p);
std::optional<PlanPolicy> plan_policy_from_name(std::string_view s);

// Experts of MoE slot `slot` hottest first: rows desc, gate-weight sum desc, id asc.
std::vector<int32_t> rank_layer(const ExpertStats& stats, int64_t slot);
// Hot count per MoE slot for each policy. uniform: min(hot_per_layer, n_expert) everywhere.
// global: the top n_hot_total (clamped to all experts) pairs by rows / layer rows (exact rational
// compare), then gate-weight share desc, layer asc, expert asc; a layer without traffic ranks last.
std::vector<int64_t> uniform_hot_counts(const ExpertStats& stats, int64_t hot_per_layer);
std::vector<int64_t> global_hot_counts(const ExpertStats& stats, int64_t n_hot_total);
// The rowmap keeping the top hot_counts[s] experts of each slot hot (source.policy etc. left empty
// except mode and tokens; expected cold shares filled in).
Rowmap make_rowmap(const ExpertStats& stats, const std::vector<int64_t>& hot_counts);

// What a split does to traffic, measured on `stats`.
struct ColdTraffic {
  double cold_share = 0;                       // cold rows / routed rows, all kinds
  std::map<std::string, double> by_kind;        // the same per kind (kinds with rows only)
  double cold_rows_per_token = 0;              // cold rows / decode steps, summed over MoE layers
  // Host lane (experts read over the link by the primary): cold_rows_per_token × expert_bytes. For one
  // sequence a token's k experts in a layer are distinct, so this is the expected expert weight bytes
  // pulled over the link per decoded token.
  double host_bytes_per_token = 0;
};
// Fails (InputError) when the stats have no tokens or when rm does not fit the stats' layers/experts.
ColdTraffic cold_traffic(const Rowmap& rm, const ExpertStats& stats, uint64_t expert_bytes);

struct PlanBudget {
  enum class Kind { kHotPerLayer, kColdPerLayer, kPrimaryMemory };
  Kind kind = Kind::kHotPerLayer;
  int64_t per_layer = 0;             // kHotPerLayer / kColdPerLayer
  std::optional<int64_t> kv_tokens;  // kPrimaryMemory: solve for it; absent: table only, no map
  std::string text;                  // as the operator wrote it, stored in the rowmap
};

struct TradeoffRow {
  int64_t n_hot = 0;           // hot experts in all
  double hot_per_layer = 0;    // n_hot / n_moe_layer
  int64_t kv_tokens = -1;      // KV capacity; -1: no memory budget given, or it does not fit
  bool fits = true;            // false when the weights alone exceed the primary memory
  ColdTraffic traffic;
  bool chosen = false;
};

struct PlanResult {
  std::optional<Rowmap> rowmap;  // absent for kPrimaryMemory without kv_tokens
  std::vector<TradeoffRow> table;
};

// Plans under `budget`. expert_bytes (one routed expert) prices the host-lane column. memory is
// required for kPrimaryMemory and, when given with the other budgets, fills the KV column. The table covers every hot count per layer when n_expert <= 64, else 17 evenly
// spaced ones, plus the chosen one (marked). Fails (InputError) when the budget cannot be met: the
// fixed part and the requested KV do not fit, or a per-layer count exceeds n_expert.
PlanResult plan(const ExpertStats& stats, PlanPolicy policy, const PlanBudget& budget, uint64_t expert_bytes,
                const MemoryModel* memory);

// A rowmap measured on other traffic next to what it expected.
struct Evaluation {
  double expected = 0;  // from the rowmap's source summary
  double measured = 0;
  struct Kind {
    std::string kind;
    int64_t tokens = 0;
    double measured = 0;
    std::optional<double> expected;  // when the planning stats had this kind
  };
  std::vector<Kind> kinds;
  int64_t tokens = 0;
};
// The stats must come from the rowmap's model (error names both fingerprints) and match its layers.
Evaluation evaluate(const Rowmap& rm, const ExpertStats& stats, std::string_view stats_source);

}  // namespace tandem
