// Memory model and planner budgets against hand-computed cases: a small GQA model (the qwen3_moe
// oracle fixture's shapes) and a small MLA model (the deepseek_v3 fixture's shapes). The arithmetic
// is written out next to each expectation; the tensor-name count is checked against the config count.
#include <gtest/gtest.h>

#include "core/error.h"
#include "placement/memory_model.h"
#include "placement/planner.h"

namespace tandem {
namespace {

// qwen3_moe fixture: hidden 64, 3 layers (all MoE), 4 q heads / 2 kv heads of 16, vocab 512,
// 16 experts of 32 (top-4), q/k RMSNorm per head, untied head.
ModelConfig gqa_config() {
  ModelConfig c;
  c.arch = Arch::kQwen3Moe;
  c.model_type = "qwen3_moe";
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.qk_norm = QkNorm::kPerHead;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.n_expert = 16;
  c.n_expert_used = 4;
  c.layer_is_moe = {true, true, true};
  return c;
}

// deepseek_v3 fixture: hidden 64, 3 layers (layer 0 dense, 96 wide), 4 heads, q_lora 48, kv_lora 32,
// nope 16 / rope 8 / v 16, 16 routed experts of 32 (top-4) + 1 shared, sigmoid router with bias.
ModelConfig mla_config() {
  ModelConfig c;
  c.arch = Arch::kDeepseekV3;
  c.model_type = "deepseek_v3";
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_head_kv = 4;
  c.head_dim = 8;
  c.mla = true;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.n_expert = 16;
  c.n_expert_used = 4;
  c.n_shared_expert = 1;
  c.router = RouterKind::kSigmoidGroupTopK;
  c.n_group = 4;
  c.topk_group = 2;
  c.layer_is_moe = {false, true, true};
  return c;
}

// The hub tensor names of mla_config, as in the fixture checkpoint (+ an MTP layer 3 to be ignored).
std::vector<TensorMeta> mla_tensors() {
  std::vector<TensorMeta> t{{"model.embed_tokens.weight", DType::kF32, {512, 64}},
                            {"lm_head.weight", DType::kF32, {512, 64}},
                            {"model.norm.weight", DType::kF32, {64}}};
  auto add = [&](std::string name, Shape s) { t.push_back({std::move(name), DType::kF32, s}); };
  for (int l = 0; l < 4; ++l) {  // layer 3 = MTP, unused
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {64});
    add(p + "post_attention_layernorm.weight", {64});
    add(p + "self_attn.q_a_proj.weight", {48, 64});
    add(p + "self_attn.q_a_layernorm.weight", {48});
    add(p + "self_attn.q_b_proj.weight", {96, 48});
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {40, 64});
    add(p + "self_attn.kv_a_layernorm.weight", {32});
    add(p + "self_attn.kv_b_proj.weight", {128, 32});
    add(p + "self_attn.o_proj.weight", {64, 64});
    if (l == 0) {
      for (const char* proj : {"gate_proj", "up_proj"}) add(p + "mlp." + proj + ".weight", {96, 64});
      add(p + "mlp.down_proj.weight", {64, 96});
      continue;
    }
    add(p + "mlp.gate.weight", {16, 64});
    add(p + "mlp.gate.e_score_correction_bias", {16});
    for (const char* proj : {"gate_proj", "up_proj"}) add(p + "mlp.shared_experts." + proj + ".weight", {32, 64});
    add(p + "mlp.shared_experts.down_proj.weight", {64, 32});
    for (int e = 0; e < 16; ++e) {
      std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      add(q + "gate_proj.weight", {32, 64});
      add(q + "up_proj.weight", {32, 64});
      add(q + "down_proj.weight", {64, 32});
    }
  }
  return t;
}

// Stats with some traffic so plan() has tokens; the budget arithmetic does not depend on it.
ExpertStats some_stats(const ModelConfig& cfg) {
  ExpertStats st = ExpertStats::for_model(cfg, "fp1:test", ProfileMode::kTeacher);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t j = 0; j < cfg.n_expert_used; ++j) ids.push_back(int32_t((r * 3 + j) % cfg.n_expert));
  std::vector<float> w(ids.size(), 0.25f);
  for (int64_t layer : moe_layer_indices(cfg)) st.record(layer, ids.data(), w.data(), 10, cfg.n_expert_used, "prose");
  st.add_tokens("prose", 10);
  return st;
}

TEST(PlacementMemory, ParseSize) {
  EXPECT_EQ(parse_size("80GiB"), 80ull << 30);
  EXPECT_EQ(parse_size("12.5GB"), 12'500'000'000ull);
  EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("1.5 tib"), 3ull << 39);
  EXPECT_EQ(parse_size("100kb"), 100'000u);
  EXPECT_EQ(parse_size("7B"), 7u);
  for (const char* bad : {"", "GiB", "12..5GB", "-1GiB", "80 GiBs", "1e3", "80G", "99999999999TiB"})
    EXPECT_THROW(parse_size(bad, "--primary-memory"), InputError) << bad;
  try {
    parse_size("80G", "--primary-memory");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--primary-memory"), std::string::npos) << e.what();
  }
}

TEST(PlacementMemory, FormatBytes) {
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(80ull << 30), "80.00 GiB");
}

TEST(PlacementMemory, GqaModelBytes) {
  ModelBytes m = model_bytes(gqa_config(), DType::kF32);
  EXPECT_EQ(m.embeddings, 512u * 64 * 4);   // 131072
  EXPECT_EQ(m.output_head, 512u * 64 * 4);  // untied
  // per layer q 64·64 + k 64·32 + v 64·32 + o 64·64 = 12288 elements; 3 layers; 4 B
  EXPECT_EQ(m.attention, 12288u * 3 * 4);  // 147456
  // per layer 2·64 (layer norms) + 2·16 (q/k norm per head) = 160; 3 layers + final 64 = 544; 4 B
  EXPECT_EQ(m.norms, 544u * 4);
  EXPECT_EQ(m.dense_mlp, 0u);
  EXPECT_EQ(m.routers, 3u * 16 * 64 * 4);  // 12288
  EXPECT_EQ(m.shared_experts, 0u);
  EXPECT_EQ(m.expert_bytes, 3u * 64 * 32 * 4);  // 24576
  EXPECT_EQ(m.routed_experts, 48u * 24576);     // 3 layers × 16 experts
  // The fixture checkpoint holds exactly 424064 bytes besides its 1179648 bytes of routed experts.
  EXPECT_EQ(m.primary_fixed(), 424064u);
  EXPECT_EQ(m.total(), 1603712u);
  // KV: 3 layers × 2·2 kv heads·16 = 192 elements; bf16 2 B -> 384 B per token.
  EXPECT_EQ(kv_elements_per_token_layer(gqa_config()), 64);
  EXPECT_EQ(kv_bytes_per_token(gqa_config(), DType::kBF16), 384u);
}

TEST(PlacementMemory, MlaModelBytes) {
  ModelBytes m = model_bytes(mla_config(), DType::kF32);
  EXPECT_EQ(m.embeddings, 131072u);
  EXPECT_EQ(m.output_head, 131072u);
  // per layer q_a 48·64 (3072) + q_b 4·24·48 (4608) + kv_a 40·64 (2560) + kv_b 4·32·32 (4096)
  // + o 64·64 (4096) = 18432 elements; 3 layers; 4 B
  EXPECT_EQ(m.attention, 18432u * 3 * 4);  // 221184
  // per layer 2·64 + q_a norm 48 + kv_a norm 32 = 208; 3 layers + final 64 = 688; 4 B
  EXPECT_EQ(m.norms, 688u * 4);
  EXPECT_EQ(m.dense_mlp, 3u * 64 * 96 * 4);  // layer 0: 73728
  EXPECT_EQ(m.routers, 2u * (16 * 64 + 16) * 4);  // weight + correction bias, 2 MoE layers: 8320
  EXPECT_EQ(m.shared_experts, 2u * 3 * 64 * 32 * 4);  // 49152
  EXPECT_EQ(m.expert_bytes, 24576u);
  EXPECT_EQ(m.routed_experts, 32u * 24576);  // 786432
  EXPECT_EQ(m.primary_fixed(), 617280u);     // = the fixture checkpoint's non-routed bytes
  // KV: 3 layers × (kv_lora 32 + rope 8) = 120 elements; bf16 -> 240 B per token (n_head_kv plays no part).
  EXPECT_EQ(kv_elements_per_token_layer(mla_config()), 40);
  EXPECT_EQ(kv_bytes_per_token(mla_config(), DType::kBF16), 240u);
  EXPECT_EQ(kv_bytes_per_token(mla_config(), DType::kF32), 480u);
}

TEST(PlacementMemory, TensorCountMatchesConfigCount) {
  ModelBytes c = model_bytes(mla_config(), DType::kF32);
  ModelBytes t = model_bytes(mla_config(), mla_tensors());
  EXPECT_EQ(t.embeddings, c.embeddings);
  EXPECT_EQ(t.output_head, c.output_head);
  EXPECT_EQ(t.attention, c.attention);
  EXPECT_EQ(t.norms, c.norms);
  EXPECT_EQ(t.dense_mlp, c.dense_mlp);
  EXPECT_EQ(t.routers, c.routers);
  EXPECT_EQ(t.shared_experts, c.shared_experts);
  EXPECT_EQ(t.routed_experts, c.routed_experts);
  EXPECT_EQ(t.expert_bytes, c.expert_bytes);
  EXPECT_EQ(t.other, 0u);
  // layer 3 (MTP): the same per-layer bytes as a MoE layer, never loaded
  EXPECT_EQ(t.unused, (18432u + 208 + 16 * 64 + 16 + 3 * 64 * 32 * 17) * 4);
}

TEST(PlacementMemory, TiedHeadCountedOnce) {
  ModelConfig cfg = gqa_config();
  cfg.tie_word_embeddings = true;
  ModelBytes m = model_bytes(cfg, DType::kBF16);
  EXPECT_EQ(m.embeddings, 512u * 64 * 2);
  EXPECT_EQ(m.output_head, 0u);
}

TEST(PlacementMemory, GqaKvAndHotArithmetic) {
  // primary 2 MiB, reserve 256 KiB: free = 2097152 − 424064 − 262144 = 1410944 B
  MemoryModel mm{model_bytes(gqa_config(), DType::kF32), 2u << 20, 256u << 10,
                 kv_bytes_per_token(gqa_config(), DType::kBF16)};
  EXPECT_EQ(mm.free_bytes(), 1410944);
  EXPECT_EQ(mm.kv_tokens(0), 3674);    // 1410944 / 384 = 3674.3
  EXPECT_EQ(mm.kv_tokens(48), 602);    // (1410944 − 48·24576) / 384 = 231296 / 384 = 602.3
  EXPECT_EQ(mm.max_hot(1000), 41);     // (1410944 − 384000) / 24576 = 41.8
  EXPECT_EQ(mm.max_hot(0), 48);        // 57.4, clamped to all 48 experts
  EXPECT_EQ(mm.max_hot(3674), 0);      // 128 B left
  EXPECT_EQ(mm.max_hot(3675), -1);     // KV alone does not fit
  mm.primary_bytes = 600000;           // < fixed + reserve
  EXPECT_LT(mm.free_bytes(), 0);
  EXPECT_EQ(mm.kv_tokens(0), -1);
}

TEST(PlacementMemory, GqaPlanSolvesForKvTokens) {
  ModelConfig cfg = gqa_config();
  MemoryModel mm{model_bytes(cfg, DType::kF32), 2u << 20, 256u << 10, kv_bytes_per_token(cfg, DType::kBF16)};
  ExpertStats st = some_stats(cfg);
  PlanBudget b{PlanBudget::Kind::kPrimaryMemory, 0, 1000, "--primary-memory 2MiB --kv-tokens 1000"};
  // uniform: 41 fit -> 41 / 3 layers = 13 per layer = 39 hot; KV (1410944 − 39·24576) / 384 = 1178.3
  PlanResult u = plan(st, PlanPolicy::kUniform, b, mm.bytes.expert_bytes, &mm);
  ASSERT_TRUE(u.rowmap);
  EXPECT_EQ(u.rowmap->n_hot(), 39);
  for (const RowmapLayer& l : u.rowmap->layers) EXPECT_EQ(l.hot.size(), 13u);
  EXPECT_EQ(u.rowmap->source.kv_tokens, 1178);
  // global: all 41; KV (1410944 − 41·24576) / 384 = 1050.3
  PlanResult g = plan(st, PlanPolicy::kGlobal, b, mm.bytes.expert_bytes, &mm);
  ASSERT_TRUE(g.rowmap);
  EXPECT_EQ(g.rowmap->n_hot(), 41);
  EXPECT_EQ(g.rowmap->source.kv_tokens, 1050);
  EXPECT_GE(g.rowmap->source.kv_tokens, 1000);
  // 3675 tokens of KV do not fit next to the fixed part even with no hot expert.
  b.kv_tokens = 3675;
  EXPECT_THROW(plan(st, PlanPolicy::kUniform, b, mm.bytes.expert_bytes, &mm), InputError);
  // Without --kv-tokens: the table only, every hot count per layer 0..16, KV from the memory model.
  b.kv_tokens.reset();
  PlanResult t = plan(st, PlanPolicy::kUniform, b, mm.bytes.expert_bytes, &mm);
  EXPECT_FALSE(t.rowmap);
  ASSERT_EQ(t.table.size(), 17u);
  EXPECT_EQ(t.table[0].kv_tokens, 3674);
  EXPECT_EQ(t.table[16].kv_tokens, 602);
  EXPECT_EQ(t.table[16].traffic.cold_share, 0.0);
  EXPECT_EQ(t.table[0].traffic.cold_share, 1.0);
  // every row routed to a cold expert: 4 rows per token and layer × 3 layers × 24576 B
  EXPECT_DOUBLE_EQ(t.table[0].traffic.cold_rows_per_token, 12.0);
  EXPECT_DOUBLE_EQ(t.table[0].traffic.host_bytes_per_token, 12.0 * 24576);
}

TEST(PlacementMemory, MlaPlanSolvesForKvTokens) {
  ModelConfig cfg = mla_config();
  // primary 2 MiB, no reserve: free = 2097152 − 617280 = 1479872 B; KV 240 B per token
  MemoryModel mm{model_bytes(cfg, DType::kF32), 2u << 20, 0, kv_bytes_per_token(cfg, DType::kBF16)};
  EXPECT_EQ(mm.free_bytes(), 1479872);
  EXPECT_EQ(mm.kv_tokens(32), 2889);  // (1479872 − 786432) / 240 = 2889.3
  ExpertStats st = some_stats(cfg);
  PlanBudget b{PlanBudget::Kind::kPrimaryMemory, 0, 4000, "--primary-memory 2MiB --kv-tokens 4000"};
  // (1479872 − 4000·240) / 24576 = 21.2 -> 21 hot
  // uniform: 21 / 2 layers = 10 per layer = 20 hot; KV (1479872 − 20·24576) / 240 = 4118.1
  PlanResult u = plan(st, PlanPolicy::kUniform, b, mm.bytes.expert_bytes, &mm);
  ASSERT_TRUE(u.rowmap);
  EXPECT_EQ(u.rowmap->n_hot(), 20);
  EXPECT_EQ(u.rowmap->source.kv_tokens, 4118);
  ASSERT_EQ(u.rowmap->layers.size(), 2u);
  EXPECT_EQ(u.rowmap->layers[0].layer, 1);
  // global: 21 hot; KV (1479872 − 21·24576) / 240 = 4015.7
  PlanResult g = plan(st, PlanPolicy::kGlobal, b, mm.bytes.expert_bytes, &mm);
  ASSERT_TRUE(g.rowmap);
  EXPECT_EQ(g.rowmap->n_hot(), 21);
  EXPECT_EQ(g.rowmap->source.kv_tokens, 4015);
}

TEST(PlacementMemory, PerLayerBudgetsOutOfRange) {
  ModelConfig cfg = gqa_config();
  ExpertStats st = some_stats(cfg);
  PlanBudget hot{PlanBudget::Kind::kHotPerLayer, 17, std::nullopt, "--hot-per-layer 17"};
  EXPECT_THROW(plan(st, PlanPolicy::kUniform, hot, 1, nullptr), InputError);
  PlanBudget cold{PlanBudget::Kind::kColdPerLayer, 4, std::nullopt, "--cold-per-layer 4"};
  PlanResult r = plan(st, PlanPolicy::kUniform, cold, 1, nullptr);
  ASSERT_TRUE(r.rowmap);
  for (const RowmapLayer& l : r.rowmap->layers) {
    EXPECT_EQ(l.hot.size(), 12u);
    EXPECT_EQ(l.cold.size(), 4u);
  }
  for (const TradeoffRow& row : r.table) EXPECT_EQ(row.kv_tokens, -1);  // no memory budget: no KV column
}

}  // namespace
}  // namespace tandem
