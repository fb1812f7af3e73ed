// The split lane's arithmetic on the CPU: where an expert is cut (split_column), the two slices of an
// expert summing to the whole expert (f32 and bf16, single and multi-row), the peer's ColdExperts
// holding only its slice, and the lane fingerprint that makes a peer and a primary cut the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "../lane_tools/rowmap_util.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "models/model.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/cold_experts.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(SplitColumn, MultipleOfEightInsideTheExpert) {
  EXPECT_EQ(split_column(512, 0.4), 208);  // 204.8 -> 26 vectors of 8
  EXPECT_EQ(split_column(512, 0.5), 256);
  EXPECT_EQ(split_column(32, 0.4), 16);
  EXPECT_EQ(split_column(32, 0.01), 8);   // at least one vector on each side
  EXPECT_EQ(split_column(32, 0.99), 24);
  EXPECT_EQ(split_column(20, 0.9), 8);    // (20 - 8) rounded down to a vector
  for (int64_t inter : {16, 48, 384, 512, 1408})
    for (double f : {0.05, 0.3, 0.6, 0.95}) {
      const int64_t a = split_column(inter, f);
      EXPECT_EQ(a % 8, 0);
      EXPECT_GE(a, 8);
      EXPECT_LE(a, inter - 8);
    }
}

TEST(SplitColumn, RejectsFractionsOutsideTheOpenInterval) {
  for (double f : {0.0, 1.0, -0.5, 1.5, std::nan("")}) EXPECT_THROW(split_column(512, f), InputError) << f;
  EXPECT_THROW(split_column(8, 0.5), InputError);  // too small to cut
}

// auto's share: where the link's part and the DRAM's part of each cold expert take equally long.
TEST(SplitShareFor, BothPartsTakeEquallyLong) {
  EXPECT_DOUBLE_EQ(split_share_for(51, 51), 0.5);
  EXPECT_NEAR(split_share_for(31, 104), 0.2296, 1e-4);  // an H100 box's link against its DRAM
  for (auto [link, dram] : {std::pair{30.0, 90.0}, {51.0, 80.0}, {4.0, 400.0}}) {
    const double f = split_share_for(link, dram);
    EXPECT_NEAR(f / link, (1 - f) / dram, 1e-12) << link << " " << dram;  // seconds per byte of the expert
  }
  for (auto [link, dram] : {std::pair{0.0, 90.0}, {30.0, -1.0}, {std::nan(""), 9.0}, {30.0, HUGE_VAL}})
    EXPECT_THROW(split_share_for(link, dram), InputError) << link << " " << dram;
}

struct RandomExpert {
  std::vector<uint8_t> bytes[3];
  ExpertWeights w;
  RandomExpert(int64_t inter, int64_t hidden, DType dt, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.3f);
    const int64_t shapes[3][2] = {{inter, hidden}, {inter, hidden}, {hidden, inter}};
    TensorView* views[3] = {&w.gate, &w.up, &w.down};
    for (int j = 0; j < 3; ++j) {
      const int64_t n = shapes[j][0] * shapes[j][1];
      bytes[j].resize(size_t(n) * dtype_size(dt));
      for (int64_t i = 0; i < n; ++i) {
        const float f = d(rng);
        if (dt == DType::kF32) {
          std::memcpy(&bytes[j][size_t(i) * 4], &f, 4);
        } else {
          const uint16_t h = f32_to_bf16(f);
          std::memcpy(&bytes[j][size_t(i) * 2], &h, 2);
        }
      }
      views[j]->data = bytes[j].data();
      views[j]->dtype = dt;
      views[j]->shape = Shape{shapes[j][0], shapes[j][1]};
    }
  }
};

// A 64-byte aligned buffer of n bytes.
struct Aligned {
  std::vector<uint8_t> v;
  uint8_t* p;
  explicit Aligned(size_t n) : v(n + 64) { p = v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64; }
};

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float f : a) m = std::max(m, double(std::fabs(f)));
  return m;
}

void expect_slices_sum_to_whole(DType dt, int64_t inter, int64_t hidden, int64_t rows) {
  const int E = 4, k = 2;
  std::vector<std::unique_ptr<RandomExpert>> owned;
  std::vector<ExpertWeights> whole(E), low(E), high(E);
  std::vector<std::unique_ptr<Aligned>> buf;
  const int64_t a = split_column(inter, 0.4);
  for (int e = 0; e < E; ++e) {
    owned.push_back(std::make_unique<RandomExpert>(inter, hidden, dt, uint32_t(7 + e)));
    whole[size_t(e)] = owned.back()->w;
    buf.push_back(std::make_unique<Aligned>(sliced_bytes(whole[size_t(e)], 0, a)));
    low[size_t(e)] = slice_expert(whole[size_t(e)], 0, a, buf.back()->p);
    buf.push_back(std::make_unique<Aligned>(sliced_bytes(whole[size_t(e)], a, inter)));
    high[size_t(e)] = slice_expert(whole[size_t(e)], a, inter, buf.back()->p);
    EXPECT_EQ(low[size_t(e)].gate.rows(), a);
    EXPECT_EQ(high[size_t(e)].down.cols(), inter - a);
    EXPECT_EQ(low[size_t(e)].nbytes() + high[size_t(e)].nbytes(), whole[size_t(e)].nbytes());
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * hidden));
  for (auto& f : x) f = d(rng);
  std::vector<int32_t> ids(size_t(rows * k));
  std::vector<float> wts(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j) {
      ids[size_t(r * k + j)] = (r + j) % 3 == 2 ? -1 : int32_t((r + 2 * j) % E);
      wts[size_t(r * k + j)] = 0.25f + 0.5f * float(j);
    }
  std::vector<float> ref(size_t(rows * hidden)), lo(ref.size()), hi(ref.size());
  run_experts_cpu(whole, x.data(), rows, hidden, ids.data(), wts.data(), k, ref.data(), global_pool());
  run_experts_cpu(low, x.data(), rows, hidden, ids.data(), wts.data(), k, lo.data(), global_pool());
  run_experts_cpu(high, x.data(), rows, hidden, ids.data(), wts.data(), k, hi.data(), global_pool());
  const double scale = max_abs(ref);
  ASSERT_GT(scale, 0.0);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(lo[i] + hi[i], ref[i], 1e-5 * scale) << i;
  // Each slice is a real part of the answer, not zero.
  EXPECT_GT(max_abs(lo), 0.01 * scale);
  EXPECT_GT(max_abs(hi), 0.01 * scale);
}

TEST(SliceExpert, SlicesSumToTheWholeF32OneRow) { expect_slices_sum_to_whole(DType::kF32, 48, 64, 1); }
TEST(SliceExpert, SlicesSumToTheWholeBf16ManyRows) { expect_slices_sum_to_whole(DType::kBF16, 96, 128, 9); }
TEST(SliceExpert, SlicesSumToTheWholeWideExpert) { expect_slices_sum_to_whole(DType::kBF16, 512, 256, 3); }

TEST(ColdExpertsSplit, HoldsAndComputesOnlyItsShare) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = test::make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  const int64_t inter = model->cfg.moe_intermediate_size, H = model->cfg.hidden_size, k = model->cfg.n_expert_used;
  const int64_t a = split_column(inter, 0.5);
  ColdExperts whole(*model, rm, global_pool());
  ColdExperts share(*model, rm, global_pool(), a);
  EXPECT_EQ(share.n_cold(), whole.n_cold());
  EXPECT_EQ(share.bytes_held(), whole.bytes_held() / size_t(inter) * size_t(inter - a));
  // Reference for the share: the model's experts sliced here.
  int64_t layer = 0;
  while (!model->cfg.layer_is_moe[size_t(layer)]) ++layer;
  const auto& experts = model->layers[size_t(layer)].experts;
  std::vector<ExpertWeights> sliced(experts.size());
  std::vector<std::unique_ptr<Aligned>> buf;
  for (size_t e = 1; e < experts.size(); e += 2) {
    buf.push_back(std::make_unique<Aligned>(sliced_bytes(experts[e], a, inter)));
    sliced[e] = slice_expert(experts[e], a, inter, buf.back()->p);
  }
  const int64_t rows = 3;
  std::vector<float> x(size_t(rows * H));
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& f : x) f = d(rng);
  std::vector<int32_t> ids(size_t(rows * k), -1);
  std::vector<float> wts(size_t(rows * k), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    ids[size_t(r * k)] = int32_t(2 * r + 1);
    wts[size_t(r * k)] = 0.7f;
  }
  std::vector<float> got(size_t(rows * H)), ref(got.size()), full(got.size());
  share.compute(int(layer), x.data(), rows, ids.data(), wts.data(), k, got.data());
  run_experts_cpu(sliced, x.data(), rows, H, ids.data(), wts.data(), k, ref.data(), global_pool());
  whole.compute(int(layer), x.data(), rows, ids.data(), wts.data(), k, full.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_FLOAT_EQ(got[i], ref[i]) << i;
  double diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, double(std::fabs(got[i] - full[i])));
  EXPECT_GT(diff, 1e-3 * max_abs(full));  // a share, not the whole expert
}

TEST(ColdExpertsSplit, RejectsACutPastTheExpert) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = test::make_rowmap(dir, [](int64_t, int64_t e) { return e == 0; });
  EXPECT_THROW(ColdExperts(*model, rm, global_pool(), model->cfg.moe_intermediate_size), InputError);
}

TEST(LaneFingerprint, CoversTheSplit) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  const Rowmap rm = test::make_rowmap(dir, [](int64_t, int64_t e) { return e % 3 == 0; });
  EXPECT_EQ(lane_fingerprint(rm), lane_fingerprint(rm, 0));
  EXPECT_NE(lane_fingerprint(rm), lane_fingerprint(rm, 16));
  EXPECT_NE(lane_fingerprint(rm, 8), lane_fingerprint(rm, 16));
  EXPECT_EQ(lane_fingerprint(rm, 16), lane_fingerprint(rm, 16));
}

}  // namespace
}  // namespace tandem
