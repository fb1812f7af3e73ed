// A GPU as the peer (`tandem peer --device cuda`): GpuColdExperts against the CPU peer's ColdExperts on
// every oracle fixture (whole experts and the split lane's share; random rows, empty slots, rows with
// nothing cold); a CUDA primary and a GPU peer as two processes on one GPU giving the local lane's
// tokens and logits; a CPU primary with a GPU peer (`tandem verify` / `tandem generate --lane peer`);
// a frozen or killed GPU peer under the watchdog, behind either primary: the request fails naming the
// cause and no token follows the fault.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

#include "backends/cuda/gpu_cold_experts.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "peer/cold_experts.h"
#include "peer_lane_util.h"

namespace tandem {
namespace {

using test::make_rowmap;
using test::Peer;
using test::run_bin;
using test::segment_exists;
using test::unique_lane;

constexpr int64_t kMaxRows = 24;

// One request on `layer`: rows with 1..k cold slots (the rest empty), and every fourth row with no
// cold slot at all, whose x and gate weights are NaN (a GPU primary sends no x for such rows, and an
// empty slot's weight is never validated): those rows must come back as exact zeros.
struct Request {
  std::vector<float> x, weights;
  std::vector<int32_t> ids;
};
Request random_request(const std::vector<int32_t>& cold, int64_t n_rows, int64_t k, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  Request q;
  q.x = test::random_floats(size_t(n_rows * hidden), seed);
  q.ids.assign(size_t(n_rows * k), -1);
  q.weights.assign(size_t(n_rows * k), NAN);
  std::uniform_real_distribution<float> w(0.05f, 1.0f);
  for (int64_t r = 0; r < n_rows; ++r) {
    if (r % 4 == 3 || cold.empty()) {
      std::fill(q.x.begin() + r * hidden, q.x.begin() + (r + 1) * hidden, NAN);
      continue;
    }
    const int64_t used = 1 + int64_t(rng() % uint32_t(k));
    for (int64_t j = 0; j < used; ++j) {
      const int64_t slot = r * k + int64_t(rng() % uint32_t(k));  // may land on a slot already set: fine
      q.ids[size_t(slot)] = cold[rng() % cold.size()];
      q.weights[size_t(slot)] = w(rng);
    }
  }
  return q;
}

// (fixture, split lane?)
class GpuColdExpertsVsCpu : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(GpuColdExpertsVsCpu, SameRowsOnEveryLayer) {
  const auto& [fixture, split] = GetParam();
  const std::string dir = test::oracle_dir(fixture);
  const Rowmap rm = make_rowmap(dir, [](int64_t l, int64_t e) { return (e + l) % 3 == 0; });
  auto model = Model::load(dir, [&](int64_t l, int64_t e) { return rm.is_cold(l, int32_t(e)); });
  const auto& c = model->cfg;
  const int64_t split_begin = split ? split_column(c.moe_intermediate_size, 0.5) : 0;
  ThreadPool pool(2);
  ColdExperts cpu(*model, rm, pool, split_begin);
  cuda::GpuColdExperts gpu(*model, rm, 0, kMaxRows, split_begin);
  ASSERT_EQ(gpu.n_layers(), cpu.n_layers());
  ASSERT_EQ(gpu.n_experts(), cpu.n_experts());
  EXPECT_EQ(gpu.n_cold(), cpu.n_cold());
  EXPECT_GE(gpu.bytes_held(), cpu.bytes_held());  // the same bytes, slices 16-byte aligned
  const int64_t H = c.hidden_size;
  uint32_t seed = 1;
  for (int layer = 0; layer < gpu.n_layers(); ++layer) {
    std::vector<int32_t> cold;
    for (int e = 0; e < gpu.n_experts(); ++e) {
      ASSERT_EQ(gpu.is_cold(layer, e), cpu.is_cold(layer, e)) << layer << "/" << e;
      if (gpu.is_cold(layer, e)) cold.push_back(e);
    }
    for (int64_t n_rows : {int64_t(1), int64_t(5), kMaxRows}) {
      for (int64_t k : {c.n_expert_used, int64_t(1)}) {
        SCOPED_TRACE(fmt::format("layer {} rows {} k {}", layer, n_rows, k));
        const Request q = random_request(cold, n_rows, k, H, seed++);
        std::vector<float> want(size_t(n_rows * H)), got(size_t(n_rows * H), NAN);
        cpu.compute(layer, q.x.data(), n_rows, q.ids.data(), q.weights.data(), k, want.data());
        gpu.compute(layer, q.x.data(), n_rows, q.ids.data(), q.weights.data(), k, got.data());
        for (int64_t r = 3; r < n_rows; r += 4)
          for (int64_t i = 0; i < H; ++i) ASSERT_EQ(got[size_t(r * H + i)], 0.0f) << "row " << r << " has no cold slot";
        // Both sides widen the same weights to f32 and accumulate in f32; only the summation order
        // differs (rows grouped per expert vs slot order), far below 1e-4 of the largest value.
        EXPECT_LE(test::rel_err(got, want), 1e-4);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuColdExpertsVsCpu, test::fixtures_whole_and_split(),
                         test::FixtureSplitName{"_whole"});

TEST(GpuColdExperts, RequestsPastTheReservationAreErrorsAndBadDevicesRefused) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 0; });
  auto model = Model::load(dir);
  EXPECT_THROW((void)cuda::GpuColdExperts(*model, rm, 99, kMaxRows), InputError);
  EXPECT_THROW((void)cuda::GpuColdExperts(*model, rm, 0, 1 << 20), InputError);  // more slots than grouping holds
  cuda::GpuColdExperts gpu(*model, rm, 0, 2);
  std::vector<float> x(size_t(3 * model->cfg.hidden_size)), out(x.size()), w(size_t(3 * model->cfg.n_expert_used));
  std::vector<int32_t> ids(w.size(), -1);
  EXPECT_THROW(gpu.compute(1, x.data(), 3, ids.data(), w.data(), model->cfg.n_expert_used, out.data()), InputError);
}

// A CUDA primary and a GPU peer: two processes on the one GPU.
class GpuPeerOracle : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  test::TempDir tmp;
};

TEST_P(GpuPeerOracle, CudaPrimaryGivesTheLocalLanesTokensAndLogits) {
  const auto& [fixture, split] = GetParam();
  test::expect_lane_matches_local(fixture, split, {"--device", "cuda"}, "G", tmp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuPeerOracle, test::fixtures_whole_and_split(),
                         test::FixtureSplitName{"_peer"});

std::vector<int32_t> tokens_of(const std::string& json_out) {
  return nlohmann::json::parse(json_out)["results"][0]["tokens"].get<std::vector<int32_t>>();
}

TEST(GpuPeerCpuPrimary, VerifyPassesAndGreedyTokensMatchTheLocalLane) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("mixtral_bf16");
  const std::string rm = tmp.file("rowmap.json");
  make_rowmap(dir, [](int64_t, int64_t e) { return e % 3 == 0; }).save(rm);
  const std::vector<std::string> gen = {"generate", "--model",  dir,   "--prompt-ids", "5,17,99,3", "--max-tokens", "8",
                                        "--json",   "--ignore-eos", "--threads", "2"};
  auto local = run_bin(gen, tmp);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = unique_lane("cpuprim");
  {
    Peer peer(dir, rm, lane, tmp, {"--device", "cuda"});
    ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
    EXPECT_NE(test::read_file(peer.log).find("in the HBM of cuda:0"), std::string::npos) << test::read_file(peer.log);
    auto r = run_bin({"verify", "--model", dir, "--expected", dir + "/expected.safetensors", "--lane", "peer", "--peer",
                      lane, "--rowmap", rm, "--threads", "2"},
                     tmp);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("verify: PASS"), std::string::npos) << r.out;
    ASSERT_TRUE(test::wait_exit(peer.child, 10));  // the primary closed the lane
    EXPECT_EQ(peer.child.exit_code, 0) << test::read_file(peer.log);
    EXPECT_FALSE(segment_exists(lane));
  }
  const std::string lane2 = lane + "g";
  Peer peer(dir, rm, lane2, tmp, {"--device", "cuda"});
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  std::vector<std::string> remote = gen;
  remote.insert(remote.end(), {"--lane", "peer", "--peer", lane2, "--rowmap", rm});
  auto r = run_bin(remote, tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tokens_of(r.out), tokens_of(local.out));
}

// Faults with a GPU peer behind a CUDA or a CPU primary, on a synthetic model.
class GpuPeerFaults : public test::TinyLaneModel {
 protected:
  const std::vector<std::string> gpu_peer_ = {"--device", "cuda"};
};

TEST_F(GpuPeerFaults, FrozenPeerBehindACudaPrimaryTripsAndTheRequestFailsDark) {
  test::expect_fault_fails_dark(model_, rowmap_, unique_lane("frozen-g"), "cuda", gpu_peer_, SIGSTOP, "stall", tmp);
}

TEST_F(GpuPeerFaults, KilledPeerBehindACudaPrimaryTripsAndTheRequestFailsDark) {
  test::expect_fault_fails_dark(model_, rowmap_, unique_lane("killed-g"), "cuda", gpu_peer_, SIGKILL, "peer_gone", tmp);
}

TEST_F(GpuPeerFaults, FrozenPeerBehindACpuPrimaryTripsAndTheRequestFailsDark) {
  test::expect_fault_fails_dark(model_, rowmap_, unique_lane("frozen-c"), "cpu", gpu_peer_, SIGSTOP, "stall", tmp);
}

TEST_F(GpuPeerFaults, KilledPeerBehindACpuPrimaryTripsAndTheRequestFailsDark) {
  test::expect_fault_fails_dark(model_, rowmap_, unique_lane("killed-c"), "cpu", gpu_peer_, SIGKILL, "peer_gone", tmp);
}

}  // namespace
}  // namespace tandem
#endif
