// Issue 29, "fail closed everywhere": each case a hostile tester found, as a test that failed before
// the fix. Wrong weights behind the right shapes, a check gate below its bar, limits checked after the
// work, an absurd config, a dead peer with no watchdog, a missing or leftover lane, garbage in the
// header, a watchdog told to signal an unrelated pid, a truncated segment, a bad lane name.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "lane_tools/negated_peer.h"
#include "lane_tools/process.h"
#include "lane_tools/rowmap_util.h"
#include "models/model.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/client.h"
#include "peer/compute.h"
#include "peer/segment.h"
#include "peer/server.h"
#include "peer/sync.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::Child;

std::string lane_name(const char* what) { return fmt::format("fc-{}-{}", getpid(), what); }
bool segment_exists(const std::string& lane) { return std::filesystem::exists("/dev/shm/tandem-" + lane); }
bool has_control_bytes(const std::string& s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) return true;
  return false;
}

// Scribbles `bytes` over the lane's segment from `offset`, through the file (as any writer could).
void scribble(const std::string& lane, const std::string& bytes, off_t offset = 0) {
  int fd = shm_open(peer::shm_name(lane).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), offset), ssize_t(bytes.size()));
  close(fd);
}
std::string garbage() {
  std::string g;
  const std::string evil = "\x1b]0;owned\x07\x1b[2J";
  while (g.size() < peer::kHeaderBytes) g += evil + char(0xff) + char(0x05);
  g.resize(peer::kHeaderBytes);
  return g;
}

// Two tiny models of the same architecture and shapes (seeds 1 and 2), one rowmap that fits both.
class FailClosed : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    for (int seed : {1, 2}) {
      auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", model(seed), "--seed", std::to_string(seed)});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    test::write_rowmap(model(1), rowmap(), [](int64_t, int64_t e) { return e % 3 == 1; });
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string model(int seed) { return tmp_->path + "/tiny" + std::to_string(seed); }
  static std::string rowmap() { return tmp_->path + "/tiny.rowmap.json"; }
  static inline test::TempDir* tmp_ = nullptr;

  void TearDown() override {
    for (Child* c : {&peer_, &primary_, &watchdog_, &other_})
      if (c->pid > 0 && !c->reaped) test::wait_exit(*c, 0);
    for (const auto& l : lanes_) shm_unlink(peer::shm_name(l).c_str());
  }
  std::string use_lane(const char* what) {
    lanes_.push_back(lane_name(what));
    return lanes_.back();
  }
  std::string log(const char* name) const { return test::read_file(dir_.file(name)); }
  // `tandem peer` on model `seed`, waiting for its `serving` line.
  void start_peer(const std::string& lane, int seed, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {test::tandem_binary(), "peer", "--model", model(seed), "--rowmap", rowmap(),
                                     "--lane", lane, "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    peer_ = test::spawn(args, dir_.file("peer.out"), dir_.file("peer.err"));
    ASSERT_TRUE(test::wait_until([&] { return log("peer.err").find("serving") != std::string::npos || test::try_reap(peer_); }, 30));
    ASSERT_FALSE(peer_.reaped) << log("peer.err");
  }
  // tandem_fake_lane (mock experts, no model) as the peer or the primary of `lane`.
  std::vector<std::string> fake(const char* role, const std::string& lane) const {
    return {test::helper_binary(test::tandem_binary(), "tandem_fake_lane"), role, "--lane", lane, "--fingerprint", "a1",
            "--max-rows", "8", "--hidden", "8", "--max-k", "4"};
  }
  void start_fake_peer(const std::string& lane, std::vector<std::string> extra = {}) {
    auto args = fake("peer", lane);
    args.insert(args.end(), extra.begin(), extra.end());
    peer_ = test::spawn(args, dir_.file("peer.out"), dir_.file("peer.err"));
    ASSERT_TRUE(test::wait_until([&] { return peer::Segment::exists(lane); }, 20)) << log("peer.err");
  }
  void start_fake_primary(const std::string& lane) {
    primary_ = test::spawn(fake("primary", lane), dir_.file("primary.out"), dir_.file("primary.err"));
  }
  // Runs a fake primary against a fake peer, scribbles `bytes` at `offset` once 20 handoffs are done, and
  // checks that both stop as a damaged lane: the primary fails, the peer exits 4 (corrupt), no side
  // calls it a vanished primary, and no raw byte reaches a log. Returns every log, for more checks.
  std::string scribble_mid_run(const std::string& lane, const std::string& bytes, off_t offset) {
    start_fake_peer(lane);
    start_fake_primary(lane);
    auto seg = peer::Segment::open(lane, 10);
    EXPECT_TRUE(test::wait_until([&] { return seg->header().handoffs.load() >= 20; }, 20)) << log("primary.err");
    scribble(lane, bytes, offset);
    EXPECT_TRUE(test::wait_exit(primary_, 10));
    EXPECT_TRUE(test::wait_exit(peer_, 10));
    EXPECT_NE(primary_.exit_code, 0);
    EXPECT_EQ(peer_.exit_code, peer::kExitLaneDamaged) << log("peer.err");
    const std::string all = log("primary.out") + log("primary.err") + log("peer.out") + log("peer.err");
    EXPECT_EQ(all.find("primary_gone"), std::string::npos) << all;
    EXPECT_NE(all.find("corrupt"), std::string::npos) << all;
    EXPECT_FALSE(has_control_bytes(all)) << all;
    return all;
  }

  test::TempDir dir_;
  std::vector<std::string> lanes_;
  Child peer_, primary_, watchdog_, other_;
};

// 1a + 6. Same shapes, other weights: the shape fingerprint cannot tell them apart, the handshake can.
// Both sides refuse, naming both weights fingerprints in the fp1 form.
TEST_F(FailClosed, PeerWithOtherWeightsOfTheSameShapesIsRefused) {
  const std::string lane = use_lane("weights");
  start_peer(lane, 2);
  EXPECT_NE(log("peer.err").find("cold-expert weights fp1:"), std::string::npos) << log("peer.err");
  auto r = test::run_tandem({"generate", "--model", model(1), "--lane", "peer", "--peer", lane, "--rowmap", rowmap(),
                             "--prompt", "Hello world", "--max-tokens", "16", "--ignore-eos", "--json", "--threads", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("holds cold-expert weights fp1:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this primary fp1:"), std::string::npos) << r.err;
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 2) << log("peer.err");
  EXPECT_NE(log("peer.err").find("the primary fp1:"), std::string::npos) << log("peer.err");
  EXPECT_FALSE(segment_exists(lane));
}

// 6. Another rowmap: the message names both rowmap fingerprints as the rowmap files carry them.
TEST_F(FailClosed, ForeignRowmapIsNamedInTheFp1FormOfTheRowmapFiles) {
  const std::string other = dir_.file("other.rowmap.json");
  test::write_rowmap(model(1), other, [](int64_t, int64_t e) { return e % 4 == 0; });
  const std::string lane = use_lane("rowmap");
  start_peer(lane, 1);
  auto r = test::run_tandem({"generate", "--model", model(1), "--lane", "peer", "--peer", lane, "--rowmap", other,
                             "--prompt-ids", "1,2", "--max-tokens", "2", "--threads", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string served = Rowmap::load(rowmap()).rowmap_fingerprint, mine = Rowmap::load(other).rowmap_fingerprint;
  EXPECT_NE(r.err.find("the peer serves rowmap " + served + ", this primary " + mine), std::string::npos) << r.err;
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, 2);
}

// The same weights pass the handshake (the fingerprint is the same on both sides).
TEST_F(FailClosed, SameWeightsAttachAndAgree) {
  auto local = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", "5,6,7", "--max-tokens", "6",
                                 "--ignore-eos", "--json", "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = use_lane("same");
  start_peer(lane, 1);
  auto r = test::run_tandem({"generate", "--model", model(1), "--lane", "peer", "--peer", lane, "--rowmap", rowmap(),
                             "--prompt-ids", "5,6,7", "--max-tokens", "6", "--ignore-eos", "--json", "--peer-check",
                             "1", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(local.out)["results"][0]["tokens"],
            nlohmann::json::parse(r.out)["results"][0]["tokens"]);
}

// 1b. The check gate is a gate: the first checked row below --check-min trips the lane (cause
// check_failed); the request fails before any token is produced, and the peer sees the lane tripped.
TEST_F(FailClosed, CheckGateBelowTheBarTripsTheLane) {
  auto model = Model::load(FailClosed::model(1));
  Rowmap rm = Rowmap::load(rowmap());
  ThreadPool pool(1);  // the peer has its own: the two sides run at once
  const std::string lane = use_lane("gate");
  test::NegatedPeer wrong(*model, rm, lane);
  {
    PeerLaneOptions po;
    po.lane = lane;
    po.check_every = 1;  // --check-min stays at its default, 0.999
    PeerExperts experts(*model, rm, po, pool);
    CpuEngine engine(*model, {}, &experts, &pool);
    test::expect_check_gate_trips(engine);
  }
  EXPECT_EQ(wrong.join(), peer::ServeEnd::kTripped);
}

// 2. Limits before work: a budget past the context is said up front and generation stops at the
// context with finish_reason "length", keeping its tokens; a prompt that cannot fit is refused before
// any step with its real token count; --ctx <= 0 is refused; --max-tokens 0 prints no negative rate.
TEST_F(FailClosed, LimitsAreCheckedBeforeTheWork) {
  auto r = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", "1,2,3,4", "--max-tokens", "100000",
                             "--ignore-eos", "--json", "--ctx", "40", "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["results"][0]["finish_reason"], "length");
  EXPECT_EQ(j["results"][0]["tokens"].size(), 40u - 4u);
  EXPECT_NE(r.err.find("4 tokens + --max-tokens 100000 exceed the context limit of 40"), std::string::npos) << r.err;

  std::string ids = "1";
  for (int i = 2; i <= 100; ++i) ids.append(",").append(std::to_string(i));
  auto big = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", ids, "--max-tokens", "4", "--ctx",
                               "64", "--threads", "1"});
  EXPECT_EQ(big.exit_code, 2) << big.err;
  EXPECT_NE(big.err.find("has 100 tokens"), std::string::npos) << big.err;
  EXPECT_NE(big.err.find("context limit of 64"), std::string::npos) << big.err;
  EXPECT_TRUE(big.out.empty()) << big.out;

  for (const char* ctx : {"0", "-5"}) {
    auto bad = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", "1,2", "--ctx", ctx});
    EXPECT_EQ(bad.exit_code, 2) << ctx << " " << bad.err;
  }
  auto over = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", "1,2", "--max-tokens", "2", "--ctx",
                                "100000", "--threads", "1"});
  EXPECT_EQ(over.exit_code, 0) << over.err;
  EXPECT_NE(over.err.find("exceeds the model's max_position_embeddings (2048)"), std::string::npos) << over.err;

  auto none = test::run_tandem({"generate", "--model", model(1), "--prompt-ids", "1,2", "--max-tokens", "0",
                                "--threads", "1"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.err.find("decode 0.00 tokens/s"), std::string::npos) << none.err;
  EXPECT_EQ(none.err.find("decode -"), std::string::npos) << none.err;
}

// 3. A config that describes a far larger model than the checkpoint holds fails at once, with what it
// implies and what the headers list, before anything proportional to it is allocated.
TEST_F(FailClosed, AbsurdLayerCountIsRefusedBeforeAllocating) {
  for (const char* layers : {"4000000", "16777216"}) {
    SCOPED_TRACE(layers);
    const std::string dir = dir_.file(std::string("absurd") + layers);
    std::filesystem::copy(model(1), dir, std::filesystem::copy_options::recursive);
    auto cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
    cfg["num_hidden_layers"] = std::stoll(layers);
    test::write_file(dir + "/config.json", cfg.dump());
    auto r = test::run_tandem({"info", "--model", dir});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("num_hidden_layers " + std::string(layers)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("safetensors headers list"), std::string::npos) << r.err;
  }
}

// 4. A peer that dies with no watchdog running: the primary's blocked wait sees it (its 20 ms naps
// check the pinned peer process) and fails the step with cause peer_gone.
TEST_F(FailClosed, DeadPeerWithoutWatchdogFailsTheStep) {
  const std::string lane = use_lane("dead");
  start_fake_peer(lane, {"--sleep-us", "300000"});
  start_fake_primary(lane);
  auto seg = peer::Segment::open(lane, 10);
  ASSERT_TRUE(test::wait_until([&] { return seg->header().primary_pid.load() != 0; }, 10)) << log("primary.err");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a request in flight (the peer takes 300 ms)
  ASSERT_EQ(kill(peer_.pid, SIGKILL), 0);
  ASSERT_TRUE(test::wait_exit(primary_, 10)) << "the primary kept waiting for a dead peer";
  EXPECT_EQ(primary_.exit_code, 3) << log("primary.err");
  EXPECT_NE(log("primary.err").find("cause=peer_gone"), std::string::npos) << log("primary.err");
  // Tripped, not silently dropped: the next peer of the lane replaces the segment (its peer is gone).
  EXPECT_EQ(seg->header().state.load(), uint32_t(peer::LaneState::kTripped));
  EXPECT_EQ(seg->header().trip_cause.load(), uint32_t(peer::TripCause::kPeerGone));
}

// 5. Waiting for a peer: a missing lane is waited for out loud (--peer-wait) and the error says how to
// start its peer; a dead peer's leftover segment is "gone" (tandem lane) and a primary says so at once.
TEST_F(FailClosed, MissingOrDeadPeerIsNamed) {
  const std::string nobody = use_lane("nobody");
  auto r = test::run_tandem({"generate", "--model", model(1), "--lane", "peer", "--peer", nobody, "--rowmap", rowmap(),
                             "--prompt-ids", "1,2", "--peer-wait", "0.3", "--threads", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("waiting up to"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tandem peer --lane " + nobody), std::string::npos) << r.err;
  auto missing = test::run_tandem({"lane", "--lane", nobody});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("tandem peer --lane " + nobody), std::string::npos) << missing.err;

  const std::string lane = use_lane("leftover");
  start_fake_peer(lane);
  ASSERT_TRUE(test::wait_until([&] { return log("peer.err").find("serving") != std::string::npos; }, 10));
  const pid_t dead = peer_.pid;
  ASSERT_EQ(kill(peer_.pid, SIGKILL), 0);
  test::wait_exit(peer_, 10);
  auto status = test::run_tandem({"lane", "--lane", lane, "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  auto j = nlohmann::json::parse(status.out);
  EXPECT_EQ(j["state"], "gone");
  EXPECT_EQ(j["header_state"], "serving");
  start_fake_primary(lane);
  ASSERT_TRUE(test::wait_exit(primary_, 5)) << "the primary waited on a dead peer's segment";
  EXPECT_EQ(primary_.exit_code, 2);
  EXPECT_NE(log("primary.err").find(fmt::format("its peer (pid {}) is gone", dead)), std::string::npos)
      << log("primary.err");
}

// 7. Garbage in the header before a primary attaches: the peer stops with its own cause and exit code
// (corrupt, 4), not as a normal stop (0); nothing raw from the segment reaches an error message.
TEST_F(FailClosed, GarbageHeaderIsCorruptNotAStop) {
  const std::string lane = use_lane("garbage");
  start_fake_peer(lane);
  ASSERT_TRUE(test::wait_until([&] { return log("peer.err").find("serving") != std::string::npos; }, 10));
  scribble(lane, garbage());
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  EXPECT_EQ(peer_.exit_code, peer::kExitLaneDamaged) << log("peer.out") << log("peer.err");
  EXPECT_NE(log("peer.err").find("corrupt"), std::string::npos) << log("peer.err");
  EXPECT_FALSE(has_control_bytes(log("peer.err") + log("peer.out")));
}

// 7, mid-run: the primary fails with cause corrupt (not primary_gone), and prints no raw bytes.
TEST_F(FailClosed, GarbageHeaderMidRunFailsTheRequestAsCorrupt) {
  scribble_mid_run(use_lane("garbage-run"), garbage(), 0);
}

// 7, the attach fields only: garbage over primary_pid, primary_fingerprint and attach_seq, with the identity
// line and the state left intact, reads like a second primary attaching with a foreign fingerprint. It is
// a damaged header (corrupt, exit 4), not a refused primary (exit 2): a scribble caught halfway through
// by the peer's loop looks exactly like this.
TEST_F(FailClosed, GarbageInTheAttachFieldsIsCorruptNotARefusal) {
  const size_t from = offsetof(peer::Header, primary_pid);
  const size_t to = offsetof(peer::Header, attach_seq) + sizeof(uint32_t);
  const std::string all = scribble_mid_run(use_lane("garbage-attach"), garbage().substr(0, to - from), off_t(from));
  EXPECT_EQ(all.find("refused a primary"), std::string::npos) << all;
}

// 8. The watchdog signals only processes it verified as the lane's own: a header edited to name an
// unrelated process gets that process counted as gone, never signalled.
TEST_F(FailClosed, WatchdogNeverSignalsAnUnrelatedPid) {
  const std::string lane = use_lane("wdpid");
  start_fake_peer(lane);
  ASSERT_TRUE(test::wait_until([&] { return log("peer.err").find("serving") != std::string::npos; }, 10));
  other_ = test::spawn({"/bin/sleep", "60"}, dir_.file("sleep.out"), dir_.file("sleep.err"));
  watchdog_ = test::spawn({test::tandem_binary(), "watchdog", "--lane", lane, "--stall", "1", "--grace", "1"},
                          dir_.file("wd.out"), dir_.file("wd.err"));
  ASSERT_TRUE(test::wait_until([&] { return log("wd.err").find("watching") != std::string::npos; }, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it has sampled the healthy lane
  auto seg = peer::Segment::open(lane, 10);
  ASSERT_EQ(kill(peer_.pid, SIGSTOP), 0);
  seg->header().primary_pid.store(other_.pid);  // the edit
  seg->slot(0).request->seq.store(1);           // and work pending on a frozen peer: a trip either way
  ASSERT_TRUE(test::wait_exit(watchdog_, 20));
  EXPECT_EQ(watchdog_.exit_code, 1) << log("wd.err");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(test::try_reap(other_)) << "the watchdog killed an unrelated process: " << log("wd.out");
  EXPECT_EQ(kill(other_.pid, 0), 0);
  EXPECT_NE(log("wd.out").find("not signalled"), std::string::npos) << log("wd.out");
  ASSERT_TRUE(test::wait_exit(peer_, 10));  // the lane's real peer was stopped
}

// 9. A segment truncated mid-run: no SIGBUS; both sides stop with cause shrunk (peer exit 4).
TEST_F(FailClosed, TruncatedSegmentStopsCleanly) {
  const std::string lane = use_lane("truncated");
  start_fake_peer(lane);
  start_fake_primary(lane);
  auto seg = peer::Segment::open(lane, 10);
  ASSERT_TRUE(test::wait_until([&] { return seg->header().handoffs.load() >= 20; }, 20)) << log("primary.err");
  seg.reset();  // our own mapping would fault too
  ASSERT_EQ(truncate(("/dev/shm" + peer::shm_name(lane)).c_str(), 1024), 0);
  ASSERT_TRUE(test::wait_exit(peer_, 10));
  ASSERT_TRUE(test::wait_exit(primary_, 10));
  EXPECT_EQ(peer_.exit_code, peer::kExitLaneDamaged) << log("peer.out") << log("peer.err");
  EXPECT_NE(log("peer.err").find("truncated"), std::string::npos) << log("peer.err");
  EXPECT_EQ(primary_.exit_code, 3) << log("primary.out") << log("primary.err");
  EXPECT_NE(log("primary.err").find("cause=shrunk"), std::string::npos) << log("primary.err");
}

// 10. A bad lane name is refused before the model is loaded (here: there is no model at all).
TEST_F(FailClosed, LaneNameIsCheckedBeforeTheModelLoads) {
  auto g = test::run_tandem({"generate", "--model", "/nonexistent", "--lane", "peer", "--peer", "bad name!", "--rowmap",
                             "x.json", "--prompt-ids", "1"});
  EXPECT_EQ(g.exit_code, 2);
  EXPECT_NE(g.err.find("lane"), std::string::npos) << g.err;
  EXPECT_EQ(g.err.find("/nonexistent"), std::string::npos) << g.err;
  auto p = test::run_tandem({"peer", "--model", "/nonexistent", "--rowmap", "x.json", "--lane", "bad/name"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_EQ(p.err.find("/nonexistent"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace tandem
