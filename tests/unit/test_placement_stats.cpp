// Expert traffic stats: recording (empty slots skipped, kinds apart), merging, the JSON round trip,
// and rejection of bad stats files with errors that name the file and the field.
#include <gtest/gtest.h>

#include "core/error.h"
#include "placement/json_fields.h"
#include "placement/stats.h"
#include "test_util.h"

namespace tandem {
namespace {

ExpertStats small_stats() {
  // MoE layers 1 and 2 of a 3-layer model, 4 experts, top-2.
  ExpertStats st("fp1:0123456789abcdef", "deepseek_v3", ProfileMode::kTeacher, {1, 2}, 4, 2);
  const int32_t ids[] = {0, 3, 3, -1, 2, 3};        // [3 rows, 2]
  const float w[] = {0.75f, 0.25f, 1.0f, 0.0f, 0.5f, 0.5f};
  st.record(1, ids, w, 3, 2, "prose");
  const int32_t ids2[] = {1, 0};
  const float w2[] = {0.125f, 0.875f};
  st.record(2, ids2, w2, 1, 2, "code");
  st.add_tokens("prose", 3);
  st.add_tokens("code", 1);
  return st;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlacementStats, RecordCountsRowsAndGateWeights) {
  ExpertStats st = small_stats();
  EXPECT_EQ(st.layer_slot(1), 0);
  EXPECT_EQ(st.layer_slot(2), 1);
  EXPECT_EQ(st.layer_slot(0), -1);
  EXPECT_EQ(st.kinds(), (std::vector<std::string>{"code", "prose"}));
  EXPECT_EQ(st.tokens("prose"), 3);
  EXPECT_EQ(st.tokens("shell"), 0);
  EXPECT_EQ(st.total_tokens(), 4);
  const KindCounts* p = st.counts("prose");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->rows, (std::vector<int64_t>{1, 0, 1, 3, 0, 0, 0, 0}));  // the -1 slot is skipped
  EXPECT_EQ(p->gate_weight, (std::vector<double>{0.75, 0, 0.5, 1.75, 0, 0, 0, 0}));
  EXPECT_EQ(st.rows(1, 0), 1);
  EXPECT_EQ(st.rows(1, 1), 1);
  EXPECT_DOUBLE_EQ(st.gate_weight(1, 0), 0.875);
  EXPECT_EQ(st.total_rows(), (std::vector<int64_t>{1, 0, 1, 3, 1, 1, 0, 0}));
}

TEST(PlacementStats, ForModelUsesMoeLayers) {
  ModelConfig cfg;
  cfg.model_type = "deepseek_v3";
  cfg.n_layer = 4;
  cfg.layer_is_moe = {false, true, false, true};
  cfg.n_expert = 8;
  cfg.n_expert_used = 2;
  ExpertStats st = ExpertStats::for_model(cfg, "fp1:x", ProfileMode::kGenerate);
  EXPECT_EQ(st.moe_layers(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(st.n_expert(), 8);
  EXPECT_EQ(st.mode(), ProfileMode::kGenerate);
}

TEST(PlacementStatsDeathTest, RecordOnDenseLayerIsABug) {
  ExpertStats st = small_stats();
  const int32_t ids[] = {0, 1};
  EXPECT_DEATH(st.record(0, ids, nullptr, 1, 2, "prose"), "not a MoE layer");
  const int32_t bad[] = {0, 4};
  EXPECT_DEATH(st.record(1, bad, nullptr, 1, 2, "prose"), "out of range");
}

TEST(PlacementStats, JsonRoundTrip) {
  ExpertStats st = small_stats();
  st.meta()["corpus"] = "public.jsonl";
  nlohmann::json j = st.to_json();
  EXPECT_EQ(j["schema"], "tandem.stats/1");
  EXPECT_EQ(j["tokens"]["prose"], 3);
  ExpertStats back = ExpertStats::from_json(nlohmann::json::parse(j.dump()), "mem");
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.fingerprint(), "fp1:0123456789abcdef");
  EXPECT_EQ(back.meta().at("corpus"), "public.jsonl");

  test::TempDir dir;
  st.save(dir.file("stats.json"));
  EXPECT_EQ(ExpertStats::load(dir.file("stats.json")).to_json(), j);
}

TEST(PlacementStats, Merge) {
  ExpertStats a = small_stats();
  a.merge(small_stats());
  EXPECT_EQ(a.tokens("prose"), 6);
  EXPECT_EQ(a.rows(0, 3), 6);
  EXPECT_DOUBLE_EQ(a.gate_weight(0, 3), 3.5);
  ExpertStats foreign("fp1:ffffffffffffffff", "deepseek_v3", ProfileMode::kTeacher, {1, 2}, 4, 2);
  std::string msg = message_of([&] { a.merge(foreign); });
  EXPECT_NE(msg.find("fp1:ffffffffffffffff"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp1:0123456789abcdef"), std::string::npos) << msg;
  ExpertStats generate("fp1:0123456789abcdef", "deepseek_v3", ProfileMode::kGenerate, {1, 2}, 4, 2);
  EXPECT_THROW(a.merge(generate), InputError);
  ExpertStats shape("fp1:0123456789abcdef", "deepseek_v3", ProfileMode::kTeacher, {1, 2}, 8, 2);
  EXPECT_THROW(a.merge(shape), InputError);
}

TEST(PlacementStats, ValidateAgainstModel) {
  ModelConfig cfg;
  cfg.n_layer = 3;
  cfg.layer_is_moe = {false, true, true};
  cfg.n_expert = 4;
  cfg.n_expert_used = 2;
  ExpertStats st = small_stats();
  EXPECT_NO_THROW(validate_stats(st, cfg, "fp1:0123456789abcdef", "s.json"));
  std::string msg = message_of([&] { validate_stats(st, cfg, "fp1:1111111111111111", "s.json"); });
  EXPECT_NE(msg.find("s.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp1:0123456789abcdef"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp1:1111111111111111"), std::string::npos) << msg;
  cfg.layer_is_moe = {true, true, true};
  EXPECT_THROW(validate_stats(st, cfg, "fp1:0123456789abcdef", "s.json"), InputError);
  cfg.layer_is_moe = {false, true, true};
  cfg.n_expert = 5;
  EXPECT_THROW(validate_stats(st, cfg, "fp1:0123456789abcdef", "s.json"), InputError);
}

// Each case edits a valid stats document; the error must name the file and mention `expect`.
struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  const char* expect;
};

TEST(PlacementStats, RejectsBadDocuments) {
  const std::vector<BadCase> cases{
      {"schema", [](auto& j) { j["schema"] = "tandem.stats/2"; }, "tandem.stats/2"},
      {"no fingerprint", [](auto& j) { j.erase("fingerprint"); }, "fingerprint"},
      {"bad mode", [](auto& j) { j["mode"] = "sample"; }, "sample"},
      {"k > n_expert", [](auto& j) { j["n_expert_used"] = 5; }, "n_expert_used"},
      {"moe_layers not increasing", [](auto& j) { j["moe_layers"] = {2, 1}; }, "increasing"},
      {"layer count", [](auto& j) { j["layers"].erase(1); }, "layers has 1"},
      {"layer index", [](auto& j) { j["layers"][1]["layer"] = 3; }, "layers[1].layer"},
      {"short row", [](auto& j) { j["layers"][0]["rows"]["prose"].erase(0); }, "layers[0].rows.prose"},
      {"negative", [](auto& j) { j["layers"][0]["rows"]["prose"][1] = -1; }, "layers[0].rows.prose[1]"},
      {"float count", [](auto& j) { j["layers"][0]["rows"]["prose"][1] = 0.5; }, "must be an integer"},
      {"string count", [](auto& j) { j["layers"][0]["rows"]["prose"][1] = "1"; }, "must be an integer"},
      {"negative weight", [](auto& j) { j["layers"][0]["gate_weight"]["prose"][0] = -0.5; }, "gate_weight.prose[0]"},
      {"missing kind", [](auto& j) { j["layers"][1]["rows"].erase("code"); }, "layers[1].rows.code"},
      {"unknown kind", [](auto& j) { j["layers"][0]["rows"]["shell"] = {0, 0, 0, 0}; }, "shell"},
      {"more rows than tokens × k", [](auto& j) { j["tokens"]["prose"] = 1; }, "more than tokens.prose"},
      {"tokens not an object", [](auto& j) { j["tokens"] = 4; }, "tokens must be an object"},
      {"meta not strings", [](auto& j) { j["meta"] = {{"n", 1}}; }, "meta.n"},
      {"huge declared shape (rejected before allocating)", [](auto& j) { j["n_expert"] = 1 << 20; },
       "n_expert is 1048576"},
      {"not an object", [](auto& j) { j = nlohmann::json::array(); }, "JSON object"},
  };
  for (const BadCase& c : cases) {
    nlohmann::json j = small_stats().to_json();
    c.edit(j);
    std::string msg = message_of([&] { ExpertStats::from_json(j, "bad.json"); });
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(PlacementStats, RejectsMalformedAndMissingFiles) {
  test::TempDir dir;
  test::write_file(dir.file("bad.json"), "{\"schema\": \"tandem.stats/1\", ");
  std::string msg = message_of([&] { ExpertStats::load(dir.file("bad.json")); });
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  msg = message_of([&] { ExpertStats::load(dir.file("absent.json")); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(PlacementStats, ModeNames) {
  EXPECT_EQ(profile_mode_from_name("teacher"), ProfileMode::kTeacher);
  EXPECT_EQ(profile_mode_from_name("generate"), ProfileMode::kGenerate);
  EXPECT_FALSE(profile_mode_from_name("Teacher"));
  EXPECT_EQ(profile_mode_name(ProfileMode::kGenerate), "generate");
}

}  // namespace
}  // namespace tandem
