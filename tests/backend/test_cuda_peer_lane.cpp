// The CUDA engine's peer lane against a real `tandem peer` process: the oracle fixtures through the
// lane at 1e-4 with the local lane's greedy tokens (graphs on: the handoffs run inside replays), the
// check gate, a slowed peer with a 1 µs spin limit (same tokens, overruns counted), a frozen peer under
// the watchdog (the request fails naming the cause, no token after, segment gone) and a foreign rowmap
// (refused, exit 2). The tandem binary comes from TANDEM_BIN when set (the device machine), else the build.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "../lane_tools/process.h"
#include "../lane_tools/rowmap_util.h"
#include "backends/cuda/cuda_engine.h"
#include "engine/generate.h"
#include "engine/verify.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "moe/experts.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::make_rowmap;
using test::Child;

std::string tandem_bin() {
  const char* env = std::getenv("TANDEM_BIN");
  return env ? env : test::tandem_binary();
}

test::CommandResult run_bin(const std::vector<std::string>& args, const test::TempDir& tmp) {
  std::vector<std::string> full = {tandem_bin()};
  full.insert(full.end(), args.begin(), args.end());
  Child c = test::spawn(full, tmp.file("run.out"), tmp.file("run.err"));
  test::wait_exit(c, 120);
  return {c.exit_code, test::read_file(tmp.file("run.out")), test::read_file(tmp.file("run.err"))};
}

std::string unique_lane(const char* what) { return fmt::format("gp-{}-{}", getpid(), what); }
bool segment_exists(const std::string& lane) { return std::filesystem::exists("/dev/shm/tandem-" + lane); }

struct Peer {
  Child child;
  std::string log;
  Peer(const std::string& model, const std::string& rowmap, const std::string& lane, const test::TempDir& tmp,
       std::vector<std::string> extra = {}) {
    log = tmp.file("peer-" + lane + ".log");
    std::vector<std::string> args = {tandem_bin(), "peer",      "--model", model, "--rowmap", rowmap, "--lane",
                                     lane,         "--threads", "2",       "--spin-us", "1000000000"};
    args.insert(args.end(), extra.begin(), extra.end());
    child = test::spawn(args, tmp.file("peer-" + lane + ".out"), log);
  }
  bool wait_serving() {
    return test::wait_until(
               [&] { return test::read_file(log).find("serving") != std::string::npos || test::try_reap(child); },
               60) &&
           !child.reaped;
  }
  ~Peer() {
    if (!child.reaped) {
      kill(child.pid, SIGCONT);
      kill(child.pid, SIGTERM);
      test::wait_exit(child, 10);
    }
  }
};

CudaOptions peer_options(const Rowmap& rm, const ModelConfig& cfg, const std::string& lane) {
  CudaOptions o;
  o.lane = CudaLane::kPeer;
  o.cold.assign(size_t(cfg.n_layer), {});
  for (const auto& l : rm.layers) o.cold[size_t(l.layer)] = l.cold;
  o.peer = lane;
  o.peer_fingerprint = lane_fingerprint(rm);
  o.peer_spin_limit_us = 100000;
  return o;
}

std::vector<GenerateResult> greedy(Engine& e) {
  std::vector<GenerateRequest> reqs;
  for (auto p : {std::vector<int32_t>{5, 17, 99, 3, 250, 7, 8}, std::vector<int32_t>{42}, std::vector<int32_t>{300, 301}}) {
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = 6;
    reqs.push_back(r);
  }
  GenerateOptions o;
  o.keep_logits = true;
  return generate(e, reqs, o);
}

void expect_same_generation(const std::vector<GenerateResult>& got, const std::vector<GenerateResult>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size());
    EXPECT_LT(max_rel_err(got[i].logits.data(), ref[i].logits.data(), int64_t(ref[i].logits.size())), 1e-4);
  }
}

// The split lane: each cold expert's first features read over PCIe by the GPU, the rest computed by a
// `tandem peer --split-share 0.5`; the sum is the local lane's function.
CudaOptions split_options(const Rowmap& rm, const ModelConfig& cfg, const std::string& lane, double fraction) {
  CudaOptions o = peer_options(rm, cfg, lane);
  o.lane = CudaLane::kSplit;
  o.split_begin = split_column(cfg.moe_intermediate_size, fraction);
  o.peer_fingerprint = lane_fingerprint(rm, o.split_begin);
  return o;
}

// (fixture, split lane?)
class CudaPeerOracle : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  test::TempDir tmp;
};

TEST_P(CudaPeerOracle, SameFunctionAsTheLocalLane) {
  const auto& [fixture, split] = GetParam();
  const std::string dir = test::oracle_dir(fixture);
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 3 == 0; });
  const std::string rm_path = tmp.file("rowmap.json");
  rm.save(rm_path);
  auto options = [&](const std::string& lane) {
    return split ? split_options(rm, model->cfg, lane, 0.5) : peer_options(rm, model->cfg, lane);
  };
  const std::vector<std::string> peer_args =
      split ? std::vector<std::string>{"--split-share", "0.5"} : std::vector<std::string>{};
  auto local = make_cuda_engine(*model, {}, {});
  const auto ref = greedy(*local);
  const std::string lane = unique_lane(((split ? "s" : "p") + fixture.substr(0, 7)).c_str());
  Peer peer(dir, rm_path, lane, tmp, peer_args);
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  {
    CudaOptions o = options(lane);
    o.peer_check = 1;  // every step eager and checked on the CPU
    auto engine = make_cuda_engine(*model, {}, o);
    auto checks = verify_against(*engine, dir + "/expected.safetensors");
    ASSERT_GE(checks.size(), 4u);
    for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << " max_rel_err " << c.max_rel_err;
    auto st = cuda_peer_stats(*engine);
    ASSERT_TRUE(st.has_value());
    EXPECT_GT(st->client.handoffs, 0u);
    EXPECT_GT(st->cold_slots, 0u);
    int64_t checked = 0;
    for (const auto& c : st->checks) {
      checked += c.checks;
      if (c.checks) {
        EXPECT_GE(c.min_cosine, 0.999);
      }
    }
    EXPECT_GT(checked, 0);
  }
  // The engine closed the lane: the peer exits 0 and removes the segment; a new peer serves graphs.
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 0) << test::read_file(peer.log);
  EXPECT_FALSE(segment_exists(lane));
  const std::string lane2 = lane + "g";
  Peer peer2(dir, rm_path, lane2, tmp, peer_args);
  ASSERT_TRUE(peer2.wait_serving()) << test::read_file(peer2.log);
  auto engine = make_cuda_engine(*model, {}, options(lane2));
  expect_same_generation(greedy(*engine), ref);
  expect_same_generation(greedy(*engine), ref);  // replays of captured graphs
  auto st = cuda_peer_stats(*engine);
  EXPECT_EQ(st->client.overruns, 0u);
  EXPECT_GT(st->client.handoffs, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPeerOracle,
                         ::testing::Combine(::testing::Values("qwen3moe_f32", "mixtral_bf16", "olmoe_f32",
                                                              "deepseekv3_f32"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_split" : "_peer");
                         });

TEST(CudaSplitLane, PeerAndPrimaryCuttingDifferentlyRefuseEachOther) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 2 == 1; });
  rm.save(tmp.file("rowmap.json"));
  const std::string lane = unique_lane("cut");
  Peer peer(dir, tmp.file("rowmap.json"), lane, tmp, {"--split-share", "0.5"});  // cuts at 16 of 32
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  CudaOptions o = split_options(rm, model->cfg, lane, 0.25);              // cuts at 8
  o.peer_attach_timeout_s = 5;
  try {
    make_cuda_engine(*model, {}, o);
    ADD_FAILURE() << "attached to a peer that cuts the experts elsewhere";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fingerprint"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 2) << test::read_file(peer.log);  // refused, as for a foreign rowmap
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
  CudaOptions o = peer_options(rm, model->cfg, lane);
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
  CudaOptions o = peer_options(rm, model->cfg, unique_lane("absent"));
  o.peer_attach_timeout_s = 0.2;
  EXPECT_THROW(make_cuda_engine(*model, {}, o), InputError);  // no such lane
  o.peer = "";
  EXPECT_THROW(make_cuda_engine(*model, {}, o), InputError);
}

class CudaPeerCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    model_ = tmp_->path + "/tiny";
    auto r = run_bin({"synth", "--preset", "tiny", "--out", model_, "--seed", "3"}, *tmp_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rowmap_ = tmp_->path + "/tiny.rowmap.json";
    make_rowmap(model_, [](int64_t, int64_t e) { return e % 3 == 1; }).save(rowmap_);
  }
  static void TearDownTestSuite() { delete tmp_; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline std::string model_, rowmap_;
  test::TempDir tmp;
};

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

TEST_F(CudaPeerCli, FrozenPeerTripsTheWatchdogAndTheGpuRequestFailsDark) {
  const std::string lane = unique_lane("frozen");
  Peer peer(model_, rowmap_, lane, tmp, {"--delay-us", "2000"});  // slow enough to freeze mid-run
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  Child wd = test::spawn({tandem_bin(), "watchdog", "--lane", lane, "--stall", "1", "--mode", "enforce"},
                         tmp.file("wd.out"), tmp.file("wd.err"));
  Child primary = test::spawn({tandem_bin(), "generate", "--model", model_, "--prompt", "Once upon a time",
                               "--max-tokens", "2000", "--ignore-eos", "--show-special", "--device", "cuda", "--lane", "peer",
                               "--peer", lane, "--rowmap", rowmap_},
                              tmp.file("p.out"), tmp.file("p.err"));
  ASSERT_TRUE(test::wait_until([&] { return test::read_file(tmp.file("p.out")).size() > 20; }, 60))
      << test::read_file(tmp.file("p.err"));
  kill(peer.child.pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a step already answered may finish
  const size_t at_fault = test::read_file(tmp.file("p.out")).size();
  EXPECT_TRUE(test::wait_exit(wd, 30));
  EXPECT_TRUE(test::wait_exit(primary, 30));
  const std::string err = test::read_file(tmp.file("p.err"));
  EXPECT_EQ(wd.exit_code, 1) << test::read_file(tmp.file("wd.out"));
  EXPECT_NE(primary.exit_code, 0);
  EXPECT_EQ(test::read_file(tmp.file("p.out")).size(), at_fault) << "tokens printed after the freeze";
  EXPECT_NE(err.find("stall"), std::string::npos) << err;
  EXPECT_FALSE(segment_exists(lane));
}

}  // namespace
}  // namespace tandem
#endif
