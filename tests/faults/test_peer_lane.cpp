// The sidecar lane end to end with the real binaries: `tandem peer` serving a rowmap's cold experts,
// `tandem generate/verify --lane peer` as the primary, `tandem watchdog`. Same answers as the local
// lane; and under faults (frozen or killed peer, foreign rowmap, slow peer, killed primary) nothing
// wrong is returned.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../lane_tools/peer_child.h"
#include "../lane_tools/process.h"
#include "../lane_tools/rowmap_util.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "moe/experts.h"
#include "peer/client.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::Child;
using test::write_rowmap;

std::string unique_lane(const char* what) { return fmt::format("lt-{}-{}", getpid(), what); }

// The number ([0-9.]+) right after the first `marker` in `text`, or right before it; "" when absent.
// (Plain string scans: <regex> drew -Wmaybe-uninitialized warnings from libstdc++ in the ASan build.)
std::string number_after(const std::string& text, const std::string& marker) {
  size_t at = text.find(marker);
  if (at == std::string::npos) return "";
  at += marker.size();
  size_t end = text.find_first_not_of("0123456789.", at);
  return text.substr(at, (end == std::string::npos ? text.size() : end) - at);
}
std::string number_before(const std::string& text, const std::string& marker) {
  size_t at = text.find(marker);
  if (at == std::string::npos) return "";
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  return text.substr(begin, at - begin);
}
bool segment_exists(const std::string& lane) { return std::filesystem::exists("/dev/shm/tandem-" + lane); }

using Peer = test::PeerChild;

class PeerLane : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    model_ = tmp_->path + "/tiny";
    auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", model_, "--seed", "3"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rowmap_ = tmp_->path + "/tiny.rowmap.json";
    // A third of the experts of every layer on the peer (ids 1, 4, 7, ...).
    write_rowmap(model_, rowmap_, [](int64_t, int64_t e) { return e % 3 == 1; });
  }
  static void TearDownTestSuite() { delete tmp_; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline std::string model_, rowmap_;
  test::TempDir tmp;

  std::vector<int32_t> tokens_of(const std::string& json_out) {
    auto j = nlohmann::json::parse(json_out);
    return j["results"][0]["tokens"].get<std::vector<int32_t>>();
  }
};

TEST_F(PeerLane, OracleFixturesPassThroughThePeer) {
  for (const char* name : {"qwen3moe_f32", "mixtral_bf16", "olmoe_f32", "deepseekv3_f32"}) {
    SCOPED_TRACE(name);
    const std::string dir = test::oracle_dir(name);
    const std::string rm = tmp.file(std::string(name) + ".rowmap.json");
    write_rowmap(dir, rm, [](int64_t, int64_t e) { return e % 3 == 0; });  // >= 1/3 of each layer's experts
    const std::string lane = unique_lane(name);
    Peer peer(dir, rm, lane, tmp);
    ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
    auto r = test::run_tandem({"verify", "--model", dir, "--expected", dir + "/expected.safetensors", "--lane", "peer",
                               "--peer", lane, "--rowmap", rm, "--threads", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("verify: PASS"), std::string::npos) << r.out;
    // The primary closing the lane stops the peer, which removes the segment.
    ASSERT_TRUE(test::wait_exit(peer.child, 10));
    EXPECT_EQ(peer.child.exit_code, 0) << test::read_file(peer.log);
    EXPECT_FALSE(segment_exists(lane));
  }
}

TEST_F(PeerLane, SameGreedyTokensAsLocalAndHoldsOnlyColdBytes) {
  const std::string prompt = "The sidecar keeps the cold experts; only activations cross between the devices.";
  auto local = test::run_tandem({"generate", "--model", model_, "--prompt", prompt, "--max-tokens", "24", "--json",
                                 "--ignore-eos", "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = unique_lane("greedy");
  Peer peer(model_, rowmap_, lane, tmp);
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  auto remote = test::run_tandem({"generate", "--model", model_, "--prompt", prompt, "--max-tokens", "24", "--json",
                                  "--ignore-eos", "--lane", "peer", "--peer", lane, "--rowmap", rowmap_, "--threads", "1"});
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_EQ(tokens_of(local.out), tokens_of(remote.out));
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  // Held bytes = cold experts x bytes per expert: tiny has 3 MoE layers x 32 experts, ids 1,4,...,31
  // cold (11 per layer); an expert is 3 x [32, 64] bf16 = 12288 bytes.
  std::string log = test::read_file(peer.log);
  const std::string n_cold = number_before(log, " cold experts in 3 layers, ");
  const std::string held = number_after(log, " held (");
  ASSERT_FALSE(n_cold.empty() || held.empty()) << log;
  EXPECT_EQ(std::stoll(n_cold), 3 * 11);
  EXPECT_EQ(std::stoll(held), 3 * 11 * 12288);
  EXPECT_NE(log.find(" held (405504 bytes)"), std::string::npos) << log;  // the unit is said
}

TEST_F(PeerLane, LaneCommandShowsTheCounters) {
  const std::string lane = unique_lane("status");
  Peer peer(model_, rowmap_, lane, tmp);
  ASSERT_TRUE(peer.wait_serving());
  auto r = test::run_tandem({"lane", "--lane", lane, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["state"], "serving");
  EXPECT_EQ(j["handoffs"], 0);
  EXPECT_EQ(j["peer_pid"], peer.child.pid);
  auto missing = test::run_tandem({"lane", "--lane", unique_lane("nobody")});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
}

TEST_F(PeerLane, ForeignRowmapIsRefusedByBothSides) {
  const std::string other = tmp.file("other.rowmap.json");
  write_rowmap(model_, other, [](int64_t, int64_t e) { return e % 4 == 0; });
  const std::string lane = unique_lane("foreign");
  Peer peer(model_, rowmap_, lane, tmp);
  ASSERT_TRUE(peer.wait_serving());
  auto r = test::run_tandem({"generate", "--model", model_, "--prompt-ids", "5,6,7", "--max-tokens", "4", "--lane",
                             "peer", "--peer", lane, "--rowmap", other, "--threads", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("fingerprint"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_TRUE(test::wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 2) << test::read_file(peer.log);
  EXPECT_FALSE(segment_exists(lane));
  // A rowmap of another model is refused when the peer loads it.
  auto bad = test::run_tandem({"peer", "--model", test::oracle_dir("qwen3moe_f32"), "--rowmap", rowmap_, "--lane",
                               unique_lane("foreign2")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("fp1:"), std::string::npos) << bad.err;
}

// `tandem peer --split-share auto` cuts each cold expert where the link's part and the DRAM's part take
// equally long, from the bandwidths given or measured, and publishes the cut in its header; a primary
// of the peer lane (whole experts) is refused by both sides with a message naming both cuts.
TEST_F(PeerLane, SplitShareAutoPublishesItsCutAndAWholeExpertPrimaryIsRefused) {
  const int64_t inter = load_config(model_).moe_intermediate_size;
  {
    const std::string lane = unique_lane("auto-given");
    Peer peer(model_, rowmap_, lane, tmp, {"--split-share", "auto", "--link-gbps", "30", "--dram-gbps", "90"});
    ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
    EXPECT_NE(test::read_file(peer.log).find("0.250 of each cold expert over the link"), std::string::npos)
        << test::read_file(peer.log);
    const int64_t cut = split_column(inter, 0.25);
    EXPECT_EQ(int64_t(peer::peek_geometry(lane, 5).split_column), cut);
    auto r = test::run_tandem({"generate", "--model", model_, "--prompt-ids", "5,6,7", "--max-tokens", "4", "--lane",
                               "peer", "--peer", lane, "--rowmap", rowmap_, "--threads", "1"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(fmt::format("the peer cuts each cold expert at intermediate feature {}", cut)),
              std::string::npos)
        << r.err;
    ASSERT_TRUE(test::wait_exit(peer.child, 10));
    EXPECT_EQ(peer.child.exit_code, 2) << test::read_file(peer.log);
    EXPECT_FALSE(segment_exists(lane));
  }
  // The DRAM measured (1 thread): the cut follows the figure the peer logs.
  const std::string lane = unique_lane("auto-measured");
  Peer peer(model_, rowmap_, lane, tmp, {"--split-share", "auto", "--link-gbps", "30"});
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  const std::string log = test::read_file(peer.log);
  const std::string dram_text = number_after(log, "DRAM ");
  const std::string share_text = number_after(log, " GB/s (measured: 1 threads): ");
  ASSERT_FALSE(dram_text.empty() || share_text.empty()) << log;
  ASSERT_NE(log.find("DRAM " + dram_text + " GB/s (measured: 1 threads): " + share_text + " of"), std::string::npos)
      << log;
  const double dram = std::stod(dram_text), share = std::stod(share_text);
  EXPECT_GT(dram, 0.1);
  EXPECT_NEAR(share, 30.0 / (30.0 + dram), 0.002) << log;
  EXPECT_EQ(int64_t(peer::peek_geometry(lane, 5).split_column), split_column(inter, share));
}

TEST_F(PeerLane, SlowPeerWithSpinLimitOneGivesTheSameTokens) {
  auto local = test::run_tandem({"generate", "--model", model_, "--prompt-ids", "10,20,30,40", "--max-tokens", "6",
                                 "--json", "--ignore-eos", "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = unique_lane("slow");
  Peer peer(model_, rowmap_, lane, tmp, {"--delay-us", "3000"});
  ASSERT_TRUE(peer.wait_serving());
  auto r = test::run_tandem({"generate", "--model", model_, "--prompt-ids", "10,20,30,40", "--max-tokens", "6",
                             "--ignore-eos", "--lane", "peer", "--peer", lane, "--rowmap", rowmap_,
                             "--peer-spin-limit", "1", "--threads", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tokens_of(local.out), tokens_of(r.out));
  const std::string overruns = number_after(r.err, "spin-limit overruns ");
  ASSERT_FALSE(overruns.empty()) << r.err;
  EXPECT_GT(std::stoll(overruns), 0);
}

// The freeze / kill cases: a long generation, streamed; the fault; the watchdog trips; the primary
// fails with the cause and prints nothing after the fault.
struct Faulted {
  std::string primary_out, primary_err, watchdog_out;
  int primary_exit = -1, watchdog_exit = -1;
  size_t out_at_fault = 0;
  bool segment_left = true;
};

Faulted run_fault(const std::string& model, const std::string& rowmap, const test::TempDir& tmp, const std::string& lane,
                  int signal) {
  Faulted f;
  Peer peer(model, rowmap, lane, tmp);
  EXPECT_TRUE(peer.wait_serving());
  Child wd = test::spawn({test::tandem_binary(), "watchdog", "--lane", lane, "--stall", "1", "--mode", "enforce"},
                         tmp.file("wd.out"), tmp.file("wd.err"));
  Child primary = test::spawn({test::tandem_binary(), "generate", "--model", model, "--prompt", "Once upon a time",
                               "--max-tokens", "2000", "--ignore-eos", "--show-special", "--lane", "peer", "--peer", lane, "--rowmap",
                               rowmap, "--threads", "1"},
                              tmp.file("primary.out"), tmp.file("primary.err"));
  // Let some tokens through, then the fault.
  EXPECT_TRUE(test::wait_until([&] { return test::read_file(tmp.file("primary.out")).size() > 20; }, 30));
  kill(peer.child.pid, signal);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a step already answered may finish
  f.out_at_fault = test::read_file(tmp.file("primary.out")).size();
  EXPECT_TRUE(test::wait_exit(wd, 20));
  EXPECT_TRUE(test::wait_exit(primary, 20));
  test::wait_exit(peer.child, 20);
  f.primary_exit = primary.exit_code;
  f.watchdog_exit = wd.exit_code;
  f.primary_out = test::read_file(tmp.file("primary.out"));
  f.primary_err = test::read_file(tmp.file("primary.err"));
  f.watchdog_out = test::read_file(tmp.file("wd.out"));
  f.segment_left = segment_exists(lane);
  return f;
}

TEST_F(PeerLane, FrozenPeerTripsTheWatchdogAndTheRequestFailsDark) {
  Faulted f = run_fault(model_, rowmap_, tmp, unique_lane("frozen"), SIGSTOP);
  EXPECT_EQ(f.watchdog_exit, 1) << f.watchdog_out;
  EXPECT_NE(f.watchdog_out.find("stall"), std::string::npos) << f.watchdog_out;
  EXPECT_NE(f.primary_exit, 0);
  EXPECT_EQ(f.primary_out.size(), f.out_at_fault) << "tokens printed after the freeze";
  EXPECT_NE(f.primary_err.find("stall"), std::string::npos) << f.primary_exit << " " << f.primary_err << f.watchdog_out;
  EXPECT_FALSE(f.segment_left);
}

TEST_F(PeerLane, KilledPeerTripsTheWatchdogAndTheRequestFailsDark) {
  Faulted f = run_fault(model_, rowmap_, tmp, unique_lane("killed"), SIGKILL);
  EXPECT_EQ(f.watchdog_exit, 1) << f.watchdog_out;
  EXPECT_NE(f.watchdog_out.find("peer_gone"), std::string::npos) << f.watchdog_out;
  EXPECT_NE(f.primary_exit, 0);
  EXPECT_EQ(f.primary_out.size(), f.out_at_fault) << "tokens printed after the kill";
  EXPECT_NE(f.primary_err.find("peer_gone"), std::string::npos) << f.primary_err;
  EXPECT_FALSE(f.segment_left);
}

TEST_F(PeerLane, KilledPrimaryMidRequestStopsThePeerCleanly) {
  const std::string lane = unique_lane("primary-killed");
  Peer peer(model_, rowmap_, lane, tmp, {"--delay-us", "200000", "--primary-stall", "1"});
  ASSERT_TRUE(peer.wait_serving());
  Child primary = test::spawn({test::tandem_binary(), "generate", "--model", model_, "--prompt-ids", "1,2,3",
                               "--max-tokens", "50", "--lane", "peer", "--peer", lane, "--rowmap", rowmap_, "--threads", "1"},
                              tmp.file("p.out"), tmp.file("p.err"));
  // Wait until the primary has attached and a request is in flight (the peer logs nothing per request:
  // give it time to attach and submit).
  ASSERT_TRUE(test::wait_until([&] { return test::read_file(tmp.file("p.err")).find("attached") != std::string::npos; }, 30))
      << test::read_file(tmp.file("p.err"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(primary.pid, SIGKILL);
  test::wait_exit(primary, 5);
  ASSERT_TRUE(test::wait_exit(peer.child, 5)) << "peer did not notice the dead primary";
  EXPECT_EQ(peer.child.exit_code, 0) << test::read_file(peer.log);
  EXPECT_NE(test::read_file(peer.log).find("primary"), std::string::npos) << test::read_file(peer.log);
  EXPECT_FALSE(segment_exists(lane));
}

}  // namespace
}  // namespace tandem
