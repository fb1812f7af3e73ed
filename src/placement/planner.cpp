// The planner: ranking, the uniform and global policies, the trade-off table and evaluation
// (see planner.h and docs/placement.md "Planning").
#include "placement/planner.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace tandem {

std::string_view plan_policy_name(PlanPolicy p) {
  switch (p) {
    case PlanPolicy::kUniform:
      return "uniform";
    case PlanPolicy::kGlobal:
      return "global";
  }
  TANDEM_ASSERT(false, "unknown policy {}", int(p));
}

std::optional<PlanPolicy> plan_policy_from_name(std::string_view s) {
  if (s == "uniform") return PlanPolicy::kUniform;
  if (s == "global") return PlanPolicy::kGlobal;
  return std::nullopt;
}

namespace {

struct Candidate {
  int64_t slot;
  int32_t expert;
  int64_t rows;
  int64_t layer_rows;  // rows of the whole layer
  double gate_weight;
  double layer_gate_weight;
};

// Within one layer: rows desc, gate weight desc, id asc.
bool hotter_in_layer(const Candidate& a, const Candidate& b) {
  if (a.rows != b.rows) return a.rows > b.rows;
  if (a.gate_weight != b.gate_weight) return a.gate_weight > b.gate_weight;
  return a.expert < b.expert;
}

// Across layers: traffic share desc (exact: rows_a·total_b vs rows_b·total_a; a layer without traffic
// has share 0), gate-weight share desc, slot asc. Same layer: hotter_in_layer, which orders the same
// way, so each layer's chosen experts are a prefix of rank_layer.
bool hotter_global(const Candidate& a, const Candidate& b) {
  if (a.slot == b.slot) return hotter_in_layer(a, b);
  __int128 na = a.layer_rows ? a.rows : 0, da = a.layer_rows ? a.layer_rows : 1;
  __int128 nb = b.layer_rows ? b.rows : 0, db = b.layer_rows ? b.layer_rows : 1;
  if (na * db != nb * da) return na * db > nb * da;
  double ga = a.layer_gate_weight > 0 ? a.gate_weight / a.layer_gate_weight : 0;
  double gb = b.layer_gate_weight > 0 ? b.gate_weight / b.layer_gate_weight : 0;
  if (ga != gb) return ga > gb;
  return a.slot < b.slot;
}

std::vector<Candidate> layer_candidates(const ExpertStats& stats, const std::vector<int64_t>& rows,
                                        const std::vector<double>& gw, int64_t slot) {
  const int64_t n = stats.n_expert();
  std::vector<Candidate> out;
  int64_t layer_rows = 0;
  double layer_gw = 0;
  for (int64_t e = 0; e < n; ++e) {
    layer_rows += rows[size_t(slot * n + e)];
    layer_gw += gw[size_t(slot * n + e)];
  }
  for (int64_t e = 0; e < n; ++e)
    out.push_back({slot, int32_t(e), rows[size_t(slot * n + e)], layer_rows, gw[size_t(slot * n + e)], layer_gw});
  return out;
}

}  // namespace

std::vector<int32_t> rank_layer(const ExpertStats& stats, int64_t slot) {
  TANDEM_ASSERT(slot >= 0 && slot < stats.n_moe_layer(), "rank_layer: slot {}", slot);
  std::vector<Candidate> c = layer_candidates(stats, stats.total_rows(), stats.total_gate_weight(), slot);
  std::sort(c.begin(), c.end(), hotter_in_layer);
  std::vector<int32_t> out;
  for (const Candidate& x : c) out.push_back(x.expert);
  return out;
}

std::vector<int64_t> uniform_hot_counts(const ExpertStats& stats, int64_t hot_per_layer) {
  TANDEM_ASSERT(hot_per_layer >= 0, "hot_per_layer {}", hot_per_layer);
  return std::vector<int64_t>(size_t(stats.n_moe_layer()), std::min(hot_per_layer, stats.n_expert()));
}

std::vector<int64_t> global_hot_counts(const ExpertStats& stats, int64_t n_hot_total) {
  TANDEM_ASSERT(n_hot_total >= 0, "n_hot_total {}", n_hot_total);
  const std::vector<int64_t> rows = stats.total_rows();
  const std::vector<double> gw = stats.total_gate_weight();
  std::vector<Candidate> all;
  for (int64_t s = 0; s < stats.n_moe_layer(); ++s) {
    std::vector<Candidate> c = layer_candidates(stats, rows, gw, s);
    all.insert(all.end(), c.begin(), c.end());
  }
  const size_t take = size_t(std::min<int64_t>(n_hot_total, int64_t(all.size())));
  std::partial_sort(all.begin(), all.begin() + ptrdiff_t(take), all.end(), hotter_global);
  std::vector<int64_t> counts(size_t(stats.n_moe_layer()), 0);
  for (size_t i = 0; i < take; ++i) ++counts[size_t(all[i].slot)];
  return counts;
}

Rowmap make_rowmap(const ExpertStats& stats, const std::vector<int64_t>& hot_counts) {
  TANDEM_ASSERT(int64_t(hot_counts.size()) == stats.n_moe_layer(), "hot_counts has {} entries, {} MoE layers",
                hot_counts.size(), stats.n_moe_layer());
  Rowmap rm;
  rm.fingerprint = stats.fingerprint();
  rm.source.mode = profile_mode_name(stats.mode());
  for (const std::string& kind : stats.kinds()) rm.source.tokens[kind] = stats.tokens(kind);
  for (int64_t s = 0; s < stats.n_moe_layer(); ++s) {
    const int64_t h = hot_counts[size_t(s)];
    TANDEM_ASSERT(h >= 0 && h <= stats.n_expert(), "hot count {} of slot {}", h, s);
    std::vector<int32_t> ranked = rank_layer(stats, s);
    RowmapLayer l;
    l.layer = stats.moe_layers()[size_t(s)];
    l.hot.assign(ranked.begin(), ranked.begin() + h);
    l.cold.assign(ranked.begin() + h, ranked.end());
    rm.layers.push_back(std::move(l));
  }
  if (stats.total_tokens() > 0) {
    ColdTraffic t = cold_traffic(rm, stats, 0);
    rm.source.expected_cold_share = t.cold_share;
    rm.source.expected_cold_share_by_kind = t.by_kind;
  }
  rm.finalize();
  return rm;
}

ColdTraffic cold_traffic(const Rowmap& rm, const ExpertStats& stats, uint64_t expert_bytes) {
  validate_lists(rm, stats.moe_layers(), stats.n_expert(), "rowmap");
  if (stats.total_tokens() <= 0) fail("stats hold no tokens: nothing to measure the rowmap on");
  ColdTraffic t;
  int64_t cold_all = 0, rows_all = 0;
  const int64_t n = stats.n_expert();
  for (const std::string& kind : stats.kinds()) {
    const KindCounts& c = *stats.counts(kind);
    int64_t cold = 0, rows = 0;
    for (int64_t s = 0; s < stats.n_moe_layer(); ++s) {
      const RowmapLayer* l = rm.find_layer(stats.moe_layers()[size_t(s)]);
      for (int32_t e : l->cold) cold += c.rows[size_t(s * n + e)];
      for (int64_t e = 0; e < n; ++e) rows += c.rows[size_t(s * n + e)];
    }
    if (rows > 0) t.by_kind[kind] = double(cold) / double(rows);
    cold_all += cold;
    rows_all += rows;
  }
  t.cold_share = rows_all > 0 ? double(cold_all) / double(rows_all) : 0;
  t.cold_rows_per_token = double(cold_all) / double(stats.total_tokens());
  t.host_bytes_per_token = t.cold_rows_per_token * double(expert_bytes);
  return t;
}

PlanResult plan(const ExpertStats& stats, PlanPolicy policy, const PlanBudget& budget, uint64_t expert_bytes,
                const MemoryModel* memory) {
  const int64_t n_moe = stats.n_moe_layer(), n_expert = stats.n_expert();
  if (n_moe == 0) fail("the model has no MoE layers: nothing to plan");
  if (stats.total_tokens() <= 0) fail("the stats hold no tokens: profile some text first");

  // The chosen total hot count (absent: table only).
  std::optional<int64_t> chosen;
  switch (budget.kind) {
    case PlanBudget::Kind::kHotPerLayer:
    case PlanBudget::Kind::kColdPerLayer: {
      if (budget.per_layer < 0 || budget.per_layer > n_expert)
        fail("{} must be in [0, {}] (experts per MoE layer)", budget.text, n_expert);
      int64_t h = budget.kind == PlanBudget::Kind::kHotPerLayer ? budget.per_layer : n_expert - budget.per_layer;
      chosen = h * n_moe;
      break;
    }
    case PlanBudget::Kind::kPrimaryMemory: {
      TANDEM_ASSERT(memory != nullptr, "a memory budget needs a memory model");
      if (!budget.kv_tokens) break;
      if (*budget.kv_tokens < 0) fail("--kv-tokens must be >= 0");
      int64_t max_hot = memory->max_hot(*budget.kv_tokens);
      if (max_hot < 0)
        fail("the primary memory ({}) does not hold the fixed weights ({}), the reserve ({}) and {} tokens of KV "
             "cache ({}), even with no hot expert",
             format_bytes(memory->primary_bytes), format_bytes(memory->bytes.primary_fixed()),
             format_bytes(memory->reserve_bytes), *budget.kv_tokens,
             format_bytes(uint64_t(*budget.kv_tokens) * memory->kv_bytes_per_token));
      chosen = policy == PlanPolicy::kUniform ? std::min(n_expert, max_hot / n_moe) * n_moe : max_hot;
      break;
    }
  }

  auto counts_for = [&](int64_t n_hot) {
    return policy == PlanPolicy::kUniform ? uniform_hot_counts(stats, n_hot / n_moe)
                                          : global_hot_counts(stats, n_hot);
  };
  auto row_for = [&](int64_t n_hot) {
    TradeoffRow r;
    Rowmap rm = make_rowmap(stats, counts_for(n_hot));
    r.n_hot = rm.n_hot();
    r.hot_per_layer = double(r.n_hot) / double(n_moe);
    if (memory) {
      r.kv_tokens = memory->kv_tokens(r.n_hot);
      r.fits = r.kv_tokens >= 0;
    }
    r.traffic = cold_traffic(rm, stats, expert_bytes);
    r.chosen = chosen && *chosen == n_hot;
    return std::pair(r, std::move(rm));
  };

  std::set<int64_t> per_layer;
  if (n_expert <= 64) {
    for (int64_t h = 0; h <= n_expert; ++h) per_layer.insert(h);
  } else {
    for (int64_t i = 0; i <= 16; ++i) per_layer.insert(n_expert * i / 16);
  }
  std::set<int64_t> totals;
  for (int64_t h : per_layer) totals.insert(h * n_moe);
  if (chosen) totals.insert(*chosen);

  PlanResult result;
  for (int64_t n_hot : totals) {
    auto [row, rm] = row_for(n_hot);
    if (row.chosen) {
      rm.source.policy = plan_policy_name(policy);
      rm.source.budget = budget.text;
      rm.source.kv_tokens = row.kv_tokens;
      rm.finalize();
      result.rowmap = std::move(rm);
    }
    result.table.push_back(row);
  }
  TANDEM_ASSERT(!chosen || result.rowmap, "the chosen plan is missing from the table");
  return result;
}

Evaluation evaluate(const Rowmap& rm, const ExpertStats& stats, std::string_view stats_source) {
  if (stats.fingerprint() != rm.fingerprint)
    fail("{}: stats were made for model {}, the rowmap for model {}", stats_source, stats.fingerprint(),
         rm.fingerprint);
  ColdTraffic t = cold_traffic(rm, stats, 0);
  Evaluation ev;
  ev.expected = rm.source.expected_cold_share;
  ev.measured = t.cold_share;
  ev.tokens = stats.total_tokens();
  for (const std::string& kind : stats.kinds()) {
    Evaluation::Kind k;
    k.kind = kind;
    k.tokens = stats.tokens(kind);
    auto m = t.by_kind.find(kind);
    k.measured = m == t.by_kind.end() ? 0 : m->second;
    auto e = rm.source.expected_cold_share_by_kind.find(kind);
    if (e != rm.source.expected_cold_share_by_kind.end()) k.expected = e->second;
    ev.kinds.push_back(std::move(k));
  }
  return ev;
}

}  // namespace tandem
