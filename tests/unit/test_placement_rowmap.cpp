// Rowmaps: the JSON round trip, lookups, the rowmap fingerprint, and the one validation every
// consumer runs — malformed JSON, a duplicated or missing expert, an id out of range, a missing or
// extra layer, a foreign fingerprint and a wrong schema are each rejected with a clear error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem {
namespace {

constexpr const char* kFp = "fp1:00112233445566aa";

// 3 layers, layer 0 dense, layers 1 and 2 MoE with 6 experts.
ModelConfig config() {
  ModelConfig c;
  c.n_layer = 3;
  c.layer_is_moe = {false, true, true};
  c.n_expert = 6;
  c.n_expert_used = 2;
  return c;
}

Rowmap good_map() {
  Rowmap rm;
  rm.fingerprint = kFp;
  rm.source.mode = "teacher";
  rm.source.tokens = {{"code", 10}, {"prose", 20}};
  rm.source.policy = "uniform";
  rm.source.budget = "--hot-per-layer 4";
  rm.source.expected_cold_share = 0.125;
  rm.source.expected_cold_share_by_kind = {{"code", 0.25}, {"prose", 0.0625}};
  rm.layers = {{1, {5, 0, 2, 3}, {4, 1}}, {2, {0, 1, 2, 3}, {5, 4}}};
  rm.finalize();
  return rm;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlacementRowmap, FinalizeSortsAndLooksUp) {
  Rowmap rm = good_map();
  EXPECT_EQ(rm.layers[0].hot, (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(rm.layers[0].cold, (std::vector<int32_t>{1, 4}));
  EXPECT_TRUE(rm.is_cold(1, 4));
  EXPECT_FALSE(rm.is_cold(1, 5));
  EXPECT_TRUE(rm.is_cold(2, 5));
  EXPECT_EQ(rm.find_layer(0), nullptr);
  EXPECT_EQ(rm.n_hot(), 8);
  EXPECT_EQ(rm.n_cold(), 4);
  EXPECT_EQ(expert_slot_table(rm.layers[0], 6), (std::vector<int32_t>{0, -1, 1, 2, -2, 3}));
  EXPECT_NO_THROW(validate(rm, config(), kFp));
}

TEST(PlacementRowmap, JsonRoundTrip) {
  Rowmap rm = good_map();
  nlohmann::json j = rm.to_json();
  EXPECT_EQ(j["schema"], "tandem.rowmap/1");
  EXPECT_EQ(j["rowmap_fingerprint"], rm.rowmap_fingerprint);
  Rowmap back = Rowmap::from_json(nlohmann::json::parse(j.dump()), "mem");
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.source.tokens.at("prose"), 20);
  EXPECT_DOUBLE_EQ(back.source.expected_cold_share_by_kind.at("code"), 0.25);

  test::TempDir dir;
  rm.save(dir.file("r.json"));
  EXPECT_EQ(Rowmap::load(dir.file("r.json")).to_json(), j);
}

TEST(PlacementRowmap, ListOrderInTheFileDoesNotMatter) {
  nlohmann::json j = good_map().to_json();
  j["layers"][0]["hot"] = {5, 3, 2, 0};
  j["layers"] = {j["layers"][1], j["layers"][0]};
  Rowmap rm = Rowmap::from_json(j, "r.json");
  EXPECT_EQ(rm.layers[0].layer, 1);
  EXPECT_EQ(rm.layers[0].hot, (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(rm.rowmap_fingerprint, good_map().rowmap_fingerprint);
}

TEST(PlacementRowmap, FingerprintTracksTheSplit) {
  Rowmap a = good_map();
  Rowmap b = good_map();
  std::swap(b.layers[0].hot[0], b.layers[0].cold[0]);  // expert 0 cold, 1 hot
  b.finalize();
  EXPECT_NE(a.rowmap_fingerprint, b.rowmap_fingerprint);
  Rowmap c = good_map();
  c.fingerprint = "fp1:ffffffffffffffff";
  c.finalize();
  EXPECT_NE(a.rowmap_fingerprint, c.rowmap_fingerprint);
  Rowmap d = good_map();
  d.source.expected_cold_share = 0.5;  // the summary is not part of the split
  d.finalize();
  EXPECT_EQ(a.rowmap_fingerprint, d.rowmap_fingerprint);
  // FNV-1a 64 of "rowmap\nmodel=<fp>\nlayer=1\nhot=0,2,3,5\ncold=1,4\nlayer=2\nhot=0,1,2,3\ncold=4,5\n",
  // computed with Python from the recipe in docs/placement.md.
  EXPECT_EQ(a.rowmap_fingerprint, "fp1:90d2cbd6808df9df");
}

// Each case edits a valid rowmap document; loading and validating must fail naming the file and
// mentioning `expect`.
struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  const char* expect;
};

TEST(PlacementRowmap, RejectsBadRowmaps) {
  const std::vector<BadCase> cases{
      {"wrong schema version", [](auto& j) { j["schema"] = "tandem.rowmap/2"; }, "tandem.rowmap/2"},
      {"no schema", [](auto& j) { j.erase("schema"); }, "missing field schema"},
      {"duplicated across lists", [](auto& j) { j["layers"][0]["cold"] = {1, 4, 5}; }, "expert 5 appears twice"},
      {"duplicated in one list", [](auto& j) { j["layers"][1]["cold"] = {4, 4, 5}; }, "expert 4 appears twice"},
      {"missing expert", [](auto& j) { j["layers"][0]["cold"] = {1}; }, "layer 1: expert 4 is neither hot nor cold"},
      {"id out of range", [](auto& j) { j["layers"][0]["cold"] = {1, 4, 6}; }, "expert id 6 is out of range [0, 6)"},
      {"negative id", [](auto& j) { j["layers"][0]["cold"] = {1, 4, -1}; }, "expert id -1 is out of range"},
      {"huge id", [](auto& j) { j["layers"][0]["cold"] = {1, 4, 1ll << 40}; }, "layers[0].cold[2]"},
      {"id not a number", [](auto& j) { j["layers"][0]["cold"] = {1, "4"}; }, "must be an integer"},
      {"missing layer", [](auto& j) { j["layers"].erase(1); }, "MoE layer 2 is missing"},
      {"dense layer", [](auto& j) { j["layers"].push_back({{"layer", 0}, {"hot", {0}}, {"cold", nlohmann::json::array()}}); },
       "layer 0 is not a MoE layer"},
      {"layer past the end", [](auto& j) { j["layers"].push_back({{"layer", 7}, {"hot", nlohmann::json::array()}, {"cold", nlohmann::json::array()}}); },
       "layer 7 is not a MoE layer"},
      {"layer twice", [](auto& j) { j["layers"].push_back(j["layers"][0]); }, "MoE layer 1 appears 2 times"},
      {"layers not an array", [](auto& j) { j["layers"] = {{"1", 2}}; }, "layers must be an array"},
      {"no source", [](auto& j) { j.erase("source"); }, "missing field source"},
      {"share above one", [](auto& j) { j["source"]["expected_cold_share"] = 1.5; }, "must be <= 1"},
      {"edited lists", [](auto& j) { j["layers"][0]["cold"] = {1, 4, 5}, j["layers"][0]["hot"] = {0, 2, 3}; },
       "does not match the contents"},
      {"not an object", [](auto& j) { j = 42; }, "must be a JSON object"},
  };
  for (const BadCase& c : cases) {
    nlohmann::json j = good_map().to_json();
    c.edit(j);
    if (std::string_view(c.name) != "edited lists" && j.is_object()) j.erase("rowmap_fingerprint");
    std::string msg = message_of([&] { validate(Rowmap::from_json(j, "bad.json"), config(), kFp, "bad.json"); });
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(PlacementRowmap, HandEditWithoutStoredFingerprintIsAccepted) {
  nlohmann::json j = good_map().to_json();
  j["layers"][0]["hot"] = {0, 2, 3};
  j["layers"][0]["cold"] = {1, 4, 5};
  j.erase("rowmap_fingerprint");
  Rowmap rm = Rowmap::from_json(j, "edited.json");
  EXPECT_NO_THROW(validate(rm, config(), kFp, "edited.json"));
  EXPECT_TRUE(rm.is_cold(1, 5));
  EXPECT_NE(rm.rowmap_fingerprint, good_map().rowmap_fingerprint);
}

TEST(PlacementRowmap, ForeignFingerprintNamesBoth) {
  std::string msg = message_of([&] { validate(good_map(), config(), "fp1:9999999999999999", "r.json"); });
  EXPECT_NE(msg.find("r.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kFp), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp1:9999999999999999"), std::string::npos) << msg;
}

TEST(PlacementRowmap, OtherExpertCountIsRejected) {
  ModelConfig cfg = config();
  cfg.n_expert = 8;  // same layers, more experts: 6 and 7 are unplaced
  std::string msg = message_of([&] { validate(good_map(), cfg, kFp, "r.json"); });
  EXPECT_NE(msg.find("expert 6 is neither hot nor cold"), std::string::npos) << msg;
}

TEST(PlacementRowmap, MalformedAndMissingFiles) {
  test::TempDir dir;
  test::write_file(dir.file("r.json"), "{\"schema\": \"tandem.rowmap/1\",, }");
  std::string msg = message_of([&] { Rowmap::load(dir.file("r.json")); });
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("r.json"), std::string::npos) << msg;
  test::write_file(dir.file("empty.json"), "");
  EXPECT_THROW(Rowmap::load(dir.file("empty.json")), InputError);
  msg = message_of([&] { Rowmap::load(dir.file("absent.json")); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
