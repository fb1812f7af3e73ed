// The runtime layer (src/runtime): lanes, devices and host waits parsed once; lane plans from a rowmap
// and from the stand-in; Runtime::open on a real model (local lane, and the CPU peer lane against a
// `tandem peer`), with every option that needs no model checked before the model loads; the split
// cut's policy; the exit-code map.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

#include "../lane_tools/peer_child.h"
#include "../lane_tools/rowmap_util.h"
#include "core/error.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/client.h"
#include "peer/segment.h"
#include "placement/fingerprint.h"
#include "runtime/exit_codes.h"
#include "runtime/lane.h"
#include "runtime/lane_plan.h"
#include "runtime/peer_side.h"
#include "runtime/runtime.h"
#include "runtime/split.h"
#include "test_util.h"

namespace tandem {
namespace {

// The message of the InputError `f` throws ("" when it throws none; another exception fails the test).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Lane, ParsedOnceFromItsName) {
  for (Lane l : {Lane::kLocal, Lane::kHost, Lane::kPeer, Lane::kSplit}) EXPECT_EQ(parse_lane(lane_name(l)), l);
  EXPECT_EQ(parse_lane("split"), Lane::kSplit);
  EXPECT_EQ(input_error([] { parse_lane("gpu2"); }), "--lane: unknown lane 'gpu2' (local, host, peer, split)");
  EXPECT_EQ(input_error([] { parse_lane("Peer", "--lanes"); }), "--lanes: unknown lane 'Peer' (local, host, peer, split)");
  EXPECT_NE(input_error([] { parse_lane(""); }), "");
  EXPECT_FALSE(lane_has_peer(Lane::kLocal));
  EXPECT_FALSE(lane_has_peer(Lane::kHost));
  EXPECT_TRUE(lane_has_peer(Lane::kPeer));
  EXPECT_TRUE(lane_has_peer(Lane::kSplit));
  EXPECT_FALSE(lane_has_cold(Lane::kLocal));
  for (Lane l : {Lane::kHost, Lane::kPeer, Lane::kSplit}) EXPECT_TRUE(lane_has_cold(l)) << lane_name(l);
}

TEST(Lane, HostWaitParsedAndResolvedPerLane) {
  EXPECT_EQ(parse_host_wait("auto"), HostWait::kAuto);
  EXPECT_EQ(parse_host_wait("spin"), HostWait::kSpin);
  EXPECT_EQ(parse_host_wait("sleep"), HostWait::kSleep);
  EXPECT_EQ(input_error([] { parse_host_wait("nap"); }), "--host-wait nap: give auto, spin or sleep");
  EXPECT_TRUE(host_wait_sleeps(HostWait::kAuto, Lane::kSplit));
  EXPECT_FALSE(host_wait_sleeps(HostWait::kAuto, Lane::kHost));
}

TEST(Device, CpuAndTheCudaSyntax) {
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  EXPECT_EQ(parse_device("cpu").name(), "cpu");
  EXPECT_EQ(parse_cuda_index("cuda"), 0);
  EXPECT_EQ(parse_cuda_index("cuda:3"), 3);
  for (const char* bad : {"cpu", "cuda:", "cuda:x", "cudax", "cuda:12345", "gpu"}) EXPECT_FALSE(parse_cuda_index(bad)) << bad;
  EXPECT_EQ((Device{true, 2}.name()), "cuda:2");
  // Whatever the build: a name that is no device, and a GPU that is not there, name the value.
  for (const char* bad : {"bogus", "cuda:99", "cuda:x"}) {
    const std::string e = input_error([&] { parse_device(bad); });
    EXPECT_EQ(e.rfind(std::string("--device ") + bad + ": ", 0), 0u) << e;
  }
#ifndef TANDEM_HAVE_CUDA
  EXPECT_EQ(input_error([] { parse_device("cuda"); }), "--device cuda: this build has no CUDA backend (cpu only)");
#endif
}

TEST(Split, SharesAndThePeersCut) {
  EXPECT_EQ(parse_split_share("auto"), std::nullopt);
  EXPECT_EQ(parse_split_share("0.25"), 0.25);
  for (const char* bad : {"0", "1", "1.5", "-0.2", "0.4x", "half", ""})
    EXPECT_EQ(input_error([&] { parse_split_share(bad); }).rfind(std::string("--split-share ") + bad + ": give a share", 0),
              0u)
        << bad;
  EXPECT_NE(input_error([] { check_split_share(1.0); }).find("--split-share 1: give a share"), std::string::npos);
  EXPECT_EQ(resolve_split_column(0.5, "unused", 64, 0), split_column(64, 0.5));  // a share: no peer asked

  ThreadPool pool(1);
  PeerSplitOptions o;
  EXPECT_EQ(choose_peer_split(o, false, 64, pool), 0);  // whole experts
  o.share = "0";
  EXPECT_EQ(choose_peer_split(o, false, 64, pool), 0);
  o.share = "0.25";
  EXPECT_EQ(choose_peer_split(o, true, 64, pool), split_column(64, 0.25));
  o.share = "auto";
  EXPECT_NE(input_error([&] { choose_peer_split(o, true, 64, pool); }).find("a peer on --device cuda takes --split-share F"),
            std::string::npos);
  o.link_gbps = 50;
  o.dram_gbps = 150;  // both given: nothing measured
  EXPECT_EQ(choose_peer_split(o, false, 64, pool), split_column(64, split_share_for(50, 150)));
}

TEST(ExitCodes, OneMapForEveryWayAProcessEnds) {
  EXPECT_EQ(exit_code(InputError("bad")), kExitBadInput);
  EXPECT_EQ(exit_code(OutOfMemoryError("no room")), kExitOutOfMemory);
  EXPECT_EQ(exit_code(std::runtime_error("status")), kExitFailure);
  EXPECT_EQ(exit_code(peer::LaneTripped(peer::TripCause::kStall, "stall")), kExitFailure);
  EXPECT_EQ(exit_code(peer::LaneTripped(peer::TripCause::kCheck, "check")), kExitFailure);
  EXPECT_EQ(exit_code(peer::LaneTripped(peer::TripCause::kCorrupt, "corrupt")), peer::kExitLaneDamaged);
  EXPECT_EQ(exit_code(peer::LaneTripped(peer::TripCause::kShrunk, "shrunk")), peer::kExitLaneDamaged);
  EXPECT_EQ(exit_code(peer::ServeEnd::kStopped), kExitOk);
  EXPECT_EQ(exit_code(peer::ServeEnd::kLaneStopped), kExitOk);
  EXPECT_EQ(exit_code(peer::ServeEnd::kPrimaryGone), kExitOk);
  EXPECT_EQ(exit_code(peer::ServeEnd::kTripped), kExitFailure);
  EXPECT_EQ(exit_code(peer::ServeEnd::kRefused), kExitBadInput);
  EXPECT_EQ(exit_code(peer::ServeEnd::kCorrupt), peer::kExitLaneDamaged);
  EXPECT_EQ(exit_code(peer::ServeEnd::kShrunk), peer::kExitLaneDamaged);
  // The codes themselves are the interface scripts and supervisors read.
  EXPECT_EQ(kExitBadInput, 2);
  EXPECT_EQ(peer::kExitLaneDamaged, 4);
  EXPECT_EQ(kExitOutOfMemory, 5);
}

TEST(LaneCounters, WaitPercentilesFromTheHistogram) {
  std::vector<uint64_t> hist(peer::kWaitBuckets, 0);
  EXPECT_EQ(wait_percentile(hist, 0.5), "-");
  hist[0] = 6;  // < 1 us
  hist[3] = 3;  // [4, 8) us
  hist[10] = 1;  // [512, 1024) us
  EXPECT_EQ(wait_percentile(hist, 0.5), "<1 us");
  EXPECT_EQ(wait_percentile(hist, 0.6), "<1 us");
  EXPECT_EQ(wait_percentile(hist, 0.61), "<8 us");
  EXPECT_EQ(wait_percentile(hist, 0.9), "<8 us");
  EXPECT_EQ(wait_percentile(hist, 0.99), "<1024 us");
}

// A model (the qwen3 fixture) with a third of each layer's experts cold.
class RuntimeOnAModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    model_ = test::oracle_dir("qwen3moe_f32");
    rowmap_ = tmp_->file("rowmap.json");
    test::write_rowmap(model_, rowmap_, [](int64_t, int64_t e) { return e % 3 == 1; });
  }
  static void TearDownTestSuite() { delete tmp_; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline std::string model_, rowmap_;

  static RuntimeOptions options() {
    RuntimeOptions o;
    o.model_dir = model_;
    o.threads = 1;
    o.max_seqs = 2;
    return o;
  }
};

TEST_F(RuntimeOnAModel, PlanFromARowmapCarriesItsListsAndFingerprints) {
  const Rowmap rm = Rowmap::load(rowmap_);
  const ModelConfig cfg = load_config(model_);
  const LanePlan local = LanePlan::from_rowmap(Lane::kLocal, rm, cfg.n_layer);
  EXPECT_EQ(local.n_cold(), 0);
  EXPECT_EQ(local.cold.size(), size_t(cfg.n_layer));

  const LanePlan host = LanePlan::from_rowmap(Lane::kHost, rm, cfg.n_layer);
  ASSERT_EQ(host.cold.size(), size_t(cfg.n_layer));
  for (const auto& layer : rm.layers) EXPECT_EQ(host.cold[size_t(layer.layer)], layer.cold) << layer.layer;
  EXPECT_EQ(host.n_cold(), rm.n_cold());
  EXPECT_EQ(host.rowmap_fingerprint, rm.rowmap_fingerprint);
  EXPECT_EQ(host.lane_fp, 0u);  // no peer to agree with
  EXPECT_FALSE(host.is_stand_in);

  const LanePlan peer = LanePlan::from_rowmap(Lane::kPeer, rm, cfg.n_layer, "lane-a", 8, 0x1234);
  EXPECT_EQ(peer.peer, "lane-a");
  EXPECT_EQ(peer.split_column, 0);  // whole experts: a cut given to the peer lane is not its
  EXPECT_EQ(peer.lane_fp, lane_fingerprint(rm, 0, 0x1234));
  const LanePlan split = LanePlan::from_rowmap(Lane::kSplit, rm, cfg.n_layer, "lane-b", 8, 0x1234);
  EXPECT_EQ(split.split_column, 8);
  EXPECT_EQ(split.lane_fp, lane_fingerprint(rm, 8, 0x1234));
  EXPECT_NE(split.lane_fp, peer.lane_fp);  // another cut: the two sides refuse each other

  EXPECT_NE(input_error([&] { LanePlan::from_rowmap(Lane::kPeer, rm, cfg.n_layer); }).find("needs --peer NAME"),
            std::string::npos);
  EXPECT_NE(input_error([&] { LanePlan::from_rowmap(Lane::kSplit, rm, cfg.n_layer, "lane-b", 0); }).find("no cut"),
            std::string::npos);
}

TEST_F(RuntimeOnAModel, StandInIsTheColdTailForTheHostLaneOnly) {
  const ModelConfig cfg = load_config(model_);
  const LanePlan p = LanePlan::from_stand_in(Lane::kHost, cfg, 0.5);
  EXPECT_TRUE(p.is_stand_in);
  EXPECT_EQ(p.cold, cold_tail(cfg, 0.5));
  const int64_t n = int64_t(0.5 * double(cfg.n_expert) + 0.5);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (!cfg.layer_is_moe[size_t(l)]) {
      EXPECT_TRUE(p.cold[size_t(l)].empty()) << l;
      continue;
    }
    ASSERT_EQ(int64_t(p.cold[size_t(l)].size()), n) << l;
    EXPECT_EQ(p.cold[size_t(l)].front(), int32_t(cfg.n_expert - n)) << l;  // the highest ids
    EXPECT_EQ(p.cold[size_t(l)].back(), int32_t(cfg.n_expert - 1)) << l;
  }
  EXPECT_NE(input_error([&] { LanePlan::from_stand_in(Lane::kPeer, cfg, 0.5); }).find("host lane only"), std::string::npos);
  EXPECT_NE(input_error([&] { LanePlan::from_stand_in(Lane::kHost, cfg, 1.5); }).find("outside [0, 1]"), std::string::npos);

  // As a rowmap it is one the model accepts, with the same lists.
  const TensorStore store = TensorStore::open_dir(model_);
  const Rowmap rm = cold_tail_rowmap(cfg, model_fingerprint(cfg, store), 0.5);
  validate(rm, cfg, model_fingerprint(cfg, store));
  EXPECT_EQ(LanePlan::from_rowmap(Lane::kHost, rm, cfg.n_layer).cold, p.cold);
  EXPECT_EQ(rm.source.policy, "cold-tail");
}

TEST_F(RuntimeOnAModel, LocalLaneRunsTheModel) {
  RuntimeOptions o = options();
  o.rowmap = rowmap_;
  Runtime rt = Runtime::open(o);
  ASSERT_TRUE(rt.model && rt.engine);
  EXPECT_EQ(rt.lane(), Lane::kLocal);
  EXPECT_EQ(rt.plan.n_cold(), 0);
  EXPECT_TRUE(rt.device.is_cpu());
  EXPECT_FALSE(rt.rowmap);  // the local lane reads no rowmap, even when one is given
  EXPECT_FALSE(rt.lane_counters());
  EXPECT_EQ(rt.lane_summary(), "");
  EXPECT_EQ(rt.lane_checks(), nullptr);
  EXPECT_EQ(rt.lane_state(), "");
  const int seq = rt.engine->add_sequence();
  const std::vector<int32_t> ids = {1, 2, 3};
  Engine::Item item{seq, ids};
  const auto& logits = rt.engine->forward(std::span<const Engine::Item>(&item, 1));
  EXPECT_EQ(int64_t(logits.size()), rt.model->cfg.vocab_size);
  // The engine takes the options: two sequences, not a third.
  rt.engine->add_sequence();
  EXPECT_THROW(rt.engine->add_sequence(), InputError);
}

// Every option that needs no model is refused before the model loads: with a folder that does not
// exist, the error is still the option's, not the model's.
TEST_F(RuntimeOnAModel, OptionsAreCheckedBeforeTheModelLoads) {
  RuntimeOptions missing = options();
  missing.model_dir = tmp_->file("no-such-model");
  const std::string model_error = input_error([&] { Runtime::open(missing); });
  ASSERT_NE(model_error, "");  // the folder itself is refused...
  EXPECT_NE(model_error.find("no-such-model"), std::string::npos) << model_error;

  struct Case {
    std::function<void(RuntimeOptions&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](RuntimeOptions& o) { o.split_share = 1.5; }, "--split-share 1.5: give a share"},
      {[](RuntimeOptions& o) { o.lane = Lane::kPeer, o.peer = "bad name!", o.rowmap = rowmap_; }, "lane name 'bad name!'"},
      {[](RuntimeOptions& o) { o.split_peer = "x/y"; }, "lane name 'x/y'"},
      {[](RuntimeOptions& o) { o.lane = Lane::kPeer, o.rowmap = rowmap_; }, "--lane peer needs --peer NAME and --rowmap R"},
      {[](RuntimeOptions& o) { o.lane = Lane::kPeer, o.peer = "a"; }, "--lane peer needs --peer NAME and --rowmap R"},
      {[](RuntimeOptions& o) { o.lane = Lane::kHost, o.rowmap = rowmap_; }, "--lane host: not a lane on the cpu"},
      {[](RuntimeOptions& o) { o.lane = Lane::kSplit, o.peer = "a", o.rowmap = rowmap_; }, "--lane split: not a lane on the cpu"},
      {[](RuntimeOptions& o) { o.peer = "a"; }, "--peer and --peer-check need --lane peer"},
      {[](RuntimeOptions& o) { o.peer_check = 4; }, "--peer and --peer-check need --lane peer"},
      {[](RuntimeOptions& o) { o.lane = Lane::kPeer, o.peer = "a", o.stand_in_cold = 0.5; }, "host lane only"},
      {[](RuntimeOptions& o) { o.stand_in_cold = 2.0; }, "cold fraction 2 is outside [0, 1]"},
      {[](RuntimeOptions& o) { o.max_seqs = 0; }, "max_seqs 0"},
#ifndef TANDEM_HAVE_CUDA
      {[](RuntimeOptions& o) { o.device = Device{true, 0}; }, "--device cuda:0: this build has no CUDA backend"},
#endif
  };
  for (const Case& c : cases) {
    RuntimeOptions o = missing;
    c.edit(o);
    const std::string e = input_error([&] { Runtime::open(o); });
    EXPECT_NE(e.find(c.message), std::string::npos) << "'" << c.message << "' not in: " << e;
    EXPECT_EQ(e.find("no-such-model"), std::string::npos) << e;  // ...but only after every option
  }
}

TEST_F(RuntimeOnAModel, ARowmapForAnotherModelIsRefused) {
  RuntimeOptions o = options();
  o.lane = Lane::kPeer;
  o.peer = fmt::format("rt-{}-other", getpid());
  o.rowmap = tmp_->file("other.json");
  test::write_rowmap(test::oracle_dir("olmoe_f32"), o.rowmap, [](int64_t, int64_t e) { return e % 2 == 0; });
  const std::string e = input_error([&] { Runtime::open(o); });
  EXPECT_NE(e.find("other.json"), std::string::npos) << e;
  EXPECT_NE(e.find("planned for model"), std::string::npos) << e;
}

// The peer side: the rowmap's cold experts held on the CPU, the cut taken, the segment created with
// the geometry and fingerprint a primary checks; nothing created when the rowmap is another model's.
TEST_F(RuntimeOnAModel, PeerSideHoldsTheColdExpertsAndCreatesTheLane) {
  PeerSideOptions o;
  o.model_dir = model_;
  o.rowmap = rowmap_;
  o.lane = fmt::format("rt-{}-side", getpid());
  o.threads = 1;
  o.max_rows = 8;
  o.split.share = "0.5";
  const ModelConfig cfg = load_config(model_);
  const Rowmap rm = Rowmap::load(rowmap_);
  {
    PeerSide side = open_peer_side(o);
    EXPECT_EQ(side.split_column, split_column(cfg.moe_intermediate_size, 0.5));
    EXPECT_EQ(side.cold.n_cold, rm.n_cold());
    EXPECT_GT(side.cold.bytes, 0u);
    EXPECT_EQ(side.rowmap_fingerprint, rm.rowmap_fingerprint);
    auto full = Model::bind(cfg, TensorStore::open_dir(model_), model_);
    EXPECT_EQ(side.weights_fp, cold_weights_fingerprint(*full, rm));
    ASSERT_TRUE(side.server);
    EXPECT_TRUE(peer::Segment::exists(o.lane));
    const peer::Geometry g = side.server->segment().geometry();
    EXPECT_EQ(int64_t(g.split_column), side.split_column);
    EXPECT_EQ(g.max_rows, 8u);
    EXPECT_EQ(int64_t(g.hidden), cfg.hidden_size);
    EXPECT_EQ(side.server->segment().header().fingerprint, lane_fingerprint(rm, side.split_column, side.weights_fp));
    EXPECT_TRUE(side.server->segment().unlink_if_ours());  // serve() would, when it ends
  }
  o.lane = fmt::format("rt-{}-side2", getpid());
  o.rowmap = tmp_->file("other-side.json");
  test::write_rowmap(test::oracle_dir("olmoe_f32"), o.rowmap, [](int64_t, int64_t e) { return e % 2 == 0; });
  EXPECT_NE(input_error([&] { open_peer_side(o); }).find("other-side.json"), std::string::npos);
  EXPECT_FALSE(peer::Segment::exists(o.lane));
  o.lane = "bad name!";
  EXPECT_NE(input_error([&] { open_peer_side(o); }).find("lane name 'bad name!'"), std::string::npos);
}

// The CPU primary's peer lane against a real `tandem peer`: the plan's fingerprints are the ones the
// peer checked, the lane's counters and state come through the runtime, and the answers are the
// local lane's.
TEST_F(RuntimeOnAModel, PeerLaneAttachesAndCounts) {
  test::TempDir tmp;
  const std::string lane = fmt::format("rt-{}-peer", getpid());
  test::PeerChild peer(model_, rowmap_, lane, tmp);
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);

  RuntimeOptions o = options();
  o.lane = Lane::kPeer;
  o.peer = lane;
  o.rowmap = rowmap_;
  o.peer_check = 1;
  Runtime rt = Runtime::open(o);
  ASSERT_TRUE(rt.peer && rt.rowmap);
  EXPECT_EQ(rt.lane(), Lane::kPeer);
  EXPECT_EQ(rt.plan.peer, lane);
  EXPECT_EQ(rt.plan.n_cold(), rt.rowmap->n_cold());
  EXPECT_EQ(rt.plan.weights_fp, cold_weights_fingerprint(*rt.model, *rt.rowmap));
  EXPECT_EQ(rt.plan.lane_fp, lane_fingerprint(*rt.rowmap, 0, rt.plan.weights_fp));
  EXPECT_EQ(rt.lane_state(), "serving");

  Runtime local = Runtime::open(options());
  const std::vector<int32_t> ids = {5, 9, 2, 7, 1, 3};
  std::vector<std::vector<float>> logits;
  for (Runtime* r : {&rt, &local}) {
    const int seq = r->engine->add_sequence();
    Engine::Item item{seq, ids};
    logits.push_back(r->engine->forward(std::span<const Engine::Item>(&item, 1)));
  }
  // The same function: f32 compute summed in another order, within verify's 1e-4 of the largest logit.
  float diff = 0, scale = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    diff = std::max(diff, std::abs(logits[0][i] - logits[1][i]));
    scale = std::max(scale, std::abs(logits[1][i]));
  }
  EXPECT_LE(diff, 1e-4f * scale);
  const auto counters = rt.lane_counters();
  ASSERT_TRUE(counters);
  EXPECT_GT(counters->client.handoffs, 0u);
  EXPECT_GT(counters->cold_slots, 0u);
  EXPECT_LE(counters->cold_slots, counters->routed_slots);
  // Per layer: each MoE layer routed the 6 rows times k, a dense layer none; the parts add up to the totals.
  const ModelConfig& cfg = rt.model->cfg;
  ASSERT_EQ(counters->routed_slots_by_layer.size(), size_t(cfg.n_layer));
  ASSERT_EQ(counters->cold_slots_by_layer.size(), size_t(cfg.n_layer));
  uint64_t cold_sum = 0, routed_sum = 0;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const uint64_t want = cfg.layer_is_moe[size_t(l)] ? uint64_t(ids.size()) * uint64_t(cfg.n_expert_used) : 0;
    EXPECT_EQ(counters->routed_slots_by_layer[size_t(l)], want) << "layer " << l;
    EXPECT_LE(counters->cold_slots_by_layer[size_t(l)], counters->routed_slots_by_layer[size_t(l)]);
    cold_sum += counters->cold_slots_by_layer[size_t(l)];
    routed_sum += counters->routed_slots_by_layer[size_t(l)];
  }
  EXPECT_EQ(cold_sum, counters->cold_slots);
  EXPECT_EQ(routed_sum, counters->routed_slots);
  // The check gate's reference must be the lane's model's shapes: another architecture is refused.
  auto other = Model::load(test::oracle_dir("olmoe_f32"));
  EXPECT_NE(input_error([&] { rt.peer->set_check_reference(*other); }).find("other shapes than the lane's"),
            std::string::npos);
  const auto* checks = rt.lane_checks();
  ASSERT_NE(checks, nullptr);
  int64_t checked = 0;
  for (const auto& c : *checks) {
    checked += c.checks;
    if (c.checks) EXPECT_GE(c.min_cosine, 0.999);
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(rt.lane_summary().rfind("lane peer: ", 0), 0u) << rt.lane_summary();

  // The probe a server runs before it serves through this lane: through the peer, and agreeing with
  // every expert on this host.
  const ProbeResult pr = rt.probe(0.999);
  EXPECT_TRUE(pr.passed) << pr.why;
  EXPECT_GT(pr.handoffs, 0u);
  EXPECT_GE(pr.cosine, 0.999);
  // A bar no cosine reaches fails it, saying why.
  const ProbeResult impossible = local.probe(1.5);
  EXPECT_FALSE(impossible.passed);
  EXPECT_NE(impossible.why.find("below 1.5"), std::string::npos) << impossible.why;
}

}  // namespace
}  // namespace tandem
