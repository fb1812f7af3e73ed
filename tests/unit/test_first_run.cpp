// What a first-time user meets: the corpus → profile → plan path of docs/quickstart.md on a synthetic
// model, `--version`, help that lists only the options a command uses, and messages that say what to add.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// A folder of text of two kinds, as a user's own documents and code would be.
struct Tree {
  test::TempDir tmp;
  std::string root = tmp.file("text");
  Tree() {
    fs::create_directories(root);
    test::write_file(root + "/notes.md", "# Notes\nThe sidecar computes the cold experts.\n");
    test::write_file(root + "/fib.py", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n");
  }
};

// The three commands of docs/quickstart.md on a synthetic model: corpus → profile → plan.
TEST(FirstRun, CorpusProfilePlanOnASyntheticModel) {
  Tree t;
  const std::string model = t.tmp.file("model"), corpus = t.tmp.file("corpus.jsonl");
  ASSERT_EQ(test::run_tandem({"synth", "--preset", "tiny", "--out", model, "--seed", "1"}).exit_code, 0);
  ASSERT_EQ(test::run_tandem({"corpus", t.root, "--out", corpus}).exit_code, 0);
  auto r = test::run_tandem({"profile", "--model", model, "--corpus", corpus, "--out", t.tmp.file("stats.json"),
                             "--threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("code_python"), std::string::npos) << r.out;
  r = test::run_tandem({"plan", "--model", model, "--stats", t.tmp.file("stats.json"), "--cold-per-layer", "8", "--out",
                        t.tmp.file("rowmap.json")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("KV tokens"), std::string::npos) << r.out;  // no memory budget: no KV column
  EXPECT_NE(r.out.find("--primary-memory SIZE"), std::string::npos) << r.out;
  // A memory budget the size of a small model: the default reserve scales with it, so rows fit.
  r = test::run_tandem({"plan", "--model", model, "--stats", t.tmp.file("stats.json"), "--primary-memory", "16MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(default: 10% of it, at most 1 GiB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV tokens"), std::string::npos) << r.out;
  // --out without --kv-tokens: the table is printed, then exit 2 saying what to add.
  r = test::run_tandem({"plan", "--model", model, "--stats", t.tmp.file("stats.json"), "--primary-memory", "16MiB",
                        "--out", t.tmp.file("x.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("KV tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("--primary-memory needs --kv-tokens N"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t.tmp.file("x.json")));
}

TEST(FirstRun, VersionAndHelp) {
  auto r = test::run_tandem({"--version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("tandem ", 0), 0u) << r.out;
  // Commands that run the model on their own list no lane or CUDA options.
  for (const char* cmd : {"profile", "info", "plan", "synth", "tokenize", "corpus"}) {
    r = test::run_tandem({cmd, "--help"});
    EXPECT_EQ(r.exit_code, 0) << cmd;
    for (const char* opt : {"--lane", "--peer", "--host-wait", "--split-share", "--peer-spin-limit"})
      EXPECT_EQ(r.out.find(opt), std::string::npos) << cmd << " lists " << opt << "\n" << r.out;
  }
  r = test::run_tandem({"generate", "--help"});
  EXPECT_NE(r.out.find("--lane"), std::string::npos) << r.out;
  r = test::run_tandem({"plan", "--help"});
  EXPECT_NE(r.out.find("REQUIRED"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
