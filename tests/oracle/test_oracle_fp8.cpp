// FP8 oracle cases (tests/fixtures/oracle/{deepseekv3_fp8,qwen3moe_fp8}): block-scaled F8_E4M3
// checkpoints, edge blocks partial, against what transformers computed on the dequantized weights.
// The CPU engine dequantizes in its kernels (FP8 stays FP8 in memory) and must meet the f32 tolerance
// on every SIMD path, batch the same way as the float fixtures, and pass `tandem verify`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels.h"
#include "engine/generate.h"
#include "engine/verify.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"
#include "test_util.h"

namespace tandem {
namespace {

class OracleFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleFp8, WeightsStayFp8WithTheirScales) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  int64_t fp8 = 0;
  for (const auto& L : model->layers) {
    for (const TensorView* v : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.q_a, &L.attn.q_b, &L.attn.kv_a,
                                &L.attn.kv_b, &L.attn.o, &L.dense.gate, &L.dense.up, &L.dense.down, &L.shared.gate,
                                &L.shared.up, &L.shared.down}) {
      if (v->empty()) continue;
      EXPECT_EQ(v->dtype, DType::kF8E4M3);
      EXPECT_FALSE(v->scale.empty());
      ++fp8;
    }
    for (const auto& e : L.experts) {
      if (!e.present()) continue;
      EXPECT_EQ(e.gate.dtype, DType::kF8E4M3);
      EXPECT_EQ(e.nbytes(), e.gate.nbytes() + e.up.nbytes() + e.down.nbytes() + e.gate.scale_nbytes() +
                                e.up.scale_nbytes() + e.down.scale_nbytes());
      ++fp8;
    }
    EXPECT_EQ(L.router.empty() ? DType::kBF16 : L.router.dtype, DType::kBF16);
  }
  EXPECT_GT(fp8, 0);
  EXPECT_EQ(model->embed.dtype, DType::kBF16);
  EXPECT_EQ(model->lm_head.dtype, DType::kBF16);
}

TEST_P(OracleFp8, MatchesTransformersOnEverySimdPath) {
  const std::string dir = test::oracle_dir(GetParam());
  auto model = Model::load(dir);
  const cpu::SimdPath saved = cpu::current_simd_path();
  for (cpu::SimdPath p : {cpu::SimdPath::kScalar, cpu::SimdPath::kAvx2, cpu::SimdPath::kAvx512}) {
    if (!cpu::simd_supported(p)) continue;
    cpu::set_simd_path(p);
    CpuEngine engine(*model);
    // f32 compute on dequantized weights vs an f32 reference on the same: 1e-4 relative; tokens exact.
    auto checks = verify_against(engine, dir + "/expected.safetensors");
    ASSERT_GE(checks.size(), 4u);
    for (const auto& c : checks)
      EXPECT_TRUE(c.pass) << cpu::simd_path_name(p) << ": " << c.name << " max_rel_err " << c.max_rel_err;
  }
  cpu::set_simd_path(saved);
}

// Prefill in chunks, several sequences in one batch: same logits as each sequence alone.
TEST_P(OracleFp8, BatchingDoesNotChangeAnswers) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  const int64_t V = model->cfg.vocab_size;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 99, 3, 250, 7, 8}, {42}, {300, 301, 302, 7}};
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<float>> alone;
  GenerateOptions o;
  o.keep_logits = true;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = 3;
    reqs.push_back(r);
    CpuEngine e(*model);
    alone.push_back(generate(e, std::span<const GenerateRequest>(&r, 1), o)[0].logits);
  }
  CpuEngine e(*model);
  o.prefill_chunk = 2;
  auto res = generate(e, reqs, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(res[i].logits.size(), size_t(3 * V));
    EXPECT_LT(max_rel_err(res[i].logits.data(), alone[i].data(), 3 * V), 1e-5) << "prompt " << i;
  }
}

// The planner's memory model counts an FP8 expert at its real size: weights plus scale grids (the
// `_scale_inv` tensors are classified with their weights); the fingerprint names the block size.
TEST_P(OracleFp8, PlacementCountsFp8ExpertsWithTheirScales) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  const ModelBytes mb = model_bytes(model->cfg, model->store);
  uint64_t routed = 0, shared = 0;
  for (const auto& L : model->layers) {
    for (const auto& e : L.experts) routed += e.present() ? e.nbytes() : 0;
    shared += L.shared.present() ? L.shared.nbytes() : 0;
  }
  EXPECT_EQ(mb.routed_experts, routed);
  EXPECT_EQ(mb.shared_experts, shared);
  const int64_t first_moe = model->cfg.layer_is_moe[0] ? 0 : 1;
  const ExpertWeights& e0 = model->layers[size_t(first_moe)].experts[0];
  EXPECT_EQ(mb.expert_bytes, e0.nbytes());
  // [160, 256] x2 + [256, 160] in FP8, each with a 2x2 grid of F32 scales.
  EXPECT_EQ(e0.nbytes(), 3u * 160u * 256u + 3u * 4u * 4u);
  EXPECT_EQ(mb.total() + mb.unused, model->store.total_bytes());
  EXPECT_NE(fingerprint_text(model->cfg, tensor_metas(model->store)).find("fp8_block=128x128"), std::string::npos);
  ModelConfig other = model->cfg;
  other.quant.block_rows = 64;
  EXPECT_NE(model_fingerprint(other, model->store), model_fingerprint(model->cfg, model->store));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OracleFp8, ::testing::Values("deepseekv3_fp8", "qwen3moe_fp8"));

TEST(OracleFp8Cli, VerifyPasses) {
  for (const char* name : {"deepseekv3_fp8", "qwen3moe_fp8"}) {
    const std::string dir = test::oracle_dir(name);
    auto r = test::run_tandem({"verify", "--model", dir, "--expected", dir + "/expected.safetensors", "--threads", "2"});
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_NE(r.out.find("verify: PASS"), std::string::npos) << name << ": " << r.out;
  }
}

TEST(OracleFp8Cli, InfoReportsBytesByDtype) {
  auto r = test::run_tandem({"info", "--model", test::oracle_dir("qwen3moe_fp8")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Every linear of attention and the experts is FP8; embeddings, lm_head, norms and router BF16.
  EXPECT_NE(r.out.find("bytes by dtype   BF16 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", F8_E4M3 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FP8 e4m3 weights with 128x128 block scales"), std::string::npos) << r.out;
}

// --weights fp8 on a float checkpoint: only the routed experts become FP8 (within half an e4m3 spacing
// of the stored weights), the fingerprint and the memory model see them at FP8 size.
TEST(OracleFp8, WeightsFp8AtLoadQuantizesTheRoutedExperts) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto plain = Model::load(dir);
  ModelConfig cfg = load_config(dir);
  apply_weights_option(cfg, "fp8");
  auto q = Model::bind(cfg, TensorStore::open_dir(dir), dir);
  EXPECT_FALSE(q->owned.empty());
  uint64_t routed = 0;
  for (size_t l = 0; l < q->layers.size(); ++l) {
    EXPECT_EQ(q->layers[l].attn.q.dtype, DType::kF32);
    EXPECT_EQ(q->layers[l].router.dtype, DType::kF32);
    for (size_t e = 0; e < q->layers[l].experts.size(); ++e) {
      const ExpertWeights& eq = q->layers[l].experts[e];
      const ExpertWeights& ep = plain->layers[l].experts[e];
      routed += eq.nbytes();
      for (auto [wq, wp] : {std::pair{&eq.gate, &ep.gate}, std::pair{&eq.up, &ep.up}, std::pair{&eq.down, &ep.down}}) {
        ASSERT_EQ(wq->dtype, DType::kF8E4M3);
        for (int64_t i = 0; i < wq->numel(); ++i) {
          const float x = load_f32(*wp, i), got = load_f32(*wq, i);
          const float s = wq->scale.at(i / wq->cols(), i % wq->cols());
          ASSERT_LE(std::fabs(got - x), std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * 1.0001f + 1e-12f);
        }
      }
    }
  }
  EXPECT_NE(model_fingerprint(q->cfg, q->store), model_fingerprint(plain->cfg, plain->store));
  const ModelBytes mb = model_bytes(q->cfg, q->store);
  EXPECT_EQ(mb.routed_experts, routed);
  EXPECT_EQ(mb.expert_bytes, q->layers[0].experts[0].nbytes());
  EXPECT_EQ(mb.primary_fixed(), model_bytes(plain->cfg, plain->store).primary_fixed());
  try {
    apply_weights_option(cfg, "int4");
    FAIL() << "int4 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--weights must be checkpoint or fp8"), std::string::npos);
  }
}

// A copy of an FP8 fixture with `edit` applied to each tensor's bytes (name, bytes) and `config` as its
// config.json: bad FP8 input must end every command at load with exit code 2 and a message.
void write_edited_copy(const std::string& from, const std::string& to, const nlohmann::json& config,
                       const std::function<void(const std::string&, uint8_t*, size_t)>& edit) {
  std::filesystem::create_directories(to);
  TensorStore store = TensorStore::open_dir(from);
  std::vector<TensorSpec> specs;
  for (const std::string& name : store.names()) {
    const TensorView v = *store.find(name);
    specs.push_back({name, v.dtype, v.shape, [v, name, &edit](uint8_t* dst, size_t n) {
                       std::memcpy(dst, v.data, n);
                       edit(name, dst, n);
                     }});
  }
  write_safetensors(to + "/model.safetensors", specs);
  test::write_file(to + "/config.json", config.dump(2));
}

TEST(OracleFp8Cli, BadFp8InputIsAClearErrorAtLoad) {
  const std::string dir = test::oracle_dir("qwen3moe_fp8");
  const nlohmann::json config = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  test::TempDir tmp;
  auto run = [&](const std::string& model) {
    return test::run_tandem({"generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", "2"});
  };
  const std::string scale = "model.layers.1.mlp.experts.5.up_proj.weight_scale_inv";
  write_edited_copy(dir, tmp.file("nan_scale"), config, [&](const std::string& name, uint8_t* p, size_t) {
    if (name == scale) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(p + 4, &nan, 4);
    }
  });
  auto r = run(tmp.file("nan_scale"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(scale + "' in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("scale [0, 1] is nan"), std::string::npos) << r.err;

  const std::string weight = "model.layers.0.self_attn.o_proj.weight";
  write_edited_copy(dir, tmp.file("nan_code"), config, [&](const std::string& name, uint8_t* p, size_t) {
    if (name == weight) p[3 * 256 + 9] = 0x7f;
  });
  r = run(tmp.file("nan_code"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("NaN code 0x7f at row 3, column 9"), std::string::npos) << r.err;

  nlohmann::json other = config;
  other["quantization_config"]["quant_method"] = "compressed-tensors";
  write_edited_copy(dir, tmp.file("method"), other, [](const std::string&, uint8_t*, size_t) {});
  r = run(tmp.file("method"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("'compressed-tensors' is not supported"), std::string::npos) << r.err;

  nlohmann::json none = config;
  none.erase("quantization_config");
  write_edited_copy(dir, tmp.file("no_quant"), none, [](const std::string&, uint8_t*, size_t) {});
  r = run(tmp.file("no_quant"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("has no FP8 quantization_config"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
