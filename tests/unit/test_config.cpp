// config.json parsing: both spellings of rope and expert counts, dense-layer rules per architecture,
// YaRN, and clear errors for bad fields.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/rope.h"
#include "io/config.h"
#include "test_util.h"

namespace tandem {
namespace {

using nlohmann::json;

json qwen3() {
  return {{"model_type", "qwen3_moe"}, {"vocab_size", 512}, {"hidden_size", 64}, {"num_hidden_layers", 4},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"moe_intermediate_size", 32},
          {"intermediate_size", 96}, {"num_experts", 16}, {"num_experts_per_tok", 4}};
}

std::string error_of(const json& j) {
  try {
    parse_config(j, "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, FixturesLoad) {
  for (const char* name : {"qwen3moe_f32", "mixtral_bf16", "olmoe_f32", "deepseekv3_f32"}) {
    ModelConfig c = load_config(test::oracle_dir(name));
    EXPECT_GT(c.n_expert, 0) << name;
  }
  ModelConfig ds = load_config(test::oracle_dir("deepseekv3_f32"));
  EXPECT_TRUE(ds.mla);
  EXPECT_EQ(ds.layer_is_moe, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(ds.kv_floats_per_token_layer(), 32 + 8);
  EXPECT_DOUBLE_EQ(ds.rope.theta, 10000.0);
  ModelConfig mx = load_config(test::oracle_dir("mixtral_bf16"));
  EXPECT_DOUBLE_EQ(mx.rope.theta, 1e6);
  EXPECT_EQ(mx.head_dim, 16);  // head_dim null -> hidden / heads
  EXPECT_TRUE(mx.norm_topk_prob);
}

TEST(Config, RopeThetaTopLevelOrInsideParameters) {
  json a = qwen3();
  a["rope_theta"] = 5e5;
  EXPECT_DOUBLE_EQ(parse_config(a, "a").rope.theta, 5e5);
  json b = qwen3();
  b["rope_parameters"] = {{"rope_theta", 7e5}, {"rope_type", "default"}};
  EXPECT_DOUBLE_EQ(parse_config(b, "b").rope.theta, 7e5);
}

TEST(Config, ExpertCountSpellings) {
  json a = qwen3();
  a.erase("num_experts");
  a["num_local_experts"] = 8;
  EXPECT_EQ(parse_config(a, "a").n_expert, 8);
}

TEST(Config, QwenDenseLayers) {
  json a = qwen3();
  a["mlp_only_layers"] = {0};
  a["decoder_sparse_step"] = 2;
  EXPECT_EQ(parse_config(a, "a").layer_is_moe, (std::vector<bool>{false, true, false, true}));
}

// A lying layer count is refused as it is read, before the per-layer table is sized from it (the
// fuzzer found a config whose num_hidden_layers asked for a 4 TiB allocation).
TEST(Config, HugeSizesAreRefusedBeforeAnythingIsAllocated) {
  json a = qwen3();
  a["num_hidden_layers"] = int64_t(1) << 45;
  EXPECT_NE(error_of(a).find("'num_hidden_layers' (35184372088832) exceeds the supported limit 16777216"),
            std::string::npos)
      << error_of(a);
  json b = qwen3();
  b["num_experts"] = int64_t(1) << 30;
  EXPECT_NE(error_of(b).find("'num_experts' (1073741824) exceeds the supported limit"), std::string::npos);
  json c = qwen3();
  c["intermediate_size"] = int64_t(1) << 30;
  EXPECT_NE(error_of(c).find("exceeds the supported limit"), std::string::npos);
  json d = qwen3();
  d["num_attention_heads"] = 128;
  d["num_key_value_heads"] = 128;
  EXPECT_NE(error_of(d).find("hidden_size (64) is smaller than num_attention_heads (128)"), std::string::npos)
      << error_of(d);
}

TEST(Config, Errors) {
  json a = qwen3();
  a.erase("vocab_size");
  EXPECT_NE(error_of(a).find("'vocab_size'"), std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(Config, MoreErrors) {
  json a = qwen3();
  a["hidden_size"] = "64";
  EXPECT_NE(error_of(a).find("'hidden_size' must be an integer"), std::string::npos);
  json b = qwen3();
  b["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(b).find("multiple"), std::string::npos);
  json c = qwen3();
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(error_of(c).find("'dynamic' is not supported"), std::string::npos);
  json d = qwen3();
  d["num_experts_per_tok"] = 17;
  EXPECT_NE(error_of(d).find("exceeds"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("object"), std::string::npos);
  json e = qwen3();
  e["model_type"] = "gpt2";
  EXPECT_NE(error_of(e).find("supported: qwen3_moe, mixtral, olmoe, deepseek_v3"), std::string::npos);
}

// DeepSeek-V3's published rope_scaling: YaRN with factor 40, mscale = mscale_all_dim = 1.
TEST(Config, YarnMatchesHandComputedValues) {
  json j = {{"model_type", "deepseek_v3"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 1},
            {"num_attention_heads", 2}, {"intermediate_size", 64}, {"moe_intermediate_size", 16},
            {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"kv_lora_rank", 8}, {"qk_nope_head_dim", 8},
            {"qk_rope_head_dim", 64}, {"v_head_dim", 8}, {"max_position_embeddings", 163840},
            {"rope_theta", 10000.0},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                              {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}};
  ModelConfig c = parse_config(j, "ds");
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope_attention_factor(), 1.0);  // mscale / mscale_all_dim cancel
  // Softmax scale: 1/sqrt(72) * (0.1 ln 40 + 1)^2.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attn_scale(), m * m / std::sqrt(72.0), 1e-12);
  // Frequencies: dim 64, base 1e4: low = floor(64 ln(4096/(32·2π)) / (2 ln 1e4)) = 10,
  // high = ceil(64 ln(4096/(1·2π)) / (2 ln 1e4)) = 23. Below 10: extrapolated (plain rope); at and above
  // 23: interpolated (divided by 40).
  Rope rope(c, 64);
  std::vector<float> x(64, 0.0f);
  auto angle_of = [&](int i) {
    std::fill(x.begin(), x.end(), 0.0f);
    x[size_t(i)] = 1.0f;  // rotate e_i: (cos, sin) land at i and i + 32
    rope.apply(x.data(), 1, 1, false);
    return std::atan2(x[size_t(i) + 32], x[size_t(i)]);
  };
  EXPECT_NEAR(angle_of(5), 1.0 / std::pow(10000.0, 10.0 / 64), 1e-6);
  EXPECT_NEAR(angle_of(30), 1.0 / (40.0 * std::pow(10000.0, 60.0 / 64)), 1e-7);
}

}  // namespace
}  // namespace tandem
