// Fault tests of the sidecar lane with real processes (tests/lane_tools: tandem_fake_lane) and the real
// `tandem watchdog`: a frozen peer, a killed peer, another fingerprint, garbage requests, a slow peer
// under a tiny spin limit, a killed primary. In every case no wrong answer is returned: the fake primary
// checks each answer bit for bit and fails on the first mismatch.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "core/error.h"
#include "lane_tools/mock_compute.h"
#include "lane_tools/process.h"
#include "peer/client.h"
#include "peer/segment.h"
#include "peer/sync.h"
#include "test_util.h"

namespace tandem {
namespace {

using peer::Segment;
using test::Child;

constexpr int kLayers = 4, kExperts = 12, kHidden = 8, kRows = 16, kK = 4;

class LaneFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    lane_ = fmt::format("ft-{}-{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    for (Child* c : {&peer_, &primary_, &watchdog_}) {
      if (c->pid > 0 && !c->reaped) test::wait_exit(*c, 0);  // kill leftovers
    }
    shm_unlink(peer::shm_name(lane_).c_str());
  }
  std::string fake() const { return test::helper_binary(test::tandem_binary(), "tandem_fake_lane"); }
  std::vector<std::string> lane_args(const char* role, const char* fingerprint = "a1") const {
    return {fake(), role, "--lane", lane_, "--fingerprint", fingerprint, "--slots", "2", "--max-rows",
            std::to_string(kRows), "--hidden", std::to_string(kHidden), "--max-k", std::to_string(kK)};
  }
  void start_peer(std::vector<std::string> extra = {}, const char* fingerprint = "a1") {
    auto args = lane_args("peer", fingerprint);
    args.insert(args.end(), extra.begin(), extra.end());
    peer_ = test::spawn(args, dir_.file("peer.out"), dir_.file("peer.err"));
    ASSERT_TRUE(test::wait_until([&] { return Segment::exists(lane_); }, 20)) << "peer did not create the lane";
  }
  void start_primary(std::vector<std::string> extra = {}) {
    auto args = lane_args("primary");
    args.insert(args.end(), extra.begin(), extra.end());
    primary_ = test::spawn(args, dir_.file("primary.out"), dir_.file("primary.err"));
  }
  void start_watchdog(const std::string& stall, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {test::tandem_binary(), "watchdog", "--lane", lane_, "--stall", stall, "--grace",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    watchdog_ = test::spawn(args, dir_.file("watchdog.out"), dir_.file("watchdog.err"));
  }
  // The lane's counters, seen through our own mapping (the lane may vanish later; the mapping stays).
  std::shared_ptr<Segment> observe() { return Segment::open(lane_, 10); }
  std::string out(const char* name) { return test::read_file(dir_.file(name)); }
  peer::Geometry geometry() const {
    peer::Geometry g;
    g.n_slots = 2;
    g.max_rows = kRows;
    g.hidden = kHidden;
    g.max_k = kK;
    return g;
  }
  nlohmann::json watchdog_line() {
    std::string text = out("watchdog.out");
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    return nlohmann::json::parse(text.substr(0, text.find('\n')));
  }

  test::TempDir dir_;
  std::string lane_;
  Child peer_, primary_, watchdog_;
};

// (a) A frozen peer: the primary waits; the watchdog trips within stall + 1 s; the wait fails with the
// trip error; the processes stop and the segment is gone.
TEST_F(LaneFaults, FrozenPeerTripsTheWatchdog) {
  start_peer();
  start_primary();
  auto seg = observe();
  ASSERT_TRUE(test::wait_until([&] { return seg->header().handoffs.load() >= 20; }, 20)) << out("primary.err");
  start_watchdog("1");
  ASSERT_EQ(kill(peer_.pid, SIGSTOP), 0);
  ASSERT_TRUE(test::wait_exit(watchdog_, 30)) << "watchdog did not end the stall";
  EXPECT_EQ(watchdog_.exit_code, 1) << out("watchdog.err");
  nlohmann::json line = watchdog_line();
  EXPECT_EQ(line["cause"], "stall");
  EXPECT_EQ(line["segment_removed"], true);
  EXPECT_LT(line["stalled_s"].get<double>(), 1.0 + 1.0);  // the bound: trip within stall + 1 s
  ASSERT_TRUE(test::wait_exit(primary_, 10));
  EXPECT_EQ(primary_.exit_code, 3) << out("primary.out") << out("primary.err");
  EXPECT_NE(out("primary.err").find("cause=stall"), std::string::npos) << out("primary.err");
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_FALSE(Segment::exists(lane_));
  EXPECT_EQ(seg->header().state.load(), uint32_t(peer::LaneState::kTripped));
}

// (b) A killed peer: the watchdog trips (peer gone), the primary's wait fails, rollback runs.
TEST_F(LaneFaults, KilledPeerTripsTheWatchdogAndRunsRollback) {
  start_peer();
  start_primary();
  auto seg = observe();
  ASSERT_TRUE(test::wait_until([&] { return seg->header().handoffs.load() >= 20; }, 20)) << out("primary.err");
  const std::string marker = dir_.file("rolled_back");
  start_watchdog("5", {"--rollback", "echo \"$TANDEM_LANE $TANDEM_TRIP_CAUSE\" > " + marker});
  ASSERT_EQ(kill(peer_.pid, SIGKILL), 0);
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  ASSERT_TRUE(test::wait_exit(watchdog_, 30));
  EXPECT_EQ(watchdog_.exit_code, 1) << out("watchdog.err");
  nlohmann::json line = watchdog_line();
  EXPECT_EQ(line["cause"], "peer_gone");
  EXPECT_EQ(line["rollback_exit"], 0);
  EXPECT_EQ(test::read_file(marker), lane_ + " peer_gone\n");
  ASSERT_TRUE(test::wait_exit(primary_, 10));
  EXPECT_EQ(primary_.exit_code, 3) << out("primary.out") << out("primary.err");
  EXPECT_NE(out("primary.err").find("cause=peer_gone"), std::string::npos) << out("primary.err");
  EXPECT_FALSE(Segment::exists(lane_));
}

// (c) Another fingerprint: the primary refuses to attach and the peer refuses the primary.
TEST_F(LaneFaults, OtherFingerprintIsRefusedOnBothSides) {
  start_peer({}, "b2");
  try {
    peer::PeerClient::attach(lane_, 0xa1, geometry());
    FAIL() << "attach must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fingerprint mismatch"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 2) << out("peer.err");
  EXPECT_NE(out("peer.err").find("refused a primary: fingerprint mismatch"), std::string::npos) << out("peer.err");
  EXPECT_FALSE(Segment::exists(lane_));
  // The same through the fake primary process: exit code 2 and a clear message.
  start_peer({}, "b2");
  start_primary({"--requests", "1"});
  ASSERT_TRUE(test::wait_exit(primary_, 20));
  EXPECT_EQ(primary_.exit_code, 2);
  EXPECT_NE(out("primary.err").find("fingerprint mismatch"), std::string::npos) << out("primary.err");
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 2);
}

// Waits for slot's response seq to reach seq (raw protocol, bounded) and returns its status.
uint32_t raw_round_trip(Segment& seg, uint32_t slot, uint64_t seq) {
  peer::Header& h = seg.header();
  seg.slot(slot).request->seq.store(seq, std::memory_order_release);
  h.doorbell.fetch_add(1);
  peer::futex_wake_all(&h.doorbell);
  EXPECT_TRUE(test::wait_until([&] { return seg.slot(slot).response->seq.load() == seq; }, 10));
  return seg.slot(slot).response->status;
}

// (d) Garbage in the request area: error status, the peer keeps serving, the client fails that request.
TEST_F(LaneFaults, GarbageRequestsGetErrorStatusAndPeerKeepsServing) {
  start_peer();
  auto client = peer::PeerClient::attach(lane_, 0xa1, geometry());
  std::mt19937_64 rng(1);
  std::vector<float> outbuf(kRows * kHidden);
  auto valid_round_trip = [&] {
    auto q = test::make_mock_request(rng, kLayers, kExperts, kHidden, kRows, kK);
    client->submit(0, q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
    client->wait(0, outbuf.data());
    EXPECT_EQ(0, std::memcmp(outbuf.data(), q.expected.data(), q.expected.size() * 4));
  };
  valid_round_trip();
  // Through the client: bad ids, a hot expert, a bad layer.
  struct Bad {
    int layer;
    int32_t id;
    peer::Status status;
  };
  for (Bad b : {Bad{0, kExperts, peer::Status::kBadExpert}, Bad{0, -2, peer::Status::kBadExpert},
                Bad{0, 1, peer::Status::kHotExpert}, Bad{kLayers, 0, peer::Status::kBadLayer}}) {
    std::vector<float> x(kHidden, 1.0f), w(kK, 0.5f);
    std::vector<int32_t> ids = {b.id, -1, -1, -1};
    client->submit(0, b.layer, x.data(), 1, ids.data(), w.data(), kK);
    try {
      client->wait(0, outbuf.data());
      ADD_FAILURE() << "garbage request answered as OK: status " << peer::to_string(b.status);
    } catch (const peer::LaneError& e) {
      EXPECT_EQ(e.status(), b.status) << e.what();
    }
    valid_round_trip();
  }
  // Raw writes on slot 1, which the client does not use: rows over capacity, k out of range, a seq jump.
  auto seg = observe();
  peer::RequestHead* req = seg->slot(1).request;
  req->layer = 0;
  req->n_rows = kRows + 1;
  req->k = 1;
  EXPECT_EQ(raw_round_trip(*seg, 1, 1), uint32_t(peer::Status::kBadRows));
  req->n_rows = 0xffffffffu;
  EXPECT_EQ(raw_round_trip(*seg, 1, 2), uint32_t(peer::Status::kBadRows));
  req->n_rows = 1;
  req->k = kK + 1;
  EXPECT_EQ(raw_round_trip(*seg, 1, 3), uint32_t(peer::Status::kBadK));
  req->k = 0;
  EXPECT_EQ(raw_round_trip(*seg, 1, 4), uint32_t(peer::Status::kBadK));
  req->k = 1;
  req->layer = 1 << 30;
  EXPECT_EQ(raw_round_trip(*seg, 1, 5), uint32_t(peer::Status::kBadLayer));
  req->layer = 0;
  EXPECT_EQ(raw_round_trip(*seg, 1, 50), uint32_t(peer::Status::kBadSequence));
  EXPECT_NE(peer::read_bounded(seg->slot(1).response->detail, peer::kDetailBytes).find("request seq 50"),
            std::string::npos);
  valid_round_trip();
  EXPECT_EQ(peer::process_state(peer_.pid), peer::ProcessState::kAlive);
  client.reset();  // normal shutdown: the peer exits 0 and removes the lane
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 0) << out("peer.err");
  EXPECT_FALSE(Segment::exists(lane_));
}

// (e) Spin limit 1 µs with a slowed peer: every answer is right and the overrun counter counts.
TEST_F(LaneFaults, TinySpinLimitWithSlowPeer) {
  start_peer({"--sleep-us", "3000"});
  peer::ClientOptions o;
  o.spin_limit_us = 1;
  auto client = peer::PeerClient::attach(lane_, 0xa1, geometry(), o);
  std::mt19937_64 rng(2);
  std::vector<float> outbuf(kRows * kHidden);
  for (int i = 0; i < 8; ++i) {
    auto q = test::make_mock_request(rng, kLayers, kExperts, kHidden, kRows, kK);
    client->submit(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
    client->wait(outbuf.data());
    ASSERT_EQ(0, std::memcmp(outbuf.data(), q.expected.data(), q.expected.size() * 4)) << "request " << i;
  }
  peer::ClientStats s = client->stats();
  EXPECT_EQ(s.handoffs, 8u);
  EXPECT_GT(s.overruns, 0u);
  uint64_t in_hist = 0;
  for (uint64_t v : s.wait_hist) in_hist += v;
  EXPECT_EQ(in_hist, 8u);
  client.reset();
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 0);
}

// (f) The primary killed mid-request: the peer notices, exits cleanly and removes the segment.
TEST_F(LaneFaults, KilledPrimaryMakesThePeerExitCleanly) {
  start_peer({"--sleep-us", "100000", "--primary-stall", "2"});
  start_primary();
  auto seg = observe();
  ASSERT_TRUE(test::wait_until(
      [&] { return seg->header().peer_served.load() >= 1 && seg->slot(0).request->seq.load() > seg->slot(0).response->seq.load(); },
      20));
  ASSERT_EQ(kill(primary_.pid, SIGKILL), 0);
  ASSERT_TRUE(test::wait_exit(primary_, 10));
  ASSERT_TRUE(test::wait_exit(peer_, 20)) << "the peer did not notice the primary's death";
  EXPECT_EQ(peer_.exit_code, 0) << out("peer.err");
  EXPECT_NE(out("peer.out").find("peer end: primary_gone"), std::string::npos) << out("peer.out");
  EXPECT_FALSE(Segment::exists(lane_));
}

// The peer stops cleanly on SIGTERM and removes the segment.
TEST_F(LaneFaults, PeerStopsOnSigterm) {
  start_peer();
  ASSERT_TRUE(test::wait_until([&] { return observe()->header().state.load() == uint32_t(peer::LaneState::kServing); }, 10));
  ASSERT_EQ(kill(peer_.pid, SIGTERM), 0);
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 0) << out("peer.err");
  EXPECT_NE(out("peer.out").find("peer end: stopped"), std::string::npos);
  EXPECT_FALSE(Segment::exists(lane_));
}

// Observe mode: one log line per stall episode, no action; the watchdog exits 0 when the lane stops.
TEST_F(LaneFaults, ObserveModeLogsOnceAndExitsWithTheLane) {
  // 2 ms per request: the 400 requests outlast the watchdog's start, so the peer is frozen mid-run
  // (unpaced, a loaded machine could finish them before the SIGSTOP and leave no stall to observe).
  start_peer({"--sleep-us", "2000"});
  start_primary({"--requests", "400"});
  auto seg = observe();
  ASSERT_TRUE(test::wait_until([&] { return seg->header().handoffs.load() >= 5; }, 20));
  start_watchdog("0.3", {"--mode", "observe"});
  ASSERT_EQ(kill(peer_.pid, SIGSTOP), 0);
  ASSERT_LT(seg->header().handoffs.load(), 400u) << "the primary finished before the peer was frozen";
  ASSERT_TRUE(test::wait_until([&] { return out("watchdog.out").find('\n') != std::string::npos; }, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // more polls inside the same episode
  ASSERT_EQ(kill(peer_.pid, SIGCONT), 0);
  ASSERT_TRUE(test::wait_exit(primary_, 30));
  EXPECT_EQ(primary_.exit_code, 0) << out("primary.err");
  EXPECT_NE(out("primary.out").find("ok verified=400"), std::string::npos) << out("primary.out");
  ASSERT_TRUE(test::wait_exit(watchdog_, 20));
  EXPECT_EQ(watchdog_.exit_code, 0) << out("watchdog.err");
  nlohmann::json line = watchdog_line();
  EXPECT_EQ(line["event"], "lane_fault_observed");
  EXPECT_EQ(line["cause"], "stall");
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 0);
}

TEST_F(LaneFaults, WatchdogRejectsBadOptionsAndMissingLanes) {
  auto r = test::run_tandem({"watchdog", "--lane", "bad/name", "--stall", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("may only hold"), std::string::npos) << r.err;
  r = test::run_tandem({"watchdog", "--lane", lane_, "--stall", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--stall must be > 0"), std::string::npos) << r.err;
  r = test::run_tandem({"watchdog", "--lane", lane_, "--stall", "1", "--startup-timeout", "0.05"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  r = test::run_tandem({"watchdog", "--lane", lane_, "--stall", "1", "--mode", "sometimes"});
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace tandem
