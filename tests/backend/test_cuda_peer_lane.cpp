// The CUDA engine's peer lane against a real `tandem peer` process: the oracle fixtures through the
// lane at 1e-4 with the local lane's greedy tokens (graphs on: the handoffs run inside replays), the
// check gate, a slowed peer with a 1 µs spin limit (same tokens, overruns counted), a frozen peer under
// the watchdog (the request fails naming the cause, no token after, segment gone) and a foreign rowmap
// (refused, exit 2). The tandem binary comes from TANDEM_BIN when set (the device machine), else the build.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include "lane_tools/negated_peer.h"
#include "peer_lane_util.h"

namespace tandem {
namespace {

using test::expect_same_generation;
using test::greedy;
using test::make_rowmap;
using test::Peer;
using test::peer_options;
using test::run_bin;
using test::segment_exists;
using test::split_options;
using test::unique_lane;

// (fixture, split lane?)
class CudaPeerOracle : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  test::TempDir tmp;
};

TEST_P(CudaPeerOracle, SameFunctionAsTheLocalLane) {
  const auto& [fixture, split] = GetParam();
  test::expect_lane_matches_local(fixture, split, {}, "", tmp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPeerOracle, test::fixtures_whole_and_split(),
                         test::FixtureSplitName{"_peer"});

TEST(CudaSplitLane, PeerAndPrimaryCuttingDifferentlyRefuseEachOther) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  rm.save(tmp.file("rowmap.json"));
  const std::string lane = unique_lane("cut");
  Peer peer(dir, tmp.file("rowmap.json"), lane, tmp, {"--split-share", "0.5"});  // cuts at 16 of 32
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  CudaOptions o = split_options(rm, *model, lane, 0.25);              // cuts at 8
  o.peer_attach_timeout_s = 5;
  try {
    make_cuda_engine(*model, {}, o);
    ADD_FAILURE() << "attached to a peer that cuts the experts elsewhere";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the peer cuts each cold expert at intermediate feature 16"), std::string::npos) << m;
    EXPECT_NE(m.find("this primary cuts each cold expert at intermediate feature 8"), std::string::npos) << m;
  }
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 2) << test::read_file(peer.log);  // refused, as for a foreign rowmap
}

// The check gate is a gate on a CUDA primary too: a peer whose rows are negated behind a matching
// handshake trips the lane at the first checked step (cause check_failed), before any token.
TEST(CudaPeerLane, CheckGateBelowTheBarTripsTheLane) {
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  const std::string lane = unique_lane("gate");
  test::NegatedPeer wrong(*model, rm, lane);
  {
    CudaOptions o = peer_options(rm, *model, lane);
    o.peer_check = 1;  // check_min stays at its default, 0.999
    auto engine = make_cuda_engine(*model, {}, o);
    test::expect_check_gate_trips(*engine);
  }
  EXPECT_EQ(wrong.join(), peer::ServeEnd::kTripped);
}

TEST(CudaPeerLane, SlowPeerWithSpinLimitOneGivesTheSameTokensAndCountsOverruns) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  rm.save(tmp.file("rowmap.json"));
  auto local = make_cuda_engine(*model, {}, {});
  const auto ref = greedy(*local);
  const std::string lane = unique_lane("slow");
  Peer peer(dir, tmp.file("rowmap.json"), lane, tmp, {"--delay-us", "2000"});
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  CudaOptions o = peer_options(rm, *model, lane);
  o.peer_spin_limit_us = 1;
  auto engine = make_cuda_engine(*model, {}, o);
  expect_same_generation(greedy(*engine), ref);
  auto st = cuda_peer_stats(*engine);
  ASSERT_TRUE(st.has_value());
  EXPECT_GT(st->client.overruns, 0u);
  EXPECT_EQ(st->client.overruns, st->client.handoffs);  // each answer came 2 ms late
  EXPECT_GE(st->client.wait_ns_max, 2'000'000u);
}

TEST(CudaPeerLane, AttachFailuresAreInputErrors) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  CudaOptions o = peer_options(rm, *model, unique_lane("absent"));
  o.peer_attach_timeout_s = 0.2;
  EXPECT_THROW(make_cuda_engine(*model, {}, o), InputError);  // no such lane
  o.peer = "";
  EXPECT_THROW(make_cuda_engine(*model, {}, o), InputError);
}

class CudaPeerCli : public test::TinyLaneModel {};

TEST_F(CudaPeerCli, ForeignRowmapIsRefusedByBothSides) {
  const std::string lane = unique_lane("foreign");
  const std::string other = tmp.file("other.rowmap.json");
  make_rowmap(model_, [](int64_t, int64_t e) { return e % 4 == 0; }).save(other);
  Peer peer(model_, rowmap_, lane, tmp);
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  auto r = run_bin({"generate", "--model", model_, "--prompt", "hello", "--max-tokens", "4", "--device", "cuda",
                    "--lane", "peer", "--peer", lane, "--rowmap", other},
                   tmp);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("fingerprint mismatch"), std::string::npos) << r.err;
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 2) << test::read_file(peer.log);
  EXPECT_FALSE(segment_exists(lane));
}

// `--lane split` without --split-share (auto) takes the cut its peer published: a peer that chose it with
// --split-share auto gives the local lane's greedy tokens; a peer of whole experts is named, and left
// serving (the primary only peeked at its header).
TEST_F(CudaPeerCli, SplitPrimaryTakesTheCutItsPeerChose) {
  auto tokens_of = [](const std::string& out) {
    return nlohmann::json::parse(out)["results"][0]["tokens"].get<std::vector<int32_t>>();
  };
  const std::vector<std::string> gen = {"generate", "--model", model_, "--prompt", "cold experts, cut in two",
                                        "--max-tokens", "16", "--ignore-eos", "--json", "--device", "cuda"};
  auto through_split = [&](const std::string& lane) {
    auto args = gen;
    args.insert(args.end(), {"--lane", "split", "--peer", lane, "--rowmap", rowmap_});
    return run_bin(args, tmp);
  };
  auto local = run_bin(gen, tmp);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  {
    const std::string lane = unique_lane("whole");
    Peer whole(model_, rowmap_, lane, tmp);
    ASSERT_TRUE(whole.wait_serving()) << test::read_file(whole.log);
    auto r = through_split(lane);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("its peer computes whole cold experts"), std::string::npos) << r.err;
    EXPECT_FALSE(test::try_reap(whole.child)) << test::read_file(whole.log);
  }
  const std::string lane = unique_lane("auto");
  Peer peer(model_, rowmap_, lane, tmp, {"--split-share", "auto", "--link-gbps", "30", "--dram-gbps", "90"});
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  auto r = through_split(lane);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cuts each cold expert at feature 8 of 32"), std::string::npos) << r.err;
  EXPECT_EQ(tokens_of(r.out), tokens_of(local.out));
}

TEST_F(CudaPeerCli, FrozenPeerTripsTheWatchdogAndTheGpuRequestFailsDark) {
  test::expect_fault_fails_dark(model_, rowmap_, unique_lane("frozen"), "cuda", {}, SIGSTOP, "stall", tmp);
}

}  // namespace
}  // namespace tandem
#endif
