// Oracle tests: the engine against what transformers computed on the repo's fixtures (tests/fixtures/oracle,
// made by tests/fixtures/make.py) and, when ../shared is beside the checkout, on its set too; and the
// batching invariants the fixtures can't see (sequences of different lengths, chunked prefill).
#include <gtest/gtest.h>

#include "engine/generate.h"
#include "engine/verify.h"
#include "models/synth.h"
#include "test_util.h"

namespace tandem {
namespace {

class Oracle : public ::testing::TestWithParam<std::string> {};

// "repo/NAME": tests/fixtures/oracle/NAME (must exist); "shared/NAME": ../shared's, "" when it is absent.
std::string case_dir(const std::string& param) {
  const auto slash = param.find('/');
  const std::string set = param.substr(0, slash), name = param.substr(slash + 1);
  return set == "repo" ? test::oracle_dir(name) : test::shared_oracle_dir(name);
}
constexpr const char* kNoShared = "no ../shared beside the checkout: the extra fixture set is not there";

TEST_P(Oracle, MatchesTransformers) {
  const std::string dir = case_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << kNoShared;
  auto model = Model::load(dir);
  CpuEngine engine(*model);
  // f32 compute vs an f32 reference: 1e-4 relative (fixture README); tokens exact.
  auto checks = verify_against(engine, dir + "/expected.safetensors");
  ASSERT_GE(checks.size(), 4u);
  for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << " max_rel_err " << c.max_rel_err;
}

// Rows of several sequences of different lengths in one batch give the same logits as each
// sequence alone; a prompt prefilled in chunks gives the same logits as one prefill.
TEST_P(Oracle, BatchingDoesNotChangeAnswers) {
  const std::string dir = case_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << kNoShared;
  auto model = Model::load(dir);
  const int64_t V = model->cfg.vocab_size;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 99, 3, 250, 7, 8}, {42}, {300, 301, 302, 7}};
  // Alone, 3 decode steps each.
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    CpuEngine e(*model);
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = 3;
    GenerateOptions o;
    o.keep_logits = true;
    auto res = generate(e, std::span<const GenerateRequest>(&r, 1), o);
    alone.push_back(res[0].logits);
  }
  // Together, prefill in chunks of 2 rows.
  CpuEngine e(*model);
  std::vector<GenerateRequest> reqs;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = 3;
    reqs.push_back(r);
  }
  GenerateOptions o;
  o.keep_logits = true;
  o.prefill_chunk = 2;
  auto res = generate(e, reqs, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(res[i].logits.size(), size_t(3 * V));
    // Same f32 arithmetic in a different row grouping: rounding-level differences only.
    EXPECT_LT(max_rel_err(res[i].logits.data(), alone[i].data(), 3 * V), 1e-5) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Oracle,
                         ::testing::Values("repo/qwen3moe_f32", "repo/mixtral_bf16", "repo/olmoe_f32",
                                           "repo/deepseekv3_f32", "shared/qwen3moe_f32", "shared/mixtral_bf16",
                                           "shared/olmoe_f32", "shared/deepseekv3_f32", "shared/qwen3moe_fp8",
                                           "shared/deepseekv3_fp8"));

// MLA with q_lora wider than the hidden size (q_a's rows outgrow the engine's hidden-sized scratch):
// an engine's first prefill gives the same logits as one whose buffers a bigger batch already grew.
// Until 2026-12-06 the first one wrote the attention output through a pointer into a buffer it had
// just reallocated (found by the CUDA engine disagreeing with the CPU on such a shape).
TEST(CpuEngineBuffers, WideQLoraFirstStepMatchesAWarmEngine) {
  test::TempDir tmp;
  nlohmann::json cfg = synth_preset_config("tiny");
  cfg["q_lora_rank"] = 4 * cfg["hidden_size"].get<int>();
  SynthOptions so;
  so.seed = 11;
  write_synthetic_model(cfg, tmp.path, so);
  auto model = Model::load(tmp.path);
  GenerateRequest r;
  r.prompt = {5, 17, 99, 3, 250, 7};
  r.max_tokens = 3;
  GenerateOptions o;
  o.keep_logits = true;
  CpuEngine fresh(*model);
  const auto got = generate(fresh, std::span<const GenerateRequest>(&r, 1), o).at(0);
  CpuEngine warm(*model);
  std::vector<GenerateRequest> big(2, r);
  big[0].prompt.resize(32, 9);
  big[1].prompt.resize(40, 4);
  generate(warm, big, o);
  const auto want = generate(warm, std::span<const GenerateRequest>(&r, 1), o).at(0);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logits, want.logits);
}

TEST(OracleCli, VerifyPrintsPassAndFailsOnForeignReference) {
  const std::string q = test::oracle_dir("qwen3moe_f32");
  auto ok = test::run_tandem({"verify", "--model", q, "--expected", q + "/expected.safetensors", "--threads", "2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("verify: PASS"), std::string::npos) << ok.out;
  // The mixtral reference against the qwen3 model: same shapes, a different function.
  const std::string m = test::oracle_dir("mixtral_bf16");
  auto bad = test::run_tandem({"verify", "--model", q, "--expected", m + "/expected.safetensors", "--threads", "2"});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.out.find("verify: FAIL"), std::string::npos) << bad.out;
  // The olmoe reference has 2 layers: a reference that doesn't fit the model is bad input.
  const std::string o = test::oracle_dir("olmoe_f32");
  auto misfit = test::run_tandem({"verify", "--model", q, "--expected", o + "/expected.safetensors"});
  EXPECT_EQ(misfit.exit_code, 2);
  EXPECT_NE(misfit.err.find("moe_out.2"), std::string::npos) << misfit.err;
}

}  // namespace
}  // namespace tandem
