// Planner: ranking and its deterministic tie-breaks, every expert placed exactly once, the global
// policy never over its budget (randomised with a fixed seed), and evaluation of a rowmap on
// hand-made traffic whose cold share is computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "placement/planner.h"

namespace tandem {
namespace {

// n rows of one kind, each routed to `expert` (second slot empty) with gate weight w.
void put(ExpertStats& st, int64_t layer, int32_t expert, int64_t n, float w, std::string_view kind = "prose") {
  std::vector<int32_t> ids;
  std::vector<float> ws;
  for (int64_t i = 0; i < n; ++i) {
    ids.insert(ids.end(), {expert, -1});
    ws.insert(ws.end(), {w, 0.0f});
  }
  st.record(layer, ids.data(), ws.data(), n, 2, kind);
}

ExpertStats two_slot_stats(std::vector<int64_t> layers, int64_t n_expert, std::string fp = "fp1:plan") {
  return ExpertStats(std::move(fp), "qwen3_moe", ProfileMode::kTeacher, std::move(layers), n_expert, 2);
}

TEST(PlacementPlanner, RanksByRowsThenGateWeightThenId) {
  ExpertStats st = two_slot_stats({0}, 4);
  put(st, 0, 0, 5, 0.5f);   // 5 rows, 2.5
  put(st, 0, 1, 5, 1.0f);   // 5 rows, 5.0
  put(st, 0, 2, 7, 0.25f);  // 7 rows
  put(st, 0, 3, 5, 1.0f);   // 5 rows, 5.0: ties with expert 1 -> lower id first
  st.add_tokens("prose", 22);
  EXPECT_EQ(rank_layer(st, 0), (std::vector<int32_t>{2, 1, 3, 0}));
  Rowmap rm = make_rowmap(st, uniform_hot_counts(st, 2));
  ASSERT_EQ(rm.layers.size(), 1u);
  EXPECT_EQ(rm.layers[0].hot, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(rm.layers[0].cold, (std::vector<int32_t>{0, 3}));
  // cold rows 5 + 5 of 22 routed rows
  EXPECT_DOUBLE_EQ(rm.source.expected_cold_share, 10.0 / 22.0);
}

TEST(PlacementPlanner, NoTrafficRanksById) {
  ExpertStats st = two_slot_stats({0, 1}, 5);
  put(st, 1, 4, 3, 1.0f);
  st.add_tokens("prose", 3);
  EXPECT_EQ(rank_layer(st, 0), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rank_layer(st, 1), (std::vector<int32_t>{4, 0, 1, 2, 3}));
}

TEST(PlacementPlanner, SameCountsInAnyRecordOrderGiveTheSameMap) {
  std::mt19937 rng(7);
  std::vector<std::tuple<int64_t, int32_t, std::string>> events;
  for (int i = 0; i < 300; ++i)
    events.emplace_back(int64_t(rng() % 3), int32_t(rng() % 6), (rng() % 2) ? "code" : "prose");
  auto build = [&](bool reverse) {
    ExpertStats st = two_slot_stats({0, 1, 2}, 6);
    auto ev = events;
    if (reverse) std::reverse(ev.begin(), ev.end());
    for (auto& [layer, e, kind] : ev) put(st, layer, e, 1, 0.5f, kind);
    st.add_tokens("code", 300);
    st.add_tokens("prose", 300);
    return st;
  };
  for (PlanPolicy policy : {PlanPolicy::kUniform, PlanPolicy::kGlobal}) {
    PlanBudget b{PlanBudget::Kind::kHotPerLayer, 3, std::nullopt, "--hot-per-layer 3"};
    Rowmap a = *plan(build(false), policy, b, 1, nullptr).rowmap;
    Rowmap c = *plan(build(true), policy, b, 1, nullptr).rowmap;
    EXPECT_EQ(a.rowmap_fingerprint, c.rowmap_fingerprint);
    EXPECT_EQ(a.to_json(), c.to_json());
  }
}

TEST(PlacementPlanner, GlobalTieBreaksByShareThenLayer) {
  // Layers 0 and 2 identical: expert 1 has 3 of 4 rows, expert 0 has 1.
  ExpertStats st = two_slot_stats({0, 2}, 2);
  for (int64_t layer : {0, 2}) {
    put(st, layer, 1, 3, 0.5f);
    put(st, layer, 0, 1, 0.5f);
  }
  st.add_tokens("prose", 4);
  EXPECT_EQ(global_hot_counts(st, 1), (std::vector<int64_t>{1, 0}));  // tie on share -> lower layer
  EXPECT_EQ(global_hot_counts(st, 3), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(global_hot_counts(st, 99), (std::vector<int64_t>{2, 2}));  // clamped to all experts
  Rowmap rm = make_rowmap(st, global_hot_counts(st, 3));
  EXPECT_EQ(rm.layers[1].hot, (std::vector<int32_t>{1}));
}

TEST(PlacementPlanner, GlobalRanksByShareOfItsLayer) {
  // Layer 0: expert 0 has 6 of 10 rows (60%); layer 1: expert 0 has 50 of 100 rows (50%).
  ExpertStats st = two_slot_stats({0, 1}, 2);
  put(st, 0, 0, 6, 1.0f);
  put(st, 0, 1, 4, 1.0f);
  put(st, 1, 0, 50, 1.0f);
  put(st, 1, 1, 50, 1.0f);
  st.add_tokens("prose", 100);
  EXPECT_EQ(global_hot_counts(st, 1), (std::vector<int64_t>{1, 0}));
}

TEST(PlacementPlanner, EveryExpertPlacedOnce) {
  std::mt19937 rng(11);
  ExpertStats st = two_slot_stats({1, 2, 4}, 9);
  for (int64_t layer : {1, 2, 4})
    for (int32_t e = 0; e < 9; ++e) put(st, layer, e, int64_t(rng() % 4), 0.5f);
  st.add_tokens("prose", 200);
  for (int64_t h = 0; h <= 9; ++h) {
    for (const Rowmap& rm : {make_rowmap(st, uniform_hot_counts(st, h)), make_rowmap(st, global_hot_counts(st, 3 * h))}) {
      EXPECT_NO_THROW(validate_lists(rm, {1, 2, 4}, 9));
      for (const RowmapLayer& l : rm.layers) {
        std::vector<int32_t> all = l.hot;
        all.insert(all.end(), l.cold.begin(), l.cold.end());
        std::sort(all.begin(), all.end());
        std::vector<int32_t> want(9);
        for (int32_t e = 0; e < 9; ++e) want[size_t(e)] = e;
        EXPECT_EQ(all, want);
      }
      EXPECT_EQ(rm.n_hot() + rm.n_cold(), 27);
    }
    EXPECT_EQ(make_rowmap(st, uniform_hot_counts(st, h)).n_hot(), 3 * h);
  }
}

// Random teacher-like traffic: every token routes to k distinct experts in every layer.
ExpertStats random_stats(std::mt19937& rng, int64_t n_moe, int64_t n_expert, int64_t k, int64_t tokens) {
  std::vector<int64_t> layers;
  for (int64_t s = 0; s < n_moe; ++s) layers.push_back(2 * s + 1);
  ExpertStats st("fp1:rand", "qwen3_moe", ProfileMode::kTeacher, layers, n_expert, k);
  std::vector<double> bias(size_t(n_moe * n_expert));
  for (double& b : bias) b = std::pow(double(rng() % 1000 + 1), 2);  // skewed popularity
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k), 0.25f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t s = 0; s < n_moe; ++s) {
      std::vector<double> weights(bias.begin() + s * n_expert, bias.begin() + (s + 1) * n_expert);
      for (int64_t j = 0; j < k; ++j) {
        std::discrete_distribution<int32_t> pick(weights.begin(), weights.end());
        int32_t e = pick(rng);
        ids[size_t(j)] = e;
        weights[size_t(e)] = 0;  // distinct within the token
      }
      st.record(layers[size_t(s)], ids.data(), w.data(), 1, k, t % 3 ? "prose" : "code");
    }
    st.add_tokens(t % 3 ? "prose" : "code", 1);
  }
  return st;
}

TEST(PlacementPlanner, GlobalNeverOverBudgetRandomised) {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n_moe = 1 + rng() % 5, n_expert = 2 + rng() % 14, k = 1 + rng() % std::min<int64_t>(n_expert, 4);
    ExpertStats st = random_stats(rng, n_moe, n_expert, k, 20 + rng() % 60);
    const int64_t all = n_moe * n_expert;

    // A hot-count budget: exactly min(budget, all) hot, each layer a prefix of its ranking.
    const int64_t budget = rng() % (all + 5);
    std::vector<int64_t> counts = global_hot_counts(st, budget);
    int64_t sum = 0;
    for (int64_t c : counts) sum += c;
    EXPECT_EQ(sum, std::min(budget, all));
    Rowmap rm = make_rowmap(st, counts);
    EXPECT_NO_THROW(validate_lists(rm, st.moe_layers(), n_expert));

    // Equal rows in every layer (teacher mode): global keeps at least as many rows hot as uniform.
    const int64_t h = rng() % (n_expert + 1);
    Rowmap g = make_rowmap(st, global_hot_counts(st, h * n_moe));
    Rowmap u = make_rowmap(st, uniform_hot_counts(st, h));
    EXPECT_LE(g.source.expected_cold_share, u.source.expected_cold_share + 1e-12);

    // A memory budget: the chosen map plus the requested KV never exceeds the primary memory.
    MemoryModel mm;
    mm.bytes.n_moe_layer = n_moe;
    mm.bytes.n_expert = n_expert;
    mm.bytes.expert_bytes = 1000 + rng() % 100000;
    mm.bytes.attention = rng() % 1000000;
    mm.reserve_bytes = rng() % 100000;
    mm.kv_bytes_per_token = 1 + rng() % 5000;
    mm.primary_bytes = mm.bytes.primary_fixed() + mm.reserve_bytes + rng() % (mm.bytes.expert_bytes * (all + 2));
    const int64_t kv = rng() % 50;
    PlanBudget b{PlanBudget::Kind::kPrimaryMemory, 0, kv, "random"};
    for (PlanPolicy policy : {PlanPolicy::kGlobal, PlanPolicy::kUniform}) {
      if (mm.max_hot(kv) < 0) {
        EXPECT_THROW(plan(st, policy, b, mm.bytes.expert_bytes, &mm), InputError);
        continue;
      }
      PlanResult r = plan(st, policy, b, mm.bytes.expert_bytes, &mm);
      ASSERT_TRUE(r.rowmap);
      const uint64_t used = mm.bytes.primary_fixed() + mm.reserve_bytes +
                            uint64_t(r.rowmap->n_hot()) * mm.bytes.expert_bytes + uint64_t(kv) * mm.kv_bytes_per_token;
      EXPECT_LE(used, mm.primary_bytes);
      EXPECT_GE(r.rowmap->source.kv_tokens, kv);
      if (policy == PlanPolicy::kGlobal) {  // and it is the largest that fits
        EXPECT_TRUE(r.rowmap->n_hot() == all ||
                    used + mm.bytes.expert_bytes > mm.primary_bytes);
      }
    }
  }
}

TEST(PlacementPlanner, TableCoversSeventeenRowsForManyExperts) {
  std::mt19937 rng(3);
  ExpertStats st = random_stats(rng, 2, 96, 4, 30);
  PlanBudget b{PlanBudget::Kind::kHotPerLayer, 50, std::nullopt, "--hot-per-layer 50"};
  PlanResult r = plan(st, PlanPolicy::kUniform, b, 10, nullptr);
  ASSERT_EQ(r.table.size(), 18u);  // 0, 6, 12, ..., 96 per layer, plus the chosen 50
  int chosen = 0;
  for (size_t i = 0; i < r.table.size(); ++i) {
    if (i) {
      EXPECT_GE(r.table[i - 1].traffic.cold_share, r.table[i].traffic.cold_share);
    }
    chosen += r.table[i].chosen;
    if (r.table[i].chosen) {
      EXPECT_EQ(r.table[i].n_hot, 100);
    }
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_EQ(r.rowmap->n_hot(), 100);
}

// Planning stats: layer 3, four experts; the map keeps 0 and 1 hot.
Rowmap hand_map(ExpertStats& plan_stats) {
  put(plan_stats, 3, 0, 8, 1.0f, "code");
  put(plan_stats, 3, 1, 6, 1.0f, "code");
  put(plan_stats, 3, 2, 1, 1.0f, "code");
  put(plan_stats, 3, 3, 1, 1.0f, "prose");
  plan_stats.add_tokens("code", 15);
  plan_stats.add_tokens("prose", 1);
  return make_rowmap(plan_stats, {2});
}

TEST(PlacementPlanner, EvaluateOnOtherTraffic) {
  ExpertStats plan_stats = two_slot_stats({3}, 4);
  Rowmap rm = hand_map(plan_stats);
  EXPECT_EQ(rm.layers[0].hot, (std::vector<int32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(rm.source.expected_cold_share, 2.0 / 16.0);          // rows of 2 and 3 of 16
  EXPECT_DOUBLE_EQ(rm.source.expected_cold_share_by_kind.at("code"), 1.0 / 15.0);
  EXPECT_DOUBLE_EQ(rm.source.expected_cold_share_by_kind.at("prose"), 1.0);

  ExpertStats other = two_slot_stats({3}, 4);
  put(other, 3, 0, 10, 1.0f, "code");
  put(other, 3, 2, 5, 1.0f, "code");
  put(other, 3, 3, 5, 1.0f, "code");  // code: cold 10 of 20
  put(other, 3, 0, 6, 1.0f, "prose");
  put(other, 3, 1, 6, 1.0f, "prose");  // prose: cold 0 of 12
  put(other, 3, 3, 4, 1.0f, "shell");  // shell: cold 4 of 4, not in the planning stats
  other.add_tokens("code", 20);
  other.add_tokens("prose", 12);
  other.add_tokens("shell", 4);
  Evaluation ev = evaluate(rm, other, "other.json");
  EXPECT_DOUBLE_EQ(ev.measured, 14.0 / 36.0);
  EXPECT_DOUBLE_EQ(ev.expected, 2.0 / 16.0);
  EXPECT_EQ(ev.tokens, 36);
  ASSERT_EQ(ev.kinds.size(), 3u);
  EXPECT_EQ(ev.kinds[0].kind, "code");
  EXPECT_DOUBLE_EQ(ev.kinds[0].measured, 0.5);
  EXPECT_DOUBLE_EQ(*ev.kinds[0].expected, 1.0 / 15.0);
  EXPECT_EQ(ev.kinds[1].kind, "prose");
  EXPECT_DOUBLE_EQ(ev.kinds[1].measured, 0.0);
  EXPECT_EQ(ev.kinds[2].kind, "shell");
  EXPECT_DOUBLE_EQ(ev.kinds[2].measured, 1.0);
  EXPECT_FALSE(ev.kinds[2].expected);

  // 14 cold rows over 36 tokens, 1 MoE layer: host lane pulls 14/36 experts of 1000 B per token.
  ColdTraffic t = cold_traffic(rm, other, 1000);
  EXPECT_DOUBLE_EQ(t.cold_rows_per_token, 14.0 / 36.0);
  EXPECT_DOUBLE_EQ(t.host_bytes_per_token, 14000.0 / 36.0);
}

TEST(PlacementPlanner, EvaluateRejectsForeignStats) {
  ExpertStats plan_stats = two_slot_stats({3}, 4);
  Rowmap rm = hand_map(plan_stats);
  ExpertStats foreign = two_slot_stats({3}, 4, "fp1:00000000000000aa");
  put(foreign, 3, 0, 1, 1.0f);
  foreign.add_tokens("prose", 1);
  try {
    evaluate(rm, foreign, "other.json");
    FAIL() << "accepted stats of another model";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("fp1:00000000000000aa"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp1:plan"), std::string::npos) << msg;
  }
  ExpertStats other_layers = two_slot_stats({2}, 4);
  put(other_layers, 2, 0, 1, 1.0f);
  other_layers.add_tokens("prose", 1);
  EXPECT_THROW(evaluate(rm, other_layers, "other.json"), InputError);
  ExpertStats empty = two_slot_stats({3}, 4);
  EXPECT_THROW(evaluate(rm, empty, "other.json"), InputError);
}

TEST(PlacementPlanner, PolicyNames) {
  EXPECT_EQ(plan_policy_from_name("uniform"), PlanPolicy::kUniform);
  EXPECT_EQ(plan_policy_from_name("global"), PlanPolicy::kGlobal);
  EXPECT_FALSE(plan_policy_from_name("greedy"));
  EXPECT_EQ(plan_policy_name(PlanPolicy::kGlobal), "global");
}

}  // namespace
}  // namespace tandem
