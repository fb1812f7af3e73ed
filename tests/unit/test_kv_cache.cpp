// The paged KV cache's allocator and storage (engine/kv_cache.h) without a model: blocks handed out and
// returned, a fixed pool's exhaustion, reuse of freed blocks, no leak over many add/remove cycles, rows
// read back from the right block of the right sequence, bf16 rounding on write; the sizing helper.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/kv_cache.h"
#include "placement/memory_model.h"

namespace tandem {
namespace {

constexpr KvCacheShape kShape{3, 5, 2};  // 3 layers, K rows of 5 floats, V rows of 2

// Every block is in at most one table; used + free = total.
void expect_consistent(const KvCache& kv, int max_seqs) {
  std::set<int32_t> owned;
  int64_t n = 0;
  for (int s = 0; s < max_seqs; ++s)
    for (int32_t b : kv.table(s)) {
      EXPECT_TRUE(owned.insert(b).second) << "block " << b << " in two tables";
      EXPECT_GE(b, 0);
      EXPECT_LT(b, kv.blocks_total());
      ++n;
    }
  EXPECT_EQ(n, kv.blocks_used());
}

TEST(KvCache, FixedPoolRoundsUpToBlocksAndHandsOutEach) {
  KvCache kv(kShape, 4, 10, DType::kF32, 4);  // 10 tokens → 3 blocks of 4
  EXPECT_TRUE(kv.fixed());
  EXPECT_EQ(kv.blocks_total(), 3);
  EXPECT_EQ(kv.blocks_free(), 3);
  EXPECT_EQ(kv.blocks_needed(0, 9), 3);
  ASSERT_TRUE(kv.reserve(0, 5));  // 2 blocks
  EXPECT_EQ(kv.table(0).size(), 2u);
  EXPECT_EQ(kv.blocks_used(), 2);
  EXPECT_EQ(kv.blocks_needed(0, 8), 0);  // its 2 blocks hold 8 tokens
  EXPECT_EQ(kv.blocks_needed(0, 9), 1);
  ASSERT_TRUE(kv.reserve(1, 1));
  EXPECT_EQ(kv.blocks_free(), 0);
  expect_consistent(kv, 4);
}

TEST(KvCache, ExhaustedPoolRefusesAndChangesNothing) {
  KvCache kv(kShape, 4, 16, DType::kF32, 4);  // 4 blocks
  ASSERT_TRUE(kv.reserve(0, 12));              // 3 blocks
  const auto before = kv.table(1);
  EXPECT_FALSE(kv.reserve(1, 5));  // needs 2, 1 free
  EXPECT_EQ(kv.table(1), before);
  EXPECT_EQ(kv.blocks_used(), 3);
  EXPECT_EQ(kv.blocks_free(), 1);
  EXPECT_FALSE(kv.reserve(0, 20));  // needs 2 more
  EXPECT_EQ(kv.table(0).size(), 3u);
  EXPECT_TRUE(kv.reserve(1, 4));  // exactly the last block
  EXPECT_EQ(kv.blocks_free(), 0);
  EXPECT_FALSE(kv.reserve(2, 1));
  expect_consistent(kv, 4);
}

TEST(KvCache, FreedBlocksAreReused) {
  KvCache kv(kShape, 2, 8, DType::kF32, 3);  // 4 blocks
  ASSERT_TRUE(kv.reserve(0, 4));            // 2 blocks
  ASSERT_TRUE(kv.reserve(1, 4));            // 2 blocks: the pool is full
  const std::set<int32_t> of0(kv.table(0).begin(), kv.table(0).end());
  kv.trim(0, 0);
  EXPECT_TRUE(kv.table(0).empty());
  EXPECT_EQ(kv.blocks_free(), 2);
  ASSERT_TRUE(kv.reserve(2, 3));  // gets exactly the blocks sequence 0 gave back
  EXPECT_EQ(std::set<int32_t>(kv.table(2).begin(), kv.table(2).end()), of0);
  // trim keeps the blocks the remaining tokens need.
  ASSERT_TRUE(kv.reserve(0, 0));
  kv.trim(2, 1);
  EXPECT_EQ(kv.table(2).size(), 1u);
  EXPECT_EQ(kv.blocks_used(), 3);
  expect_consistent(kv, 3);
}

TEST(KvCache, ManyRandomCyclesLeakNothing) {
  const int kSeqs = 6;
  KvCache kv(kShape, 3, 40, DType::kBF16, kSeqs);  // 14 blocks
  std::vector<int64_t> len(kSeqs, 0);
  std::mt19937 rng(7);
  int refused = 0;
  for (int step = 0; step < 5000; ++step) {
    const int s = int(rng() % kSeqs);
    if (rng() % 5 == 0) {
      kv.trim(s, 0);
      len[size_t(s)] = 0;
    } else {
      const int64_t want = len[size_t(s)] + int64_t(rng() % 7);
      const int64_t free_before = kv.blocks_free();
      if (kv.reserve(s, want)) {
        len[size_t(s)] = want;
      } else {
        ++refused;
        EXPECT_GT(kv.blocks_needed(s, want), free_before);
        EXPECT_EQ(kv.blocks_free(), free_before);
      }
    }
    int64_t used = 0;
    for (int q = 0; q < kSeqs; ++q) {
      ASSERT_EQ(int64_t(kv.table(q).size()), kv.blocks_for(len[size_t(q)]));
      used += kv.blocks_for(len[size_t(q)]);
    }
    ASSERT_EQ(kv.blocks_used(), used);
  }
  EXPECT_GT(refused, 0);  // the pool was exhausted along the way
  expect_consistent(kv, kSeqs);
  for (int q = 0; q < kSeqs; ++q) kv.trim(q, 0);
  EXPECT_EQ(kv.blocks_used(), 0);
  EXPECT_EQ(kv.blocks_free(), kv.blocks_total());
  EXPECT_EQ(kv.blocks_total(), 14);
}

TEST(KvCache, GrowingPoolNeverRefusesAndReusesBeforeGrowing) {
  KvCache kv(kShape, 4, 0, DType::kF32, 2);
  EXPECT_FALSE(kv.fixed());
  EXPECT_EQ(kv.blocks_total(), 0);
  ASSERT_TRUE(kv.reserve(0, 1000));  // 250 blocks
  EXPECT_EQ(kv.blocks_used(), 250);
  const int64_t total = kv.blocks_total();
  EXPECT_GE(total, 250);
  kv.trim(0, 0);
  ASSERT_TRUE(kv.reserve(1, 1000));
  EXPECT_EQ(kv.blocks_total(), total);  // the freed blocks served; no growth
  expect_consistent(kv, 2);
}

// Rows written by position land in their sequence's blocks, in order, for every layer; blocks of two
// sequences interleaved in the pool do not see each other's rows; growth keeps earlier rows in place.
TEST(KvCache, RowsReadBackThroughTheBlockTable) {
  const int64_t B = 3;
  KvCache kv(kShape, B, 0, DType::kF32, 2);
  auto value = [](int seq, int64_t layer, int64_t pos, int64_t i) { return float(seq * 10000 + layer * 1000 + pos * 10 + i); };
  for (int64_t pos = 0; pos < 40; ++pos)
    for (int seq = 0; seq < 2; ++seq) {
      ASSERT_TRUE(kv.reserve(seq, pos + 1));  // one token at a time: the two tables interleave
      for (int64_t l = 0; l < kShape.n_layer; ++l) {
        float k[5], v[2];
        for (int64_t i = 0; i < 5; ++i) k[i] = value(seq, l, pos, i);
        for (int64_t i = 0; i < 2; ++i) v[i] = -value(seq, l, pos, i);
        kv.write(seq, l, pos, k, v);
      }
    }
  EXPECT_NE(kv.table(0)[1], kv.table(0)[0] + 1);  // not contiguous: the test exercises the table
  for (int seq = 0; seq < 2; ++seq)
    for (int64_t l = 0; l < kShape.n_layer; ++l)
      for (int64_t pos = 0; pos < 40; ++pos) {
        const float* k = kv.k_block<float>(seq, l, pos / B) + (pos % B) * 5;
        const float* v = kv.v_block<float>(seq, l, pos / B) + (pos % B) * 2;
        for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(k[i], value(seq, l, pos, i)) << seq << " " << l << " " << pos;
        for (int64_t i = 0; i < 2; ++i) ASSERT_EQ(v[i], -value(seq, l, pos, i)) << seq << " " << l << " " << pos;
      }
}

// Storage is per layer: blocks with consecutive ids hold a layer's K (and V) rows back to back, so a
// sequence that got consecutive blocks reads each layer's rows as one contiguous run (as the unpaged
// cache did), and freed blocks go back in an order that hands them out consecutive again.
TEST(KvCache, ConsecutiveBlocksAreContiguousPerLayer) {
  const int64_t B = 4;
  KvCache kv(kShape, B, 40, DType::kBF16, 2);  // 10 blocks
  ASSERT_TRUE(kv.reserve(0, 3 * B));
  ASSERT_EQ(kv.table(0), (std::vector<int32_t>{0, 1, 2}));
  for (int64_t l = 0; l < kShape.n_layer; ++l)
    for (int64_t b = 1; b < 3; ++b) {
      EXPECT_EQ(kv.k_block<uint16_t>(0, l, b), kv.k_block<uint16_t>(0, l, b - 1) + B * kShape.k_width);
      EXPECT_EQ(kv.v_block<uint16_t>(0, l, b), kv.v_block<uint16_t>(0, l, b - 1) + B * kShape.v_width);
    }
  kv.trim(0, 0);
  ASSERT_TRUE(kv.reserve(1, 3 * B));
  EXPECT_EQ(kv.table(1), (std::vector<int32_t>{0, 1, 2}));
}

TEST(KvCache, Bf16StorageRoundsToNearestEven) {
  KvCache kv(kShape, 2, 2, DType::kBF16, 1);
  ASSERT_TRUE(kv.reserve(0, 2));
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to the even one (1).
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to 1 + 2^-6 (even mantissa).
  const float k[5] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, 65504.0f};
  const float v[2] = {0.1f, -0.0f};
  kv.write(0, 2, 1, k, v);
  const uint16_t* kb = kv.k_block<uint16_t>(0, 2, 0) + 5;
  const uint16_t* vb = kv.v_block<uint16_t>(0, 2, 0) + 2;
  EXPECT_EQ(bf16_to_f32(kb[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(kb[1]), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_f32(kb[2]), 1.0f + 0x1p-7f);  // above the tie: rounds up
  EXPECT_EQ(bf16_to_f32(kb[3]), -2.5f);
  EXPECT_EQ(bf16_to_f32(kb[4]), 65536.0f);  // 1.1111111|111·2^15: the carry reaches the exponent
  EXPECT_NEAR(bf16_to_f32(vb[0]), 0.1f, 0.1f * 0x1p-9f);
  EXPECT_EQ(vb[1], 0x8000);
}

TEST(KvCache, BadOptionsAreInputErrors) {
  EXPECT_THROW(KvCache(kShape, 0, 16, DType::kF32, 1), InputError);
  EXPECT_THROW(KvCache(kShape, 16, -1, DType::kF32, 1), InputError);
  EXPECT_THROW(KvCache(kShape, 16, 16, DType::kF16, 1), InputError);
}

ModelConfig gqa_config() {
  ModelConfig c;
  c.n_layer = 3;
  c.n_head_kv = 2;
  c.head_dim = 16;
  return c;
}

ModelConfig mla_config() {
  ModelConfig c;
  c.n_layer = 4;
  c.mla = true;
  c.kv_lora_rank = 32;
  c.qk_rope_head_dim = 8;
  c.n_head_kv = 4;  // unused by MLA's cache
  c.head_dim = 24;
  return c;
}

TEST(KvCacheSizing, ShapesAreWhatThePlannerCounts) {
  EXPECT_EQ(kv_cache_shape(gqa_config()).k_width, 32);
  EXPECT_EQ(kv_cache_shape(gqa_config()).v_width, 32);
  EXPECT_EQ(kv_cache_shape(mla_config()).k_width, 32);
  EXPECT_EQ(kv_cache_shape(mla_config()).v_width, 8);
  for (const ModelConfig& c : {gqa_config(), mla_config()})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      EXPECT_EQ(kv_block_bytes(kv_cache_shape(c), 16, dt), 16 * kv_bytes_per_token(c, dt));
      KvCache kv(kv_cache_shape(c), 16, 16, dt, 1);
      EXPECT_EQ(kv.block_bytes(), 16 * kv_bytes_per_token(c, dt));
    }
}

TEST(KvCacheSizing, TokensInBytesCountsWholeBlocks) {
  const ModelConfig c = gqa_config();
  const uint64_t per_token_bf16 = 3 * 64 * 2;  // 3 layers × (K 32 + V 32) × 2 bytes
  ASSERT_EQ(kv_bytes_per_token(c, DType::kBF16), per_token_bf16);
  EXPECT_EQ(kv_tokens_in_bytes(c, DType::kBF16, 16, 10 * 16 * per_token_bf16), 160);
  EXPECT_EQ(kv_tokens_in_bytes(c, DType::kBF16, 16, 10 * 16 * per_token_bf16 - 1), 144);  // a partial block does not count
  EXPECT_EQ(kv_tokens_in_bytes(c, DType::kF32, 16, 10 * 16 * per_token_bf16), 80);      // f32: half the tokens
  EXPECT_EQ(kv_tokens_in_bytes(c, DType::kBF16, 16, 16 * per_token_bf16 - 1), 0);
  EXPECT_EQ(kv_tokens_in_bytes(c, DType::kBF16, 1, 7 * per_token_bf16 + 5), 7);
  // 64 GiB of an MLA model's bf16 KV: 2^36 / (4 × 40 × 2) = 214748364.8 tokens, whole blocks of 16.
  EXPECT_EQ(kv_tokens_in_bytes(mla_config(), DType::kBF16, 16, uint64_t(64) << 30), 214748352);
  // The result as kv_tokens makes a pool within the bytes.
  for (uint64_t bytes : {uint64_t(100000), uint64_t(123457), uint64_t(1) << 20}) {
    const int64_t tokens = kv_tokens_in_bytes(c, DType::kBF16, 16, bytes);
    KvCache kv(kv_cache_shape(c), 16, tokens, DType::kBF16, 1);
    EXPECT_LE(uint64_t(kv.blocks_total()) * kv.block_bytes(), bytes);
    EXPECT_GT(uint64_t(kv.blocks_total() + 1) * kv.block_bytes(), bytes);
  }
  EXPECT_THROW(kv_tokens_in_bytes(c, DType::kBF16, 0, 1000), InputError);
  EXPECT_THROW(kv_tokens_in_bytes(c, DType::kF16, 16, 1000), InputError);
}

}  // namespace
}  // namespace tandem
