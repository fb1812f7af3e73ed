// Bad checkpoints and options through the CLI: each gets a clear error naming the file/tensor/field and exit code 2.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "lane_tools/process.h"
#include "lane_tools/rowmap_util.h"
#include "runtime/lane.h"
#include "test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A copy of the qwen3 fixture that a test may damage.
struct ModelCopy {
  test::TempDir tmp;
  std::string dir = tmp.path + "/model";
  ModelCopy() {
    fs::create_directory(dir);
    const std::string src = test::oracle_dir("qwen3moe_f32");
    fs::copy_file(src + "/config.json", dir + "/config.json");
    fs::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
  }
  json config() const { return json::parse(test::read_file(dir + "/config.json")); }
  void set_config(const json& j) const { test::write_file(dir + "/config.json", j.dump()); }
  std::string weights() const { return test::read_file(dir + "/model.safetensors"); }
  void set_weights(const std::string& bytes) const { test::write_file(dir + "/model.safetensors", bytes); }
};

void expect_bad(const std::string& dir, const std::vector<std::string>& words) {
  for (const char* cmd : {"info", "generate"}) {
    std::vector<std::string> args = {cmd, "--model", dir};
    if (std::string(cmd) == "generate") args.insert(args.end(), {"--prompt-ids", "1,2,3", "--max-tokens", "2"});
    auto r = test::run_tandem(args);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    for (const auto& w : words) EXPECT_NE(r.err.find(w), std::string::npos) << cmd << ": '" << w << "' not in: " << r.err;
  }
}

// Rewrites the JSON header of a safetensors byte string (keeps the data area).
std::string with_header(const std::string& file, const std::function<void(json&)>& edit) {
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  json h = json::parse(file.substr(8, n));
  edit(h);
  std::string text = h.dump();
  while ((text.size() + 8) % 8) text += ' ';
  uint64_t m = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &m, 8);
  return out + text + file.substr(8 + n);
}

TEST(BadCheckpoint, GoodCopyLoads) {
  ModelCopy m;
  auto r = test::run_tandem({"info", "--model", m.dir});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(BadCheckpoint, EmptyFolderAndMissingFolder) {
  test::TempDir tmp;
  expect_bad(tmp.path, {tmp.path});
  expect_bad(tmp.path + "/nope", {"nope"});
}

TEST(BadCheckpoint, UnknownModelTypeListsSupported) {
  ModelCopy m;
  json c = m.config();
  c["model_type"] = "llama";
  m.set_config(c);
  expect_bad(m.dir, {"config.json", "llama", "qwen3_moe, mixtral, olmoe, deepseek_v3"});
}

TEST(BadCheckpoint, MissingConfigField) {
  ModelCopy m;
  json c = m.config();
  c.erase("hidden_size");
  m.set_config(c);
  expect_bad(m.dir, {"config.json", "hidden_size"});
}

TEST(BadCheckpoint, MalformedConfig) {
  ModelCopy m;
  test::write_file(m.dir + "/config.json", "{\"model_type\": ");
  expect_bad(m.dir, {"config.json", "malformed"});
}

TEST(BadCheckpoint, HeaderLengthOverLimit) {
  ModelCopy m;
  std::string w = m.weights();
  uint64_t huge = 200'000'000;
  std::memcpy(w.data(), &huge, 8);
  m.set_weights(w);
  expect_bad(m.dir, {"model.safetensors", "header"});
}

TEST(BadCheckpoint, MalformedHeaderJson) {
  ModelCopy m;
  std::string w = m.weights();
  w[8] = '[';
  w[9] = '}';
  m.set_weights(w);
  expect_bad(m.dir, {"model.safetensors"});
}

TEST(BadCheckpoint, TruncatedFile) {
  ModelCopy m;
  std::string w = m.weights();
  m.set_weights(w.substr(0, w.size() - 100));
  expect_bad(m.dir, {"model.safetensors"});
}

TEST(BadCheckpoint, ByteRangeOutsideFile) {
  ModelCopy m;
  m.set_weights(with_header(m.weights(), [](json& h) {
    auto& t = h["model.norm.weight"];
    uint64_t b = t["data_offsets"][0];
    t["data_offsets"] = {b + (uint64_t(1) << 40), b + (uint64_t(1) << 40) + 256};
  }));
  expect_bad(m.dir, {"model.safetensors", "model.norm.weight"});
}

TEST(BadCheckpoint, OverlappingRanges) {
  ModelCopy m;
  m.set_weights(with_header(m.weights(), [](json& h) {
    h["model.norm.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"];
    h["model.norm.weight"]["shape"] = h["model.embed_tokens.weight"]["shape"];
  }));
  expect_bad(m.dir, {"model.safetensors"});
}

TEST(BadCheckpoint, SizeInconsistentWithDtypeAndShape) {
  ModelCopy m;
  m.set_weights(with_header(m.weights(), [](json& h) { h["model.norm.weight"]["dtype"] = "BF16"; }));
  expect_bad(m.dir, {"model.safetensors", "model.norm.weight"});
}

TEST(BadCheckpoint, RequiredTensorMissing) {
  ModelCopy m;
  // Rename a tensor: the file stays valid, the model lacks a required tensor.
  m.set_weights(with_header(m.weights(), [](json& h) {
    h["model.layers.1.mlp.experts.3.up_proj.renamed"] = h["model.layers.1.mlp.experts.3.up_proj.weight"];
    h.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  }));
  expect_bad(m.dir, {"model.layers.1.mlp.experts.3.up_proj.weight", "missing"});
}

TEST(BadCheckpoint, RequiredTensorWrongShape) {
  ModelCopy m;
  m.set_weights(with_header(m.weights(), [](json& h) { h["model.norm.weight"]["shape"] = {8, 8}; }));
  expect_bad(m.dir, {"model.norm.weight", "[8, 8]", "[64]"});
}

TEST(BadCheckpoint, ConfigDisagreesWithTensors) {
  ModelCopy m;
  json c = m.config();
  c["moe_intermediate_size"] = 40;
  m.set_config(c);
  expect_bad(m.dir, {"gate_proj.weight", "[40, 64]"});
}

TEST(BadInput, PromptIdsOutOfVocab) {
  auto r = test::run_tandem({"generate", "--model", test::oracle_dir("qwen3moe_f32"), "--prompt-ids", "1,99999"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("99999"), std::string::npos) << r.err;
  auto r2 = test::run_tandem({"generate", "--model", test::oracle_dir("qwen3moe_f32"), "--prompt-ids", "1,x"});
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.err.find("'x'"), std::string::npos) << r2.err;
}

TEST(BadInput, SynthThatCannotWriteItsWeightsLeavesNoConfig) {
  test::TempDir tmp;
  const std::string dir = tmp.path + "/model";
  fs::create_directories(dir + "/model.safetensors");  // the weights' name taken by a folder: the rename fails
  auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", dir});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("cannot write " + dir + "/model.safetensors"), std::string::npos) << r.err;
  // config.json is written last: a folder holding one holds finished weights.
  EXPECT_FALSE(fs::exists(dir + "/config.json"));
  EXPECT_FALSE(fs::exists(dir + "/tokenizer.json"));
  fs::remove(dir + "/model.safetensors");
  r = test::run_tandem({"synth", "--preset", "tiny", "--out", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_EQ(test::run_tandem({"info", "--model", dir}).exit_code, 0);
}

TEST(BadInput, UnknownFlagIsExitTwo) {
  auto r = test::run_tandem({"generate", "--no-such-flag"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(HostWait, AutoSleepsOnTheLanesWithAPeer) {
  for (Lane lane : {Lane::kPeer, Lane::kSplit}) EXPECT_TRUE(host_wait_sleeps(HostWait::kAuto, lane)) << lane_name(lane);
  for (Lane lane : {Lane::kLocal, Lane::kHost}) EXPECT_FALSE(host_wait_sleeps(HostWait::kAuto, lane)) << lane_name(lane);
  for (Lane lane : {Lane::kLocal, Lane::kHost, Lane::kPeer, Lane::kSplit}) {
    EXPECT_TRUE(host_wait_sleeps(HostWait::kSleep, lane)) << lane_name(lane);
    EXPECT_FALSE(host_wait_sleeps(HostWait::kSpin, lane)) << lane_name(lane);
  }
}

TEST(BadInput, HostWaitMustBeAutoSpinOrSleep) {
  auto r = test::run_tandem(
      {"generate", "--model", test::oracle_dir("qwen3moe_f32"), "--prompt-ids", "1,2", "--host-wait", "nap"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--host-wait"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nap"), std::string::npos) << r.err;
}

// Starts `tandem peer` on the qwen3 fixture with each of `values` for `flag`: every one must end at
// once with exit 2, the message containing `expect` (with the value in place of {}), and no segment;
// `extra` are further arguments.
// Bounded: a peer that wrongly accepted the value would serve forever.
void expect_peer_refuses(const std::string& flag, const std::vector<std::string>& values, const std::string& expect,
                         const std::vector<std::string>& extra = {}) {
  test::TempDir tmp;
  const std::string dir = test::oracle_dir("qwen3moe_f32");
  const std::string rowmap = tmp.file("rowmap.json");
  test::write_rowmap(dir, rowmap, [](int64_t, int64_t e) { return e % 2 == 0; });
  static int n = 0;
  for (const std::string& value : values) {
    const std::string lane = fmt::format("badpeer-{}-{}", getpid(), n++);
    std::vector<std::string> args = {test::tandem_binary(), "peer", "--model", dir, "--rowmap", rowmap, "--lane", lane,
                                     flag, value};
    args.insert(args.end(), extra.begin(), extra.end());
    test::Child c = test::spawn(args, tmp.file("out"), tmp.file("err"));
    ASSERT_TRUE(test::wait_exit(c, 60)) << flag << " " << value << ": still running";
    const std::string err = test::read_file(tmp.file("err"));
    EXPECT_EQ(c.exit_code, 2) << value << ": " << err;
    std::string want = expect;
    if (const size_t at = want.find("{}"); at != std::string::npos) want.replace(at, 2, value);
    EXPECT_NE(err.find(want), std::string::npos) << "'" << want << "' not in: " << err;
    EXPECT_FALSE(fs::exists("/dev/shm/tandem-" + lane)) << value;
  }
}

// `tandem peer --device` that names no device here: exit 2 with the value in the message, before any
// segment exists (with or without the CUDA backend, with or without a GPU).
TEST(BadInput, PeerOnADeviceThatIsNotThereCreatesNoSegment) {
  expect_peer_refuses("--device", {"bogus", "cuda:99", "cuda:x"}, "error: --device {}: ");
}

// `tandem peer --worker-spin-us` outside [0, 10 s] or not a number: a usage error before anything is loaded.
TEST(BadInput, PeerWorkerSpinOutOfRangeIsAUsageError) {
  expect_peer_refuses("--worker-spin-us", {"-1", "10000001", "soon"}, "--worker-spin-us");
}

// `tandem peer --split-share` that is neither a share in (0, 1), 0 (whole experts) nor auto: exit 2
// before anything is loaded.
TEST(BadInput, PeerSplitShareOutsideTheOpenIntervalIsRefused) {
  expect_peer_refuses("--split-share", {"1", "1.5", "-0.2", "0.4x", "half"}, "--split-share {}: give a share");
}

// `--split-share auto` measures the link from the primary's GPU: with none to measure (no CUDA backend,
// or no GPU cuda:99) the peer says to give --link-gbps, and creates no segment.
TEST(BadInput, PeerSplitShareAutoWithoutALinkToMeasureSaysSo) {
  expect_peer_refuses("--split-share", {"auto"}, "give --link-gbps G", {"--link-device", "cuda:99"});
}

TEST(BadInput, PrimarySplitShareIsCheckedOnEveryLane) {
  auto r = test::run_tandem(
      {"generate", "--model", test::oracle_dir("qwen3moe_f32"), "--prompt-ids", "1,2", "--split-share", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--split-share 0: give a share"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
