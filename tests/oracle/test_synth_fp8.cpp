// `tandem synth --weights fp8`: a synthetic model in DeepSeek's FP8 format is the block quantization of
// the BF16 model of the same seed (same bf16 values, each within half an e4m3 spacing), keeps lm_head,
// router, embeddings and norms in bf16, loads through the ordinary path and generates; the
// flash-mini-fp8 preset is flash-mini plus the quantization_config.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generate.h"
#include "io/fp8_weights.h"
#include "models/model.h"
#include "models/synth.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(SynthFp8, IsTheBlockQuantizationOfTheBf16ModelOfTheSameSeed) {
  test::TempDir tmp;
  auto fp8 = test::run_tandem({"synth", "--preset", "tiny", "--weights", "fp8", "--seed", "4", "--out", tmp.file("fp8"),
                               "--threads", "2"});
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  auto bf16 = test::run_tandem({"synth", "--preset", "tiny", "--seed", "4", "--out", tmp.file("bf16"), "--threads", "2"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  auto q = Model::load(tmp.file("fp8"));
  auto b = Model::load(tmp.file("bf16"));
  EXPECT_TRUE(q->cfg.quant.fp8);
  EXPECT_EQ(q->cfg.quant.block_rows, 128);
  EXPECT_EQ(q->lm_head.dtype, DType::kBF16);
  EXPECT_EQ(q->embed.dtype, DType::kBF16);
  int64_t checked = 0;
  for (size_t l = 0; l < q->layers.size(); ++l) {
    const auto& Lq = q->layers[l];
    const auto& Lb = b->layers[l];
    if (Lq.moe) EXPECT_EQ(Lq.router.dtype, DType::kBF16);
    std::vector<std::pair<const TensorView*, const TensorView*>> pairs = {
        {&Lq.attn.q_a, &Lb.attn.q_a}, {&Lq.attn.kv_b, &Lb.attn.kv_b}, {&Lq.attn.o, &Lb.attn.o}};
    if (Lq.moe) {
      pairs.push_back({&Lq.experts[3].down, &Lb.experts[3].down});
      pairs.push_back({&Lq.shared.gate, &Lb.shared.gate});
    } else {
      pairs.push_back({&Lq.dense.up, &Lb.dense.up});
    }
    for (auto [wq, wb] : pairs) {
      ASSERT_EQ(wq->dtype, DType::kF8E4M3);
      ASSERT_EQ(wb->dtype, DType::kBF16);
      ASSERT_EQ(wq->shape, wb->shape);
      for (int64_t i = 0; i < wq->numel(); ++i) {
        const float x = load_f32(*wb, i), got = load_f32(*wq, i);
        const float s = wq->scale.at(i / wq->cols(), i % wq->cols());
        ASSERT_LE(std::fabs(got - x), std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * 1.0001f + 1e-12f);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
  // It runs: greedy decoding on the CPU.
  CpuEngine engine(*q);
  GenerateRequest r;
  r.prompt = {5, 17, 99, 3};
  r.max_tokens = 4;
  auto res = generate(engine, std::span<const GenerateRequest>(&r, 1), GenerateOptions{});
  EXPECT_EQ(res[0].tokens.size(), 4u);
}

TEST(SynthFp8, FlashMiniFp8PresetAndBadWeightsFlag) {
  nlohmann::json f = synth_preset_config("flash-mini-fp8");
  EXPECT_EQ(f["quantization_config"]["quant_method"], "fp8");
  nlohmann::json plain = synth_preset_config("flash-mini");
  f.erase("quantization_config");
  EXPECT_EQ(f, plain);
  test::TempDir tmp;
  auto bad = test::run_tandem({"synth", "--preset", "tiny", "--weights", "int4", "--out", tmp.file("m")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--weights must be bf16 or fp8"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tandem
