// Helpers of the GPU lane tests (test_cuda_peer_lane.cpp: a CPU `tandem peer` behind a GPU primary;
// test_cuda_gpu_peer.cpp: a GPU `tandem peer`): the tandem binary (TANDEM_BIN when set, the device
// machine; else the build), a peer process that reports when it serves, CUDA options of the peer and
// split lanes, a greedy generation and its comparison, and the two end-to-end runs both files share
// (a fixture through a lane against the local lane; a peer frozen or killed under the watchdog).
#pragma once

#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../lane_tools/process.h"
#include "../lane_tools/rowmap_util.h"
#include "backends/cuda/cuda_engine.h"
#include "engine/generate.h"
#include "engine/verify.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem::test {

inline std::string tandem_bin() {
  const char* env = std::getenv("TANDEM_BIN");
  return env ? env : tandem_binary();
}

inline CommandResult run_bin(const std::vector<std::string>& args, const TempDir& tmp) {
  std::vector<std::string> full = {tandem_bin()};
  full.insert(full.end(), args.begin(), args.end());
  Child c = spawn(full, tmp.file("run.out"), tmp.file("run.err"));
  wait_exit(c, 120);
  return {c.exit_code, read_file(tmp.file("run.out")), read_file(tmp.file("run.err"))};
}

inline std::string unique_lane(const char* what) { return fmt::format("gp-{}-{}", getpid(), what); }
inline bool segment_exists(const std::string& lane) { return std::filesystem::exists("/dev/shm/tandem-" + lane); }

// `tandem peer` on 2 threads, always polling (a GPU primary cannot ring the doorbell); `extra` adds
// options (--device cuda, --split-share, --delay-us, ...).
struct Peer {
  Child child;
  std::string log;
  Peer(const std::string& model, const std::string& rowmap, const std::string& lane, const TempDir& tmp,
       std::vector<std::string> extra = {}) {
    log = tmp.file("peer-" + lane + ".log");
    std::vector<std::string> args = {tandem_bin(), "peer",      "--model", model, "--rowmap", rowmap, "--lane",
                                     lane,         "--threads", "2",       "--spin-us", "1000000000"};
    args.insert(args.end(), extra.begin(), extra.end());
    child = spawn(args, tmp.file("peer-" + lane + ".out"), log);
  }
  bool wait_serving() {
    return wait_until([&] { return read_file(log).find("serving") != std::string::npos || try_reap(child); }, 60) &&
           !child.reaped;
  }
  ~Peer() {
    if (!child.reaped) {
      kill(child.pid, SIGCONT);
      kill(child.pid, SIGTERM);
      wait_exit(child, 10);
    }
  }
};

// Suites on `tandem synth --preset tiny` with a third of the experts cold (ids 1, 4, 7, ...), made once
// per suite.
class TinyLaneModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    model_ = tmp_->path + "/tiny";
    auto r = run_bin({"synth", "--preset", "tiny", "--out", model_, "--seed", "3"}, *tmp_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rowmap_ = tmp_->path + "/tiny.rowmap.json";
    make_rowmap(model_, [](int64_t, int64_t e) { return e % 3 == 1; }).save(rowmap_);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static inline TempDir* tmp_ = nullptr;
  static inline std::string model_, rowmap_;
  TempDir tmp;
};

inline CudaOptions peer_options(const Rowmap& rm, const Model& model, const std::string& lane) {
  const ModelConfig& cfg = model.cfg;
  CudaOptions o;
  o.lane = CudaLane::kPeer;
  o.cold.assign(size_t(cfg.n_layer), {});
  for (const auto& l : rm.layers) o.cold[size_t(l.layer)] = l.cold;
  o.peer = lane;
  o.peer_fingerprint = lane_fingerprint(rm, 0, cold_weights_fingerprint(model, rm));
  o.peer_spin_limit_us = 100000;
  return o;
}

// The split lane: each cold expert's first features read over PCIe by the GPU, the rest computed by a
// `tandem peer --split-share F`; the sum is the local lane's function.
inline CudaOptions split_options(const Rowmap& rm, const Model& model, const std::string& lane, double fraction) {
  const ModelConfig& cfg = model.cfg;
  CudaOptions o = peer_options(rm, model, lane);
  o.lane = CudaLane::kSplit;
  o.split_begin = split_column(cfg.moe_intermediate_size, fraction);
  o.peer_fingerprint = lane_fingerprint(rm, o.split_begin, cold_weights_fingerprint(model, rm));
  return o;
}

inline std::vector<GenerateResult> greedy(Engine& e) {
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

inline void expect_same_generation(const std::vector<GenerateResult>& got, const std::vector<GenerateResult>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size());
    EXPECT_LT(max_rel_err(got[i].logits.data(), ref[i].logits.data(), int64_t(ref[i].logits.size())), 1e-4);
  }
}

// A fixture through the CUDA engine's peer (or split) lane with a `tandem peer` started with
// `peer_extra`: with every step checked on the CPU, the fixture's reference at 1e-4 and a minimum
// cosine ≥ 0.999 per layer; the engine closing the lane stops the peer (exit 0, segment gone); then
// with a second peer, the local lane's greedy tokens and logits (graphs captured and replayed).
inline void expect_lane_matches_local(const std::string& fixture, bool split,
                                      const std::vector<std::string>& peer_extra, const std::string& lane_tag,
                                      const TempDir& tmp) {
  const std::string dir = oracle_dir(fixture);
  auto model = Model::load(dir);
  const Rowmap rm = make_rowmap(dir, [](int64_t, int64_t e) { return e % 3 == 0; });
  const std::string rm_path = tmp.file("rowmap.json");
  rm.save(rm_path);
  auto options = [&](const std::string& lane) {
    return split ? split_options(rm, *model, lane, 0.5) : peer_options(rm, *model, lane);
  };
  std::vector<std::string> peer_args = peer_extra;
  if (split) peer_args.insert(peer_args.end(), {"--split-share", "0.5"});
  auto local = make_cuda_engine(*model, {}, {});
  const auto ref = greedy(*local);
  const std::string lane = unique_lane(((split ? "s" : "p") + lane_tag + fixture.substr(0, 7)).c_str());
  Peer peer(dir, rm_path, lane, tmp, peer_args);
  ASSERT_TRUE(peer.wait_serving()) << read_file(peer.log);
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
    // Per layer: cold slots only on MoE layers, adding up to the total, each within its layer's routed slots.
    ASSERT_EQ(st->cold_slots_by_layer.size(), size_t(model->cfg.n_layer));
    ASSERT_EQ(st->routed_slots_by_layer.size(), size_t(model->cfg.n_layer));
    uint64_t cold_sum = 0, routed_sum = 0;
    for (int64_t l = 0; l < model->cfg.n_layer; ++l) {
      if (!model->cfg.layer_is_moe[size_t(l)]) EXPECT_EQ(st->routed_slots_by_layer[size_t(l)], 0u) << "layer " << l;
      EXPECT_LE(st->cold_slots_by_layer[size_t(l)], st->routed_slots_by_layer[size_t(l)]) << "layer " << l;
      cold_sum += st->cold_slots_by_layer[size_t(l)];
      routed_sum += st->routed_slots_by_layer[size_t(l)];
    }
    EXPECT_EQ(cold_sum, st->cold_slots);
    EXPECT_EQ(routed_sum, st->routed_slots);
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
  ASSERT_TRUE(wait_exit(peer.child, 10));
  EXPECT_EQ(peer.child.exit_code, 0) << read_file(peer.log);
  EXPECT_FALSE(segment_exists(lane));
  const std::string lane2 = lane + "g";
  Peer peer2(dir, rm_path, lane2, tmp, peer_args);
  ASSERT_TRUE(peer2.wait_serving()) << read_file(peer2.log);
  auto engine = make_cuda_engine(*model, {}, options(lane2));
  expect_same_generation(greedy(*engine), ref);
  expect_same_generation(greedy(*engine), ref);  // replays of captured graphs
  auto st = cuda_peer_stats(*engine);
  EXPECT_EQ(st->client.overruns, 0u);
  EXPECT_GT(st->client.handoffs, 0u);
}

// A long streamed `tandem generate --lane peer` (on `primary_device`) against a peer started with
// `peer_extra` plus --delay-us 2000 (slow enough to be caught mid-run), a watchdog with a 1 s stall
// limit; after the first tokens the peer gets `signal` (SIGSTOP: frozen, SIGKILL: gone). The watchdog
// trips (exit 1, naming `cause`), the generate fails naming it too and prints nothing after the
// fault, and the segment is removed.
inline void expect_fault_fails_dark(const std::string& model, const std::string& rowmap, const std::string& lane,
                                    const std::string& primary_device, const std::vector<std::string>& peer_extra,
                                    int signal, const std::string& cause, const TempDir& tmp) {
  std::vector<std::string> peer_args = peer_extra;
  peer_args.insert(peer_args.end(), {"--delay-us", "2000"});
  Peer peer(model, rowmap, lane, tmp, peer_args);
  ASSERT_TRUE(peer.wait_serving()) << read_file(peer.log);
  Child wd = spawn({tandem_bin(), "watchdog", "--lane", lane, "--stall", "1", "--mode", "enforce"}, tmp.file("wd.out"),
                   tmp.file("wd.err"));
  Child primary = spawn({tandem_bin(), "generate", "--model", model, "--prompt", "Once upon a time", "--max-tokens",
                         "2000", "--ignore-eos", "--show-special", "--device", primary_device, "--lane", "peer",
                         "--peer", lane, "--rowmap", rowmap, "--threads", "2"},
                        tmp.file("p.out"), tmp.file("p.err"));
  ASSERT_TRUE(wait_until([&] { return read_file(tmp.file("p.out")).size() > 20; }, 60)) << read_file(tmp.file("p.err"));
  kill(peer.child.pid, signal);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a step already answered may finish
  const size_t at_fault = read_file(tmp.file("p.out")).size();
  EXPECT_TRUE(wait_exit(wd, 30));
  EXPECT_TRUE(wait_exit(primary, 30));
  const std::string err = read_file(tmp.file("p.err"));
  EXPECT_EQ(wd.exit_code, 1) << read_file(tmp.file("wd.out"));
  EXPECT_NE(read_file(tmp.file("wd.out")).find(cause), std::string::npos) << read_file(tmp.file("wd.out"));
  EXPECT_NE(primary.exit_code, 0);
  EXPECT_EQ(read_file(tmp.file("p.out")).size(), at_fault) << "tokens printed after the fault";
  EXPECT_NE(err.find(cause), std::string::npos) << err;
  wait_exit(peer.child, 20);
  EXPECT_FALSE(segment_exists(lane));
}

// Parameters (fixture, split) over the four oracle fixtures, each whole and split, and their test
// names: "<fixture>_split", or "<fixture><whole>" for the whole-expert case.
inline auto fixtures_whole_and_split() {
  return ::testing::Combine(::testing::Values("qwen3moe_f32", "mixtral_bf16", "olmoe_f32", "deepseekv3_f32"),
                            ::testing::Bool());
}
struct FixtureSplitName {
  const char* whole;
  std::string operator()(const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) const {
    return std::get<0>(info.param) + (std::get<1>(info.param) ? "_split" : whole);
  }
};

}  // namespace tandem::test
#endif
