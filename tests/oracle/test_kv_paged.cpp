// The CPU engine's paged KV cache on real model shapes (GQA and MLA): the oracle fixtures through
// small blocks and a fixed pool at the f32 tolerance, bitwise equal to one block per sequence; bf16
// storage within a tolerance derived from bf16's precision and against transformers at the fixtures'
// bf16 tolerance; sequences whose blocks interleave in the pool answer as they do alone; a full pool
// refuses a step with nothing appended.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generate.h"
#include "engine/verify.h"
#include "placement/memory_model.h"
#include "test_util.h"

namespace tandem {
namespace {

class PagedKv : public ::testing::TestWithParam<std::string> {};

EngineOptions paged(int64_t block, int64_t tokens, DType dtype = DType::kF32) {
  EngineOptions o;
  o.kv_block = block;
  o.kv_tokens = tokens;
  o.kv_dtype = dtype;
  return o;
}

// One block holds a whole sequence: the contiguous cache the paged one replaced.
EngineOptions unpaged() { return paged(1 << 16, 0); }

std::vector<GenerateRequest> requests(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens) {
  std::vector<GenerateRequest> r(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    r[i].prompt = prompts[i];
    r[i].max_tokens = max_tokens;
  }
  return r;
}

const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 99, 3, 250, 7, 8, 41, 42, 43, 6}, {42, 9}, {300, 301, 302, 7, 1}};

TEST_P(PagedKv, MatchesTransformersThroughSmallBlocksOfAFixedPool) {
  const std::string dir = test::oracle_dir(GetParam());
  auto model = Model::load(dir);
  // The fixtures hold 2 prompts of 11 tokens and 6 greedy tokens: 16 cached tokens each, 4 blocks of 4.
  // A pool of exactly 8 blocks: any block leaked or over-reserved would end in KvCacheFull.
  CpuEngine engine(*model, paged(4, 32));
  auto checks = verify_against(engine, dir + "/expected.safetensors");
  ASSERT_GE(checks.size(), 4u);
  for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << " max_rel_err " << c.max_rel_err;
  const KvUsage u = engine.kv_usage();
  EXPECT_EQ(u.block_tokens, 4);
  EXPECT_EQ(u.blocks_total, 8);
  EXPECT_EQ(u.blocks_used, 0);  // every sequence gave its blocks back
}

// Paging changes where rows live, not the arithmetic: every logit is bitwise that of the unpaged cache.
TEST_P(PagedKv, F32PagedIsBitwiseTheUnpagedCache) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  GenerateOptions o;
  o.keep_logits = true;
  o.prefill_chunk = 3;
  const auto reqs = requests(kPrompts, 5);
  CpuEngine whole(*model, unpaged());
  const auto want = generate(whole, reqs, o);
  for (int64_t block : {1, 2, 4, 5}) {
    CpuEngine e(*model, paged(block, 64));
    const auto got = generate(e, reqs, o);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "block " << block << " prompt " << i;
      EXPECT_EQ(got[i].logits, want[i].logits) << "block " << block << " prompt " << i;
    }
    EXPECT_EQ(e.kv_usage().blocks_used, 0);
  }
}

// Feeds each prompt one token per step, all sequences in the same step, so that their blocks
// interleave in the pool. Returns each sequence's logits [len, V].
std::vector<std::vector<float>> feed_interleaved(CpuEngine& e, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t V = e.vocab_size();
  std::vector<int> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(e.add_sequence());
  std::vector<std::vector<float>> out(prompts.size());
  for (size_t t = 0;; ++t) {
    std::vector<Engine::Item> items;
    std::vector<size_t> owner;
    for (size_t i = 0; i < prompts.size(); ++i)
      if (t < prompts[i].size()) {
        items.push_back({seqs[i], std::span<const int32_t>(&prompts[i][t], 1)});
        owner.push_back(i);
      }
    if (items.empty()) break;
    const auto& logits = e.forward(items);
    for (size_t j = 0; j < owner.size(); ++j)
      out[owner[j]].insert(out[owner[j]].end(), logits.begin() + int64_t(j) * V, logits.begin() + int64_t(j + 1) * V);
  }
  for (int s : seqs) e.remove_sequence(s);
  return out;
}

TEST_P(PagedKv, InterleavedBlocksGiveTheLogitsOfEachSequenceAlone) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  const int64_t V = model->cfg.vocab_size;
  std::vector<std::vector<float>> alone;
  for (const auto& p : kPrompts) {
    CpuEngine e(*model, paged(2, 64));
    alone.push_back(feed_interleaved(e, {p}).at(0));
  }
  CpuEngine e(*model, paged(2, 64));
  // Warm the pool first so that the blocks are handed out in a scrambled order.
  {
    const int a = e.add_sequence(), b = e.add_sequence();
    const std::vector<int32_t> ta(9, 3), tb(7, 4);
    e.forward(std::vector<Engine::Item>{{a, ta}, {b, tb}});
    e.remove_sequence(b);
    e.remove_sequence(a);
  }
  const auto together = feed_interleaved(e, kPrompts);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_EQ(together[i].size(), kPrompts[i].size() * size_t(V));
    // Same f32 arithmetic in another row grouping: rounding-level differences only (as the oracle's
    // BatchingDoesNotChangeAnswers).
    EXPECT_LT(max_rel_err(together[i].data(), alone[i].data(), int64_t(together[i].size())), 1e-5) << "prompt " << i;
  }
  EXPECT_EQ(e.kv_usage().blocks_used, 0);
}

// The same interleaved run, checked to really interleave: the block tables of two sequences that grew
// in lockstep alternate in the pool.
TEST(PagedKvLayout, LockstepSequencesInterleaveTheirBlocks) {
  auto model = Model::load(test::oracle_dir("qwen3moe_f32"));
  CpuEngine e(*model, paged(2, 64));
  const int a = e.add_sequence(), b = e.add_sequence();
  const int32_t tok = 5;
  for (int t = 0; t < 8; ++t) e.forward(std::vector<Engine::Item>{{a, {&tok, 1}}, {b, {&tok, 1}}});
  const auto& ta = e.kv_cache().table(a);
  const auto& tb = e.kv_cache().table(b);
  ASSERT_EQ(ta.size(), 4u);
  ASSERT_EQ(tb.size(), 4u);
  EXPECT_EQ(ta, (std::vector<int32_t>{0, 2, 4, 6}));
  EXPECT_EQ(tb, (std::vector<int32_t>{1, 3, 5, 7}));
  EXPECT_EQ(e.kv_usage().blocks_used, 8);
  e.remove_sequence(a);
  EXPECT_EQ(e.kv_usage().blocks_used, 4);
  e.remove_sequence(b);
  EXPECT_EQ(e.kv_usage().blocks_used, 0);
}

// A step that needs more blocks than the pool has free: KvCacheFull naming the numbers, nothing
// appended to any sequence of the batch, no block taken; the engine then answers as a fresh one.
TEST_P(PagedKv, FullPoolRefusesTheStepAndAppendsNothing) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  const int64_t V = model->cfg.vocab_size;
  CpuEngine e(*model, paged(4, 32));  // 8 blocks
  const std::vector<int32_t> pa = {5, 17, 99, 3, 250, 7, 8, 41, 42, 43, 6, 9, 12, 13, 14, 15, 16, 18, 19, 20};  // 20: 5 blocks
  const std::vector<int32_t> pb = {300, 301, 302, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};                 // 16: 4 blocks
  const int a = e.add_sequence(), b = e.add_sequence();
  e.forward(std::vector<Engine::Item>{{a, pa}});
  EXPECT_EQ(e.kv_usage().blocks_used, 5);
  try {
    e.forward(std::vector<Engine::Item>{{b, pb}});
    FAIL() << "a step needing 4 blocks with 3 free ran";
  } catch (const KvCacheFull& err) {
    EXPECT_EQ(err.blocks_needed, 4);
    EXPECT_EQ(err.blocks_free, 3);
    const std::string msg = err.what();
    EXPECT_NE(msg.find("needs 4 more blocks of 4 tokens, 3 of the pool's 8 are free"), std::string::npos) << msg;
  }
  // A batch where one item fits alone but not both: nothing appended to either (a is at a block boundary).
  const int32_t next = 21;
  const std::vector<int32_t> pb_head(pb.begin(), pb.begin() + 12);
  EXPECT_THROW(e.forward(std::vector<Engine::Item>{{a, {&next, 1}}, {b, pb_head}}), KvCacheFull);
  EXPECT_THROW(e.forward(std::vector<Engine::Item>{{b, pb}}), InputError);  // a kind of InputError
  EXPECT_EQ(e.seq_len(a), 20);
  EXPECT_EQ(e.seq_len(b), 0);
  EXPECT_EQ(e.kv_usage().blocks_used, 5);
  EXPECT_TRUE(e.kv_cache().table(b).empty());
  // The engine goes on: a's next token, then b once a has given its blocks back.
  const std::vector<float> got_a(e.forward(std::vector<Engine::Item>{{a, {&next, 1}}}));
  e.remove_sequence(a);
  EXPECT_EQ(e.kv_usage().blocks_used, 0);
  const std::vector<float> got_b(e.forward(std::vector<Engine::Item>{{b, pb}}));
  EXPECT_EQ(e.kv_usage().blocks_used, 4);
  e.remove_sequence(b);

  CpuEngine fresh(*model, unpaged());
  const int fa = fresh.add_sequence();
  fresh.forward(std::vector<Engine::Item>{{fa, pa}});
  const std::vector<float> want_a(fresh.forward(std::vector<Engine::Item>{{fa, {&next, 1}}}));
  fresh.remove_sequence(fa);
  const int fb = fresh.add_sequence();
  const std::vector<float> want_b(fresh.forward(std::vector<Engine::Item>{{fb, pb}}));
  ASSERT_EQ(got_a.size(), size_t(V));
  EXPECT_EQ(got_a, want_a);  // b's refused rows left no trace in a (blocks reused after a, too)
  EXPECT_EQ(got_b, want_b);
  // A single request larger than the whole pool is refused the same way.
  const int c = e.add_sequence();
  const std::vector<int32_t> huge(33, 5);
  EXPECT_THROW(e.forward(std::vector<Engine::Item>{{c, huge}}), KvCacheFull);
  EXPECT_EQ(e.seq_len(c), 0);
  EXPECT_EQ(e.kv_usage().blocks_used, 0);
}

// bf16 storage. Each cached value is rounded to 8 significant bits: relative error at most
// u = 2^-9 (round to nearest). A layer reads each cached row twice: K through the scores, whose
// perturbation moves the softmax weights by at most |Δs| relative, and V linearly; so to first order
// its attention output moves by ≲ (|Δs| + u)·|o| with |Δs| ≲ u·Σ|q_i k_i|·scale. With the fixtures'
// scores of order 1 (random small weights) that is ≈ 2u per layer, and the residual stream adds the
// layers' errors: the logits move by ≲ 2·n_layer·u relative to their largest magnitude. The checked
// tolerance is that with a factor 2 for the RMS norms' rescaling and the higher-order terms; the
// measured errors sit well below it (printed), and a bf16 path that stored f32 (zero error) fails.
double bf16_kv_tolerance(int64_t n_layer) { return 2.0 * 2.0 * double(n_layer) * std::ldexp(1.0, -9); }

TEST_P(PagedKv, Bf16LogitsWithinBf16PrecisionOfF32) {
  auto model = Model::load(test::oracle_dir(GetParam()));
  GenerateOptions o;
  o.keep_logits = true;
  const auto reqs = requests(kPrompts, 4);
  CpuEngine f32(*model, paged(4, 64));
  CpuEngine bf16(*model, paged(4, 64, DType::kBF16));
  // Teacher-forced: bf16 decodes f32's tokens, so the logits compare step by step.
  const auto want = generate(f32, reqs, o);
  auto forced = reqs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    forced[i].prompt.insert(forced[i].prompt.end(), want[i].tokens.begin(), want[i].tokens.end() - 1);
    forced[i].max_tokens = 1;
  }
  const double tol = bf16_kv_tolerance(model->cfg.n_layer);
  for (size_t i = 0; i < reqs.size(); ++i) {
    // All-position logits of prompt + f32's continuation, through each cache.
    std::vector<std::vector<float>> all;
    for (CpuEngine* e : {&f32, &bf16}) {
      const int s = e->add_sequence();
      all.emplace_back(e->forward(std::vector<Engine::Item>{{s, forced[i].prompt}}, /*all_logits=*/true));
      e->remove_sequence(s);
    }
    const double err = max_rel_err(all[1].data(), all[0].data(), int64_t(all[0].size()));
    std::printf("[bf16 kv] %s prompt %zu: max_rel_err %.3g (tolerance %.3g)\n", GetParam().c_str(), i, err, tol);
    EXPECT_LT(err, tol) << "prompt " << i;
    EXPECT_GT(err, 0.0) << "bf16 storage changed nothing: is it stored in f32?";
  }
  EXPECT_EQ(bf16.kv_usage().blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PagedKv, ::testing::Values("qwen3moe_f32", "deepseekv3_f32", "olmoe_f32", "mixtral_bf16"));

// bf16 KV against transformers' f32 run, at the fixture README's tolerance for a backend that computes
// in bf16 (2e-2 on logits, gen_logits and moe_out; greedy tokens identical). Not at the f32 tolerance
// (1e-4): rounding each cached value to 8 significant bits moves the logits by ~2e-3 (measured by
// Bf16LogitsWithinBf16PrecisionOfF32). qwen3moe_f32 is not in this list: bf16 KV flips an expert choice
// of its layer 2 on the fixture's prompts (moe_out.2 off by 0.15, logits by 4.3e-2 where layers 0-1 are
// at ~2e-3), a discrete top-k change that no tolerance derived from bf16's precision covers.
class PagedKvBf16 : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedKvBf16, MatchesTransformersAtTheBf16Tolerance) {
  const std::string dir = test::oracle_dir(GetParam());
  auto model = Model::load(dir);
  CpuEngine engine(*model, paged(4, 32, DType::kBF16));
  VerifyOptions vo;
  vo.tolerance = 2e-2;
  auto checks = verify_against(engine, dir + "/expected.safetensors", vo);
  ASSERT_GE(checks.size(), 4u);
  for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << " max_rel_err " << c.max_rel_err;
  EXPECT_EQ(engine.kv_usage().blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PagedKvBf16, ::testing::Values("deepseekv3_f32", "olmoe_f32", "mixtral_bf16"));

TEST(PagedKvOptions, BadOptionsAreInputErrors) {
  auto model = Model::load(test::oracle_dir("qwen3moe_f32"));
  EXPECT_THROW(CpuEngine(*model, paged(0, 0)), InputError);
  EXPECT_THROW(CpuEngine(*model, paged(16, -5)), InputError);
  EXPECT_THROW(CpuEngine(*model, paged(16, 0, DType::kF16)), InputError);
  CpuEngine growing(*model, paged(8, 0));
  EXPECT_EQ(growing.kv_usage().blocks_total, 0);  // grown on demand: no fixed pool to admit against
  EXPECT_EQ(growing.kv_usage().block_tokens, 8);
  CpuEngine fixed(*model, paged(8, 20));  // rounded up to 3 blocks
  EXPECT_EQ(fixed.kv_usage().blocks_total, 3);
  EXPECT_EQ(fixed.kv_usage().blocks_used, 0);
}

// The planner sizes pools with kv_bytes_per_token: the cache must store exactly that per token.
TEST(PagedKvOptions, BlockBytesAreWhatThePlannerCounts) {
  for (const char* name : {"qwen3moe_f32", "deepseekv3_f32"}) {
    auto model = Model::load(test::oracle_dir(name));
    for (DType dt : {DType::kF32, DType::kBF16}) {
      CpuEngine e(*model, paged(8, 16, dt));
      EXPECT_EQ(e.kv_cache().block_bytes(), 8 * kv_bytes_per_token(model->cfg, dt)) << name << " " << dtype_name(dt);
    }
  }
}

}  // namespace
}  // namespace tandem
