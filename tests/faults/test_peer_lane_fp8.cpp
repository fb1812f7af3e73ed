// The CPU peer lane on FP8 checkpoints, with the real binaries: the peer holds its cold experts in FP8
// with their block scales (bytes = weights + scale grids) and computes them with the same kernels as
// the local lane, so `verify --lane peer` passes the FP8 fixtures and greedy tokens equal the local
// lane's. The split lane, which slices experts, refuses FP8 with a clear error instead. --weights fp8
// (quantize at load) needs the peer, the primary and the rowmap to agree, and then gives local tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "../lane_tools/peer_child.h"
#include "../lane_tools/process.h"
#include "../lane_tools/rowmap_util.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"
#include "test_util.h"

namespace tandem {
namespace {

std::string unique_lane(const char* what) { return fmt::format("lt8-{}-{}", getpid(), what); }

using Peer = test::PeerChild;

std::vector<int32_t> tokens_of(const std::string& json_out) {
  return nlohmann::json::parse(json_out)["results"][0]["tokens"].get<std::vector<int32_t>>();
}

class PeerLaneFp8 : public ::testing::TestWithParam<std::string> {
 protected:
  test::TempDir tmp;
};

TEST_P(PeerLaneFp8, VerifiesThroughThePeerWithLocalTokensAndFp8Bytes) {
  const std::string dir = test::oracle_dir(GetParam());
  const std::string rm = tmp.file("rowmap.json");
  test::write_rowmap(dir, rm, [](int64_t, int64_t e) { return e % 3 == 0; });  // 6 of 16 per layer
  {
    const std::string lane = unique_lane("verify");
    Peer peer(dir, rm, lane, tmp);
    ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
    auto r = test::run_tandem({"verify", "--model", dir, "--expected", dir + "/expected.safetensors", "--lane", "peer",
                               "--peer", lane, "--rowmap", rm, "--threads", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("verify: PASS"), std::string::npos) << r.out;
    ASSERT_TRUE(test::wait_exit(peer.child, 10));
    EXPECT_EQ(peer.child.exit_code, 0) << test::read_file(peer.log);
    // What the peer holds: its cold experts in FP8 plus their scale grids, nothing widened.
    auto model = Model::load(dir);
    size_t want = 0;
    int64_t n_cold = 0;
    for (int64_t l = 0; l < model->cfg.n_layer; ++l)
      for (int64_t e = 0; e < model->cfg.n_expert; e += 3)
        if (model->cfg.layer_is_moe[size_t(l)]) want += model->layers[size_t(l)].experts[size_t(e)].nbytes(), ++n_cold;
    std::smatch m;
    const std::string log = test::read_file(peer.log);
    ASSERT_TRUE(std::regex_search(log, m, std::regex(R"((\d+) cold experts in \d+ layers, [^\n]* held \((\d+) bytes\))")))
        << log;
    EXPECT_EQ(std::stoll(m[1]), n_cold);
    EXPECT_EQ(size_t(std::stoll(m[2])), want);
  }
  const std::string prompt = "5,17,99,3,250,7,8,42,300,301,7";  // the fixtures have no tokenizer.json
  auto local = test::run_tandem({"generate", "--model", dir, "--prompt-ids", prompt, "--max-tokens", "16", "--json",
                                 "--ignore-eos", "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = unique_lane("greedy");
  Peer peer(dir, rm, lane, tmp);
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  auto remote = test::run_tandem({"generate", "--model", dir, "--prompt-ids", prompt, "--max-tokens", "16", "--json",
                                  "--ignore-eos", "--lane", "peer", "--peer", lane, "--rowmap", rm, "--threads", "1"});
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_EQ(tokens_of(local.out).size(), 16u);
  EXPECT_EQ(tokens_of(local.out), tokens_of(remote.out));
}

TEST_P(PeerLaneFp8, SplitLaneRefusesFp8Experts) {
  const std::string dir = test::oracle_dir(GetParam());
  const std::string rm = tmp.file("rowmap.json");
  test::write_rowmap(dir, rm, [](int64_t, int64_t e) { return e % 3 == 0; });
  Peer peer(dir, rm, unique_lane("split"), tmp, {"--split-share", "0.5"});
  ASSERT_TRUE(test::wait_exit(peer.child, 30));
  EXPECT_EQ(peer.child.exit_code, 2);
  EXPECT_NE(test::read_file(peer.log).find("split lane does not support FP8"), std::string::npos)
      << test::read_file(peer.log);
}

// --weights fp8 on a float checkpoint: the routed experts are quantized as they load, the model
// fingerprint says so, so a rowmap planned without it is refused; with it on both sides the peer lane
// gives the local lane's greedy tokens.
TEST(WeightsFp8AtLoad, PeerAndPrimaryMustAgreeAndThenGiveLocalTokens) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("deepseekv3_f32");
  const std::string plain = tmp.file("plain.rowmap.json"), fp8 = tmp.file("fp8.rowmap.json");
  auto cold = [](int64_t, int64_t e) { return e % 3 == 0; };
  test::write_rowmap(dir, plain, cold);
  Rowmap rm = test::make_rowmap(dir, cold);
  ModelConfig cfg = load_config(dir);
  apply_weights_option(cfg, "fp8");
  rm.fingerprint = model_fingerprint(cfg, TensorStore::open_dir(dir));
  rm.finalize();
  rm.save(fp8);
  // plan --check: the plain rowmap is for the float model, not for its FP8-at-load twin.
  auto ok = test::run_tandem({"plan", "--model", dir, "--check", fp8, "--weights", "fp8"});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  auto mismatch = test::run_tandem({"plan", "--model", dir, "--check", plain, "--weights", "fp8"});
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.out << mismatch.err;
  {
    Peer peer(dir, plain, unique_lane("mismatch"), tmp, {"--weights", "fp8"});
    ASSERT_TRUE(test::wait_exit(peer.child, 30));
    EXPECT_EQ(peer.child.exit_code, 2);
    EXPECT_NE(test::read_file(peer.log).find("rowmap was planned for model"), std::string::npos)
        << test::read_file(peer.log);
  }
  const std::string ids = "5,17,99,3,250,7,8,42,300,301,7";
  auto local = test::run_tandem({"generate", "--model", dir, "--prompt-ids", ids, "--max-tokens", "12", "--json",
                                 "--ignore-eos", "--threads", "1", "--weights", "fp8"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string lane = unique_lane("atload");
  Peer peer(dir, fp8, lane, tmp, {"--weights", "fp8"});
  ASSERT_TRUE(peer.wait_serving()) << test::read_file(peer.log);
  auto remote = test::run_tandem({"generate", "--model", dir, "--prompt-ids", ids, "--max-tokens", "12", "--json",
                                  "--ignore-eos", "--lane", "peer", "--peer", lane, "--rowmap", fp8, "--threads", "1",
                                  "--weights", "fp8"});
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_EQ(tokens_of(local.out).size(), 12u);
  EXPECT_EQ(tokens_of(local.out), tokens_of(remote.out));
  // The peer holds the cold experts at FP8 size: 1 byte a weight plus one F32 scale per 128x128 block
  // (the f32 fixture's experts are 32x64 / 64x32: one block each).
  auto model = Model::load(dir);
  const int64_t inter = model->cfg.moe_intermediate_size, hidden = model->cfg.hidden_size;
  std::smatch m;
  const std::string log = test::read_file(peer.log);
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"((\d+) cold experts in \d+ layers, [^\n]* held \((\d+) bytes\))")))
      << log;
  EXPECT_EQ(std::stoll(m[2]), std::stoll(m[1]) * (3 * inter * hidden + 3 * 4));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeerLaneFp8, ::testing::Values("deepseekv3_fp8", "qwen3moe_fp8"));

}  // namespace
}  // namespace tandem
