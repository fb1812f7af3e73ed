// Model fingerprint: FNV-1a test vectors, a golden value computed independently from the recipe in
// docs/placement.md (so the hash stays stable across builds and machines), independence from tensor
// order, and sensitivity to every input that changes what a rowmap means.
#include <gtest/gtest.h>

#include "placement/fingerprint.h"

namespace tandem {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.model_type = "mixtral";
  c.arch = Arch::kMixtral;
  c.vocab_size = 32;
  c.hidden_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.moe_intermediate_size = 16;
  c.n_expert = 4;
  c.n_expert_used = 2;
  c.layer_is_moe = {true, true};
  return c;
}

std::vector<TensorMeta> tiny_tensors() {
  return {{"model.embed_tokens.weight", DType::kBF16, {32, 8}},
          {"model.layers.0.block_sparse_moe.gate.weight", DType::kBF16, {4, 8}},
          {"lm_head.weight", DType::kBF16, {32, 8}},
          {"model.norm.weight", DType::kF32, {8}}};
}

std::string fnv(std::string_view s) {
  Fnv1a64 h;
  h.add(s);
  return h.fingerprint();
}

TEST(PlacementFingerprint, Fnv1aVectors) {
  EXPECT_EQ(fnv(""), "fp1:cbf29ce484222325");
  EXPECT_EQ(fnv("a"), "fp1:af63dc4c8601ec8c");
  EXPECT_EQ(fnv("foobar"), "fp1:85944171f73967e8");
}

TEST(PlacementFingerprint, CanonicalTextAndGoldenValue) {
  std::string text = fingerprint_text(tiny_config(), tiny_tensors());
  EXPECT_EQ(text,
            "model_type=mixtral\nhidden_size=8\nn_layer=2\nn_head=2\nn_head_kv=1\nhead_dim=4\nvocab_size=32\n"
            "intermediate_size=16\nmoe_intermediate_size=16\nn_expert=4\nn_expert_used=2\nn_shared_expert=0\n"
            "mla=0\nq_lora_rank=0\nkv_lora_rank=0\nqk_nope_head_dim=0\nqk_rope_head_dim=0\nv_head_dim=0\n"
            "layer_is_moe=11\nrouter=softmax_topk\n"
            "tensor=lm_head.weight BF16 [32,8]\n"
            "tensor=model.embed_tokens.weight BF16 [32,8]\n"
            "tensor=model.layers.0.block_sparse_moe.gate.weight BF16 [4,8]\n"
            "tensor=model.norm.weight F32 [8]\n");
  // FNV-1a 64 of that text, computed with Python from the recipe in docs/placement.md.
  EXPECT_EQ(model_fingerprint(tiny_config(), tiny_tensors()), "fp1:705b93f9e4eecac1");
}

TEST(PlacementFingerprint, TensorOrderDoesNotMatter) {
  auto t = tiny_tensors();
  std::reverse(t.begin(), t.end());
  EXPECT_EQ(model_fingerprint(tiny_config(), t), model_fingerprint(tiny_config(), tiny_tensors()));
}

TEST(PlacementFingerprint, ChangesWithEveryRelevantInput) {
  const std::string base = model_fingerprint(tiny_config(), tiny_tensors());
  std::vector<std::function<void(ModelConfig&, std::vector<TensorMeta>&)>> edits{
      [](auto& c, auto&) { c.n_expert = 5; },
      [](auto& c, auto&) { c.n_expert_used = 3; },
      [](auto& c, auto&) { c.layer_is_moe = {false, true}; },
      [](auto& c, auto&) { c.router = RouterKind::kSigmoidGroupTopK; },
      [](auto& c, auto&) { c.model_type = "olmoe"; },
      [](auto& c, auto&) { c.kv_lora_rank = 16; },
      [](auto&, auto& t) { t[0].dtype = DType::kF16; },
      [](auto&, auto& t) { t[0].shape = Shape{8, 32}; },
      [](auto&, auto& t) { t[1].name = "model.layers.1.block_sparse_moe.gate.weight"; },
      [](auto&, auto& t) { t.pop_back(); },
  };
  std::set<std::string> seen{base};
  for (size_t i = 0; i < edits.size(); ++i) {
    ModelConfig c = tiny_config();
    auto t = tiny_tensors();
    edits[i](c, t);
    std::string fp = model_fingerprint(c, t);
    EXPECT_TRUE(seen.insert(fp).second) << "edit " << i << " gave a fingerprint seen before: " << fp;
  }
}

}  // namespace
}  // namespace tandem
