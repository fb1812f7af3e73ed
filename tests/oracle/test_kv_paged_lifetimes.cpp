// Sequences with interleaved lifetimes in one fixed KV pool, as a server's scheduler runs them: each
// step decodes every live sequence and prefills the requests whose turn has come, a request that
// does not fit waits (KvCacheFull, then retried next step), a finished sequence gives its blocks back
// at once and a later one reuses them. Every request's greedy tokens equal those of it run alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine/verify.h"
#include "test_util.h"

namespace tandem {
namespace {

struct Request {
  std::vector<int32_t> prompt;
  int64_t start = 0;       // the first step at which it may be admitted
  int64_t max_tokens = 0;  // greedy tokens to generate
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // [request] greedy tokens
  std::vector<std::vector<float>> logits;    // [request] [max_tokens, V]: the logits each token came from
  int64_t deferred = 0;                      // admissions refused with KvCacheFull and retried later
  int64_t peak_blocks = 0;
  bool reused = false;  // a sequence got a block that a finished one had given back
};

int32_t argmax(const float* p, int64_t n) { return int32_t(std::max_element(p, p + n) - p); }

Outcome run(CpuEngine& e, const std::vector<Request>& reqs) {
  const int64_t V = e.vocab_size();
  Outcome out;
  out.tokens.resize(reqs.size());
  out.logits.resize(reqs.size());
  std::vector<int> seq(reqs.size(), -1);
  std::vector<size_t> pending(reqs.size()), live;
  for (size_t i = 0; i < reqs.size(); ++i) pending[i] = i;
  std::set<int32_t> given_back;
  for (int64_t step = 0; !pending.empty() || !live.empty(); ++step) {
    std::vector<size_t> admit;
    for (size_t i : pending)
      if (reqs[i].start <= step) admit.push_back(i);
    for (size_t i : admit) seq[i] = e.add_sequence();
    const std::vector<float>* logits = nullptr;
    std::vector<size_t> order;
    while (true) {
      std::vector<Engine::Item> items;
      order.clear();
      for (size_t i : live) {
        items.push_back({seq[i], std::span<const int32_t>(&out.tokens[i].back(), 1)});
        order.push_back(i);
      }
      for (size_t i : admit) {
        items.push_back({seq[i], reqs[i].prompt});
        order.push_back(i);
      }
      try {
        logits = &e.forward(items);
        break;
      } catch (const KvCacheFull&) {
        // The last admission waits for the next step; the live sequences must always fit (the
        // pool is sized for that), as a scheduler that never preempts needs.
        EXPECT_FALSE(admit.empty()) << "step " << step << ": the live sequences' decode alone did not fit";
        if (admit.empty()) return out;
        e.remove_sequence(seq[admit.back()]);
        seq[admit.back()] = -1;
        admit.pop_back();
        ++out.deferred;
      }
    }
    for (size_t i : admit) {
      pending.erase(std::find(pending.begin(), pending.end(), i));
      live.push_back(i);
      for (int32_t b : e.kv_cache().table(seq[i])) out.reused |= given_back.count(b) > 0;
    }
    out.peak_blocks = std::max(out.peak_blocks, e.kv_usage().blocks_used);
    for (size_t j = 0; j < order.size(); ++j) {
      const float* row = logits->data() + int64_t(j) * V;
      out.tokens[order[j]].push_back(argmax(row, V));
      out.logits[order[j]].insert(out.logits[order[j]].end(), row, row + V);
    }
    for (auto it = live.begin(); it != live.end();) {
      const size_t i = *it;
      for (int32_t b : e.kv_cache().table(seq[i])) out.reused |= given_back.count(b) > 0;  // grown this step
      if (int64_t(out.tokens[i].size()) < reqs[i].max_tokens) {
        ++it;
        continue;
      }
      for (int32_t b : e.kv_cache().table(seq[i])) given_back.insert(b);
      e.remove_sequence(seq[i]);
      it = live.erase(it);
    }
  }
  return out;
}

EngineOptions pool_of(int64_t blocks, DType dtype) {
  EngineOptions o;
  o.kv_block = 4;
  o.kv_tokens = 4 * blocks;
  o.kv_dtype = dtype;
  return o;
}

// Lifetimes: A and B from step 0, C from 2, D from 3, E from 4, F from 5, each finishing after its
// max_tokens. With 11 blocks of 4 tokens the pool is full at the peak and three admissions wait a
// step (counted on paper from the blocks each step needs; checked below).
const std::vector<Request> kRequests = {
    {{5, 17, 99, 3, 250, 7, 8, 41, 42, 43, 6}, 0, 6},
    {{42, 9}, 0, 9},
    {{300, 301, 302, 7, 1}, 2, 4},
    {{11, 12, 13, 14, 15, 16, 17, 18, 19}, 3, 7},
    {{200, 7, 77}, 4, 5},
    {{8, 88, 188, 288, 388, 488}, 5, 3},
};

class PagedLifetimes : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(PagedLifetimes, InterleavedLifetimesGiveTheGreedyTokensOfEachAlone) {
  const auto& [name, dtype] = GetParam();
  auto model = Model::load(test::oracle_dir(name));
  const int64_t V = model->cfg.vocab_size;
  for (const auto& r : kRequests)
    for (int32_t t : r.prompt) ASSERT_LT(t, V) << name;
  CpuEngine together(*model, pool_of(11, dtype));
  const Outcome got = run(together, kRequests);
  EXPECT_EQ(got.deferred, 3);
  EXPECT_EQ(got.peak_blocks, 11);
  EXPECT_TRUE(got.reused) << "no sequence reused a block another had given back";
  EXPECT_EQ(together.kv_usage().blocks_used, 0);
  for (size_t i = 0; i < kRequests.size(); ++i) {
    CpuEngine alone_engine(*model, pool_of(11, dtype));
    Request r = kRequests[i];
    r.start = 0;
    const Outcome alone = run(alone_engine, {r});
    ASSERT_EQ(got.tokens[i].size(), size_t(r.max_tokens)) << name << " request " << i;
    EXPECT_EQ(got.tokens[i], alone.tokens[0]) << name << " request " << i;
    // Same arithmetic per row in another batch: rounding-level differences only (as the oracle's
    // BatchingDoesNotChangeAnswers). With bf16 rows a last-bit difference can round a cached value to
    // the next bf16 number (2^-8 relative), so there only the tokens are compared.
    if (dtype == DType::kF32) {
      EXPECT_LT(max_rel_err(got.logits[i].data(), alone.logits[0].data(), int64_t(got.logits[i].size())), 1e-5)
          << name << " request " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PagedLifetimes,
                         ::testing::Combine(::testing::Values("qwen3moe_f32", "deepseekv3_f32", "olmoe_f32",
                                                              "mixtral_bf16"),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) == DType::kF32 ? "_kvf32" : "_kvbf16");
                         });

}  // namespace
}  // namespace tandem
