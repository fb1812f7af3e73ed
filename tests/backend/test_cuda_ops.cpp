// Each CUDA op against the CPU reference on fresh random inputs (outputs poisoned first, so every
// element must be written): projections in f32/bf16/f16 on the vector and scalar paths and on the
// tensor-core kernel, RMSNorm, both routers (including the masked-to-0.0 group semantics), grouping
// with a cold mask, and the expert kernels with weights in HBM and in mapped pinned host memory (the
// host lane), under every rows-per-pass policy.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "backends/cpu/kernels.h"
#include "backends/cuda/cuda_diagnostics.h"
#include "backends/cuda/linear.cuh"
#include "backends/cuda/moe.cuh"
#include "backends/cuda/norm.cuh"
#include "cuda_test_util.h"
#include "moe/router.h"

namespace tandem {
namespace {

using cuda::WType;
using test::DevBuf;

TensorView view(const std::vector<uint8_t>& bytes, DType t, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = bytes.data();
  v.dtype = t;
  v.shape = Shape{rows, cols};
  return v;
}

struct LinearCase {
  DType dtype;
  int n, M, K;
};

// The projections' kernel choice: mma_min_rows 0 keeps every launch on the CUDA-core kernel, 1 sends
// every launch it applies to (bf16, K a multiple of 32) to the tensor-core kernel; split: the
// CUDA-core kernel's warps per feature at one row (0: by the grid).
cuda::KernelPolicy linear_policy(int min_rows, int split = 0) {
  cuda::KernelPolicy p;
  p.linear_mma_min_rows = min_rows;
  p.linear_row_split = split;
  return p;
}

// Whether the tensor-core kernel should take a projection of dtype dt and depth K under linear_policy(min_rows).
bool expect_mma(int min_rows, DType dt, int K) { return min_rows == 1 && dt == DType::kBF16 && K % 32 == 0; }

// y = x Wᵀ against the CPU's matmul, then y += x Wᵀ (twice the result), on the kernel min_rows picks
// (the CUDA-core kernel with `split` warps a feature at one row).
void check_linear(DType dt, int n, int M, int K, int min_rows, int split = 0) {
  SCOPED_TRACE(min_rows ? "tensor-core kernel" : fmt::format("CUDA-core kernel, split {}", split));
  const cuda::KernelPolicy policy = linear_policy(min_rows, split);
  auto wf = test::random_floats(size_t(M) * K, 1 + n + M + K, 0.1f);
  auto wb = test::to_dtype(wf, dt);
  auto x = test::random_floats(size_t(n) * K, 7 + n);
  std::vector<float> ref(size_t(n) * M);
  cpu::matmul(x.data(), n, view(wb, dt, M, K), ref.data(), global_pool());
  DevBuf<uint8_t> dw(wb);
  DevBuf<float> dx(x), dy(size_t(n) * M);
  dy.poison();
  cuda::LinearArgs a;
  a.x = dx.p, a.x_stride = K, a.n = n;
  a.w = dw.p, a.wt = cuda::wtype_of(dt, "w"), a.M = M, a.K = K, a.w_ld = K;
  a.y = dy.p, a.y_stride = M;
  ASSERT_EQ(cuda::linear_uses_mma(a, policy), expect_mma(min_rows, dt, K));
  if (split > 0 && !cuda::linear_uses_mma(a, policy)) {
    ASSERT_EQ(cuda::linear_row_split(a, policy), n == 1 ? split : 1);
  }
  cuda::launch_linear(a, policy, nullptr);
  EXPECT_LT(test::rel_err(dy.download(), ref), 1e-5);
  a.accumulate = true;
  cuda::launch_linear(a, policy, nullptr);
  auto twice = dy.download();
  for (auto& v : ref) v *= 2;
  EXPECT_LT(test::rel_err(twice, ref), 1e-5);
}

class LinearOp : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearOp, MatchesCpuMatmul) {
  const auto [dt, n, M, K] = GetParam();
  for (int min_rows : {0, 1}) check_linear(dt, n, M, K, min_rows);
  for (int split : {1, 2, 4}) check_linear(dt, n, M, K, 0, split);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearOp,
                         ::testing::Values(LinearCase{DType::kF32, 1, 37, 256}, LinearCase{DType::kBF16, 3, 64, 512},
                                           // One row: K in shares of whole 256-k steps (bf16), one
                                           // share empty at K 128 and split 2 or 4, the scalar path.
                                           LinearCase{DType::kBF16, 1, 70, 2048}, LinearCase{DType::kBF16, 1, 24, 128},
                                           LinearCase{DType::kBF16, 1, 19, 50}, LinearCase{DType::kF16, 1, 40, 136},
                                           LinearCase{DType::kF16, 13, 40, 136},
                                           LinearCase{DType::kBF16, 9, 33, 50},  // K not a multiple of 8: scalar path
                                           LinearCase{DType::kF32, 17, 8, 30},
                                           // The tensor-core kernel's edges: fewer 32-k chunks than
                                           // warps, M not a multiple of 16, one / two / four row
                                           // tiles with a partial last one, more rows than a pass.
                                           LinearCase{DType::kBF16, 5, 70, 96}, LinearCase{DType::kBF16, 8, 64, 2048},
                                           LinearCase{DType::kBF16, 13, 33, 1024},
                                           LinearCase{DType::kBF16, 32, 48, 512},
                                           LinearCase{DType::kBF16, 45, 24, 256}));

// Two independent heads (batch 2) reading gathered rows 2 and 0 of x.
void check_gathered_heads(int min_rows) {
  SCOPED_TRACE(min_rows ? "tensor-core kernel" : "CUDA-core kernel");
  const cuda::KernelPolicy policy = linear_policy(min_rows);
  const int heads = 2, M = 16, K = 64, rows = 3;
  auto wf = test::random_floats(size_t(heads) * M * K, 3, 0.1f);
  auto wb = test::to_dtype(wf, DType::kBF16);
  auto x = test::random_floats(size_t(rows) * heads * K, 4);
  std::vector<int32_t> pick = {2, 0};
  DevBuf<uint8_t> dw(wb);
  DevBuf<float> dx(x), dy(size_t(2) * heads * M);
  DevBuf<int32_t> dpick(pick);
  dy.poison();
  cuda::LinearArgs a;
  a.x = dx.p, a.x_stride = heads * K, a.x_rows = dpick.p, a.n = 2;
  a.w = dw.p, a.wt = WType::kBF16, a.M = M, a.K = K, a.w_ld = K;
  a.y = dy.p, a.y_stride = heads * M;
  a.batch = heads, a.x_bstride = K, a.w_bstride = int64_t(M) * K, a.y_bstride = M;
  ASSERT_EQ(cuda::linear_uses_mma(a, policy), min_rows == 1);
  cuda::launch_linear(a, policy, nullptr);
  auto got = dy.download();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < 2; ++i)
      for (int m = 0; m < M; ++m) {
        double ref = 0;
        for (int k = 0; k < K; ++k) ref += double(x[size_t(pick[size_t(i)]) * heads * K + h * K + k]) * wf[(size_t(h) * M + m) * K + k];
        EXPECT_NEAR(got[size_t(i) * heads * M + h * M + m], ref, 1e-4) << h << " " << i << " " << m;
      }
}

TEST(LinearOp, GatheredRowsAndBatchedHeads) {
  for (int min_rows : {0, 1}) check_gathered_heads(min_rows);
}

// KernelRepeat issues the kernels its name part matches twice, by name or by grid ("[5x1x1]": 40
// features, 8 a block), and nothing else: seen through an accumulating projection from y = 0.
TEST(KernelRepeatOp, MatchingLaunchesRunTwice) {
  const cuda::KernelPolicy policy = linear_policy(0, 1);  // the CUDA-core kernel, linear_kernel, a warp per feature
  const int n = 1, M = 40, K = 64;
  auto wf = test::random_floats(size_t(M) * K, 31, 0.1f);
  auto wb = test::to_dtype(wf, DType::kBF16);
  auto x = test::random_floats(size_t(n) * K, 32);
  std::vector<float> ref(size_t(n) * M);
  cpu::matmul(x.data(), n, view(wb, DType::kBF16, M, K), ref.data(), global_pool());
  DevBuf<uint8_t> dw(wb);
  DevBuf<float> dx(x);
  for (const auto& [part, times] : {std::pair<const char*, float>{"linear_kernel", 2.0f}, {"[5x1x1]", 2.0f},
                                    {"[6x1x1]", 1.0f}, {"expert_down", 1.0f}}) {
    SCOPED_TRACE(part);
    std::vector<float> zero(size_t(n) * M, 0.0f);
    DevBuf<float> dy(zero);
    cuda::LinearArgs a;
    a.x = dx.p, a.x_stride = K, a.n = n;
    a.w = dw.p, a.wt = WType::kBF16, a.M = M, a.K = K, a.w_ld = K;
    a.y = dy.p, a.y_stride = M, a.accumulate = true;
    {
      KernelRepeat repeat(part);
      cuda::launch_linear(a, policy, nullptr);
    }
    auto want = ref;
    for (auto& v : want) v *= times;
    EXPECT_LT(test::rel_err(dy.download(), want), 1e-5);
  }
}

TEST(NormOp, MatchesCpuRmsNorm) {
  const int n = 5, d = 300;
  auto x = test::random_floats(size_t(n) * d, 11);
  auto w = test::random_floats(size_t(d), 12);
  std::vector<uint8_t> wb(w.size() * 4);
  std::memcpy(wb.data(), w.data(), wb.size());
  std::vector<float> ref(x.size());
  cpu::rms_norm(x.data(), n, d, view(wb, DType::kF32, 1, d), 1e-6f, ref.data());
  DevBuf<float> dx(x), dw(w), dy(x.size());
  dy.poison();
  cuda::launch_rms_norm(dx.p, d, nullptr, n, d, dw.p, 1e-6f, dy.p, d, nullptr);
  EXPECT_LT(test::rel_err(dy.download(), ref), 1e-6);
}

// A projection with the RMSNorm fused in front against rms_norm then matmul on the CPU, on the vector
// (bf16, K = 512) and scalar (f32, K = 302: not a multiple of 4) paths, at 1 and kLinearNormRows rows;
// norm_out must hold the normalised rows (every element written: poisoned before).
void check_linear_norm(const cuda::KernelPolicy& policy, DType dt, int n, int M, int K) {
  auto wf = test::random_floats(size_t(M) * K, 21 + n, 0.1f);
  auto wb = test::to_dtype(wf, dt);
  auto x = test::random_floats(size_t(n) * K, 22 + n, 3.0f);
  auto g = test::random_floats(size_t(K), 23);
  std::vector<uint8_t> gb(g.size() * 4);
  std::memcpy(gb.data(), g.data(), gb.size());
  std::vector<float> normed(x.size()), ref(size_t(n) * M);
  cpu::rms_norm(x.data(), n, K, view(gb, DType::kF32, 1, K), 1e-6f, normed.data());
  cpu::matmul(normed.data(), n, view(wb, dt, M, K), ref.data(), global_pool());
  DevBuf<uint8_t> dw(wb);
  DevBuf<float> dx(x), dg(g), dy(size_t(n) * M), dh(x.size());
  dy.poison(), dh.poison();
  cuda::LinearArgs a;
  a.x = dx.p, a.x_stride = K, a.n = n;
  a.w = dw.p, a.wt = cuda::wtype_of(dt, "w"), a.M = M, a.K = K, a.w_ld = K;
  a.y = dy.p, a.y_stride = M;
  a.norm_w = dg.p, a.norm_eps = 1e-6f, a.norm_out = dh.p, a.norm_out_stride = K;
  EXPECT_EQ(cuda::linear_uses_mma(a, policy), expect_mma(policy.linear_mma_min_rows, dt, K));
  cuda::launch_linear(a, policy, nullptr);
  EXPECT_LT(test::rel_err(dy.download(), ref), 1e-5) << n << " rows";
  EXPECT_LT(test::rel_err(dh.download(), normed), 1e-6) << n << " rows";
}

TEST(LinearOp, FusedRmsNormMatchesNormThenMatmul) {
  for (int min_rows : {0, 1}) {
    SCOPED_TRACE(min_rows ? "tensor-core kernel" : "CUDA-core kernel");
    const cuda::KernelPolicy policy = linear_policy(min_rows);
    for (int n : {1, 5, cuda::kLinearNormRows}) {
      check_linear_norm(policy, DType::kBF16, n, 40, 512);
      check_linear_norm(policy, DType::kF32, n, 24, 302);
    }
  }
  // The CUDA-core kernel with 1, 2 and 4 warps a feature at one row.
  for (int split : {1, 2, 4}) {
    SCOPED_TRACE(fmt::format("CUDA-core kernel, split {}", split));
    const cuda::KernelPolicy policy = linear_policy(0, split);
    for (int n : {1, 3}) {
      check_linear_norm(policy, DType::kBF16, n, 40, 512);
      check_linear_norm(policy, DType::kBF16, n, 37, 2048);
      check_linear_norm(policy, DType::kF32, n, 24, 302);
    }
  }
}

ModelConfig router_config(RouterKind kind, int64_t E, int64_t k, bool norm, int64_t groups, int64_t topk_group) {
  ModelConfig c;
  c.router = kind;
  c.n_expert = E;
  c.n_expert_used = k;
  c.norm_topk_prob = norm;
  c.n_group = groups;
  c.topk_group = topk_group;
  c.routed_scaling_factor = kind == RouterKind::kSigmoidGroupTopK ? 2.5 : 1.0;
  return c;
}

void check_route(const ModelConfig& c, const std::vector<float>& bias, int n, uint32_t seed) {
  auto logits = test::random_floats(size_t(n) * c.n_expert, seed, 2.0f);
  std::vector<uint8_t> bb(bias.size() * 4);
  std::memcpy(bb.data(), bias.data(), bb.size());
  TensorView bv;
  if (!bias.empty()) bv = view(bb, DType::kF32, 1, int64_t(bias.size()));
  Routing ref;
  route(c, logits.data(), n, bv, ref);
  const int kS = int(c.n_expert_used) + 1;
  DevBuf<float> dl(logits), dwts(size_t(n) * kS);
  DevBuf<int32_t> dids(size_t(n) * kS);
  std::unique_ptr<DevBuf<float>> db;
  if (!bias.empty()) db = std::make_unique<DevBuf<float>>(bias);
  dids.poison();
  dwts.poison();
  cuda::RouteArgs a;
  a.logits = dl.p, a.n = n, a.n_expert = int(c.n_expert), a.k = int(c.n_expert_used);
  a.kind = c.router == RouterKind::kSoftmaxTopK ? cuda::RouteKind::kSoftmaxTopK : cuda::RouteKind::kSigmoidGroupTopK;
  a.norm_topk = c.norm_topk_prob, a.routed_scaling = c.routed_scaling_factor;
  a.n_group = int(c.n_group), a.topk_group = int(c.topk_group), a.bias = db ? db->p : nullptr;
  a.shared_slot = true, a.ids = dids.p, a.weights = dwts.p;
  cuda::launch_route(a, nullptr);
  auto ids = dids.download();
  auto wts = dwts.download();
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < c.n_expert_used; ++j) {
      const size_t g = size_t(r) * kS + j, cref = size_t(r) * c.n_expert_used + j;
      ASSERT_EQ(ids[g], ref.ids[cref]) << "row " << r << " slot " << j;
      EXPECT_NEAR(wts[g], ref.weights[cref], 1e-5 * std::max(1.0f, std::fabs(ref.weights[cref])));
    }
    EXPECT_EQ(ids[size_t(r) * kS + c.n_expert_used], c.n_expert);
    EXPECT_EQ(wts[size_t(r) * kS + c.n_expert_used], 1.0f);
  }
}

TEST(RouteOp, SoftmaxTopKRenormalised) { check_route(router_config(RouterKind::kSoftmaxTopK, 64, 4, true, 1, 1), {}, 37, 5); }
TEST(RouteOp, SoftmaxTopKRaw) { check_route(router_config(RouterKind::kSoftmaxTopK, 384, 8, false, 1, 1), {}, 9, 6); }
TEST(RouteOp, SigmoidGroupLimited) {
  auto bias = test::random_floats(384, 9, 0.3f);
  check_route(router_config(RouterKind::kSigmoidGroupTopK, 384, 6, true, 8, 4), bias, 33, 7);
}
TEST(RouteOp, SigmoidMaskedGroupsScoreZero) {
  // Strongly negative biases make every choice score negative, so masked experts (0.0) outrank the
  // chosen groups' experts: the reference's masked_fill(0.0) semantics must be kept.
  std::vector<float> bias(16, -3.0f);
  check_route(router_config(RouterKind::kSigmoidGroupTopK, 16, 4, true, 4, 2), bias, 8, 8);
}

TEST(GroupOp, EverySlotListedOnceUnderItsExpert) {
  const int n_slots = 700, E = 97;
  std::mt19937 rng(3);
  std::vector<int32_t> ids(n_slots);
  for (auto& i : ids) i = int32_t(rng() % E);
  std::vector<uint8_t> cold(E, 0);
  for (int e = 0; e < E; e += 5) cold[size_t(e)] = 1;
  DevBuf<int32_t> dids(ids), n_active(1), act_e(E), act_o(E), act_c(E), slots(n_slots), n_cold(1), cold_slots(n_slots);
  DevBuf<uint8_t> dcold(cold);
  cuda::MoeWork w{n_active.p, act_e.p, act_o.p, act_c.p, slots.p, n_cold.p, cold_slots.p};
  slots.poison();
  cuda::launch_group(dids.p, n_slots, E, dcold.p, w, nullptr);
  const int na = n_active.download()[0], nc = n_cold.download()[0];
  auto e_list = act_e.download(), o_list = act_o.download(), c_list = act_c.download(), s_list = slots.download();
  auto cs = cold_slots.download();
  std::set<int> seen;
  int hot_total = 0;
  for (int a = 0; a < na; ++a) {
    EXPECT_FALSE(cold[size_t(e_list[size_t(a)])]);
    EXPECT_EQ(o_list[size_t(a)], hot_total);
    for (int i = 0; i < c_list[size_t(a)]; ++i) {
      const int s = s_list[size_t(o_list[size_t(a)] + i)];
      EXPECT_EQ(ids[size_t(s)], e_list[size_t(a)]);
      EXPECT_TRUE(seen.insert(s).second);
    }
    hot_total += c_list[size_t(a)];
  }
  for (int i = 0; i < nc; ++i) {
    EXPECT_TRUE(cold[size_t(ids[size_t(cs[size_t(i)])])]);
    EXPECT_TRUE(seen.insert(cs[size_t(i)]).second);
  }
  EXPECT_EQ(int(seen.size()), n_slots);
}

// The fused route + group (decode steps of at most 32 rows) against route then group: the same ids
// and weights bit for bit, the same active-expert lists, and per expert the same set of slots (the
// order within one expert is free in both). n > 32 takes the two-launch path.
void check_route_group(const ModelConfig& c, const std::vector<float>& bias, int n, uint32_t seed) {
  const int E = int(c.n_expert), kS = int(c.n_expert_used) + 1, n_tot = E + 1, n_slots = n * kS;
  auto logits = test::random_floats(size_t(n) * E, seed, 2.0f);
  std::vector<uint8_t> cold(size_t(n_tot), 0);
  for (int e = 1; e < E; e += 3) cold[size_t(e)] = 1;
  DevBuf<float> dl(logits);
  DevBuf<uint8_t> dcold(cold);
  std::unique_ptr<DevBuf<float>> db;
  if (!bias.empty()) db = std::make_unique<DevBuf<float>>(bias);
  struct Out {
    DevBuf<int32_t> ids, n_active, act_e, act_o, act_c, slots, n_cold, cold_slots;
    DevBuf<float> wts;
    Out(int n_slots, int n_tot)
        : ids(size_t(n_slots)), n_active(1), act_e(size_t(n_tot)), act_o(size_t(n_tot)), act_c(size_t(n_tot)),
          slots(size_t(n_slots)), n_cold(1), cold_slots(size_t(n_slots)), wts(size_t(n_slots)) {
      ids.poison(), act_e.poison(), act_o.poison(), act_c.poison(), slots.poison(), cold_slots.poison(), wts.poison();
    }
    cuda::MoeWork work() { return {n_active.p, act_e.p, act_o.p, act_c.p, slots.p, n_cold.p, cold_slots.p}; }
  };
  Out ref(n_slots, n_tot), got(n_slots, n_tot);
  cuda::RouteArgs a;
  a.logits = dl.p, a.n = n, a.n_expert = E, a.k = int(c.n_expert_used);
  a.kind = c.router == RouterKind::kSoftmaxTopK ? cuda::RouteKind::kSoftmaxTopK : cuda::RouteKind::kSigmoidGroupTopK;
  a.norm_topk = c.norm_topk_prob, a.routed_scaling = c.routed_scaling_factor;
  a.n_group = int(c.n_group), a.topk_group = int(c.topk_group), a.bias = db ? db->p : nullptr;
  a.shared_slot = true;
  a.ids = ref.ids.p, a.weights = ref.wts.p;
  cuda::launch_route(a, nullptr);
  cuda::launch_group(ref.ids.p, n_slots, n_tot, dcold.p, ref.work(), nullptr);
  a.ids = got.ids.p, a.weights = got.wts.p;
  cuda::launch_route_group(a, n_tot, dcold.p, got.work(), nullptr);
  const auto ids = ref.ids.download();
  ASSERT_EQ(got.ids.download(), ids);
  const auto rw = ref.wts.download(), gw = got.wts.download();
  ASSERT_EQ(std::memcmp(rw.data(), gw.data(), rw.size() * 4), 0);
  const int na = ref.n_active.download()[0], nc = ref.n_cold.download()[0];
  ASSERT_EQ(got.n_active.download()[0], na);
  ASSERT_EQ(got.n_cold.download()[0], nc);
  auto head = [](const std::vector<int32_t>& v, int k) { return std::vector<int32_t>(v.begin(), v.begin() + k); };
  EXPECT_EQ(head(got.act_e.download(), na), head(ref.act_e.download(), na));
  EXPECT_EQ(head(got.act_o.download(), na), head(ref.act_o.download(), na));
  const auto counts = head(ref.act_c.download(), na), offs = head(ref.act_o.download(), na);
  EXPECT_EQ(head(got.act_c.download(), na), counts);
  auto rs = ref.slots.download(), gs = got.slots.download();
  for (int i = 0; i < na; ++i) {
    std::sort(rs.begin() + offs[size_t(i)], rs.begin() + offs[size_t(i)] + counts[size_t(i)]);
    std::sort(gs.begin() + offs[size_t(i)], gs.begin() + offs[size_t(i)] + counts[size_t(i)]);
  }
  const int hot = na ? offs[size_t(na - 1)] + counts[size_t(na - 1)] : 0;
  EXPECT_EQ(head(gs, hot), head(rs, hot));
  auto rc = head(ref.cold_slots.download(), nc), gc = head(got.cold_slots.download(), nc);
  std::sort(rc.begin(), rc.end());
  std::sort(gc.begin(), gc.end());
  EXPECT_EQ(gc, rc);
}

TEST(RouteGroupOp, FusedMatchesRouteThenGroup) {
  auto bias = test::random_floats(384, 11, 0.3f);
  const auto sig = router_config(RouterKind::kSigmoidGroupTopK, 384, 6, true, 8, 4);
  for (int n : {1, 2, 4, 5, 32, 33}) check_route_group(sig, bias, n, uint32_t(20 + n));
  const auto soft = router_config(RouterKind::kSoftmaxTopK, 64, 4, true, 1, 1);
  for (int n : {1, 6, 7, 32}) check_route_group(soft, {}, n, uint32_t(40 + n));
}

// Routed experts through gate_up / down / combine against run_experts_cpu, with the odd experts'
// weights in mapped pinned host memory (read over the link by the same kernels). H: hidden size (a
// width that is no multiple of expert_down's features per block leaves part of the last tile idle).
void check_experts(DType dt, bool host_lane, int H = 64) {
  const int E = 8, I = 48, n = 5, k = 3;
  std::vector<std::vector<float>> wf(size_t(3 * E));
  std::vector<std::vector<uint8_t>> wb(size_t(3 * E));
  std::vector<ExpertWeights> experts(E);
  std::vector<const void*> ptrs(size_t(3 * E));
  std::vector<void*> owned_dev, owned_host;
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < 3; ++j) {
      const size_t i = size_t(j) * E + e;
      const int64_t rows = j == 2 ? H : I, cols = j == 2 ? I : H;
      wf[i] = test::random_floats(size_t(rows * cols), uint32_t(100 + i), 0.2f);
      wb[i] = test::to_dtype(wf[i], dt);
      (j == 0 ? experts[size_t(e)].gate : j == 1 ? experts[size_t(e)].up : experts[size_t(e)].down) =
          view(wb[i], dt, rows, cols);
      void* p = nullptr;
      if (host_lane && e % 2) {
        TANDEM_CUDA_CHECK(cudaHostAlloc(&p, wb[i].size(), cudaHostAllocMapped));
        std::memcpy(p, wb[i].data(), wb[i].size());
        owned_host.push_back(p);
        void* dp = nullptr;
        TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dp, p, 0));
        ptrs[i] = dp;
      } else {
        TANDEM_CUDA_CHECK(cudaMalloc(&p, wb[i].size()));
        TANDEM_CUDA_CHECK(cudaMemcpy(p, wb[i].data(), wb[i].size(), cudaMemcpyHostToDevice));
        owned_dev.push_back(p);
        ptrs[i] = p;
      }
    }
  auto x = test::random_floats(size_t(n) * H, 21);
  std::vector<int32_t> ids(size_t(n) * k);
  std::vector<float> wts(size_t(n) * k);
  std::mt19937 rng(5);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < k; ++j) {
      ids[size_t(r) * k + j] = int32_t((r * 3 + j * 5 + rng() % 2) % E);
      wts[size_t(r) * k + j] = 0.1f + 0.3f * float(j);
    }
  std::vector<float> ref(size_t(n) * H);
  run_experts_cpu(experts, x.data(), n, H, ids.data(), wts.data(), k, ref.data(), global_pool());

  DevBuf<const void*> table(ptrs);
  DevBuf<int32_t> dids(ids), n_active(1), act_e(E), act_o(E), act_c(E), slots(ids.size()), n_cold(1), cold(ids.size());
  DevBuf<float> dx(x), dw(wts), h(ids.size() * I), slot_out(ids.size() * H), moe_out(size_t(n) * H),
      resid(std::vector<float>(size_t(n) * H, 1.0f));
  slot_out.poison();
  moe_out.poison();
  cuda::MoeWork w{n_active.p, act_e.p, act_o.p, act_c.p, slots.p, n_cold.p, cold.p};
  cuda::launch_group(dids.p, int(ids.size()), E, nullptr, w, nullptr);
  cuda::ExpertTable t{table.p, table.p + E, table.p + 2 * E, cuda::wtype_of(dt, "experts"), E, I, I, H};
  cuda::ExpertRun run;
  run.x = dx.p, run.n = n, run.slots_per_row = k, run.slot_weight = dw.p;
  run.h = h.p, run.h_stride = I, run.out = slot_out.p, run.max_active = E;
  const cuda::KernelPolicy defaults;
  cuda::launch_expert_gate_up(t, w, run, defaults, nullptr);
  cuda::launch_expert_down(t, w, run, defaults, nullptr);
  cuda::launch_moe_combine(slot_out.p, n, k, H, moe_out.p, resid.p, nullptr);
  const auto out = moe_out.download();
  EXPECT_LT(test::rel_err(out, ref), 1e-5);
  auto rs = resid.download();
  for (size_t i = 0; i < rs.size(); ++i) ASSERT_NEAR(rs[i], 1.0f + ref[i], 1e-4);
  // Every rows-per-pass policy gives the same bits (an expert's 1..5 rows in passes of 1, 2, 4 or 8).
  for (const int rows : {8, 4, 2, 1}) {
    cuda::KernelPolicy p;
    p.expert_max_rows = rows;
    slot_out.poison();
    moe_out.poison();
    cuda::launch_expert_gate_up(t, w, run, p, nullptr);
    cuda::launch_expert_down(t, w, run, p, nullptr);
    cuda::launch_moe_combine(slot_out.p, n, k, H, moe_out.p, resid.p, nullptr);
    const auto again = moe_out.download();
    ASSERT_EQ(0, std::memcmp(again.data(), out.data(), out.size() * sizeof(float))) << "rows per pass " << rows;
  }
  for (void* p : owned_dev) cudaFree(p);
  for (void* p : owned_host) cudaFreeHost(p);
}

TEST(ExpertOp, Bf16InHbm) { check_experts(DType::kBF16, false); }
TEST(ExpertOp, F32InHbm) { check_experts(DType::kF32, false); }
TEST(ExpertOp, Bf16HalfInPinnedHostMemory) { check_experts(DType::kBF16, true); }
TEST(ExpertOp, F16HalfInPinnedHostMemory) { check_experts(DType::kF16, true); }
TEST(ExpertOp, Bf16HiddenNotAMultipleOfTheTile) { check_experts(DType::kBF16, false, 72); }  // vector loads
TEST(ExpertOp, F32HiddenNotAMultipleOfFour) { check_experts(DType::kF32, false, 70); }       // scalar loop

}  // namespace
}  // namespace tandem
#endif
