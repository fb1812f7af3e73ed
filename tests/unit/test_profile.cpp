// `tandem profile` end to end on a tiny synthetic deepseek_v3 model with a byte-level tokenizer (one
// token per byte of ASCII text, so token counts are known): totals = tokens × k per layer, kinds and
// caps and the even/odd split, generate mode counting only decode steps, corpus errors (exit 2 with
// the line), the fingerprint `tandem info` shows, and plan → evaluate on the stats it writes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "placement/stats.h"
#include "test_util.h"

namespace tandem {
namespace {

struct Doc {
  std::string kind, name, text;
};

// Two kinds, documents of different lengths (some longer than the windows used below).
std::vector<Doc> corpus_docs() {
  std::vector<Doc> docs;
  for (int i = 0; i < 5; ++i) {
    std::string prose, code;
    for (int r = 0; r <= i; ++r) prose += "The quick brown fox jumps over the lazy dog. ";
    for (int r = 0; r < 2 + i; ++r) {
      code += "int f";
      code += std::to_string(r);
      code += "(int x) { return x * ";
      code += std::to_string(i);
      code += "; }\n";
    }
    std::string p_name = "p", c_name = "c";
    p_name += std::to_string(i);
    c_name += std::to_string(i);
    docs.push_back({"prose", p_name, prose});
    docs.push_back({"code", c_name, code});
  }
  return docs;
}

std::string to_jsonl(const std::vector<Doc>& docs) {
  std::string s;
  for (const Doc& d : docs) s += nlohmann::json{{"kind", d.kind}, {"name", d.name}, {"text", d.text}}.dump() + "\n";
  return s;
}

// Bytes (= tokens) per kind, over the documents whose index within their kind passes `keep`.
template <class Keep>
std::map<std::string, int64_t> bytes_by_kind(const std::vector<Doc>& docs, Keep keep) {
  std::map<std::string, int64_t> n, index;
  for (const Doc& d : docs)
    if (keep(index[d.kind]++)) n[d.kind] += int64_t(d.text.size());
  return n;
}

class Profile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::TempDir>();
    auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", model()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::write_file(corpus(), to_jsonl(corpus_docs()));
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::string model() { return dir_->file("model"); }
  static std::string corpus() { return dir_->file("corpus.jsonl"); }
  static std::string file(const std::string& name) { return dir_->file(name); }

  static test::CommandResult profile(std::vector<std::string> args) {
    std::vector<std::string> all = {"profile", "--model", model(), "--threads", "1"};
    all.insert(all.end(), args.begin(), args.end());
    return test::run_tandem(all);
  }
  // Every layer's rows summed over experts = tokens × k, per kind; gate weights positive.
  static void expect_full_rows(const ExpertStats& st) {
    for (const std::string& kind : st.kinds()) {
      const KindCounts* c = st.counts(kind);
      ASSERT_NE(c, nullptr);
      for (int64_t s = 0; s < st.n_moe_layer(); ++s) {
        int64_t rows = 0;
        double gate = 0;
        for (int64_t e = 0; e < st.n_expert(); ++e) {
          rows += c->rows[size_t(s * st.n_expert() + e)];
          gate += c->gate_weight[size_t(s * st.n_expert() + e)];
        }
        EXPECT_EQ(rows, c->tokens * st.n_expert_used()) << kind << " layer slot " << s;
        EXPECT_GT(gate, 0) << kind << " layer slot " << s;
      }
    }
  }

  static inline std::unique_ptr<test::TempDir> dir_;
};

TEST_F(Profile, TeacherCountsEveryPositionPerKind) {
  auto r = profile({"--corpus", corpus(), "--out", file("all.json"), "--window", "64", "--batch", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpertStats st = ExpertStats::load(file("all.json"));
  EXPECT_EQ(st.mode(), ProfileMode::kTeacher);
  auto want = bytes_by_kind(corpus_docs(), [](int64_t) { return true; });
  ASSERT_EQ(st.kinds(), (std::vector<std::string>{"code", "prose"}));
  for (const auto& [kind, n] : want) EXPECT_EQ(st.tokens(kind), n) << kind;
  EXPECT_EQ(st.n_expert(), 32);
  EXPECT_EQ(st.n_expert_used(), 4);
  EXPECT_EQ(st.moe_layers(), (std::vector<int64_t>{1, 2, 3}));  // tiny: layer 0 is dense
  expect_full_rows(st);
  EXPECT_EQ(st.meta().at("corpus"), corpus());
  EXPECT_EQ(st.meta().at("split"), "all");
  EXPECT_NE(r.out.find("wrote"), std::string::npos) << r.out;

  // The fingerprint in the stats is the one `tandem info` shows.
  auto info = test::run_tandem({"info", "--model", model()});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("model fingerprint " + st.fingerprint() + " "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("planner          fixed on the primary"), std::string::npos) << info.out;
}

TEST_F(Profile, CapsAndKinds) {
  auto r = profile({"--corpus", corpus(), "--out", file("cap.json"), "--max-tokens-per-kind", "100", "--window",
                    "32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpertStats st = ExpertStats::load(file("cap.json"));
  EXPECT_EQ(st.tokens("prose"), 100);
  EXPECT_EQ(st.tokens("code"), 100);
  expect_full_rows(st);

  // A total cap follows corpus order: the first document is prose (45 bytes), then code.
  r = profile({"--corpus", corpus(), "--out", file("total.json"), "--max-tokens", "70"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  st = ExpertStats::load(file("total.json"));
  EXPECT_EQ(st.total_tokens(), 70);
  EXPECT_EQ(st.tokens("prose"), 45);
  EXPECT_EQ(st.tokens("code"), 25);
  expect_full_rows(st);

  r = profile({"--corpus", corpus(), "--out", file("code.json"), "--kinds", "code"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  st = ExpertStats::load(file("code.json"));
  EXPECT_EQ(st.kinds(), std::vector<std::string>{"code"});
  EXPECT_EQ(st.tokens("code"), bytes_by_kind(corpus_docs(), [](int64_t) { return true; })["code"]);
}

TEST_F(Profile, EvenAndOddHalvesAddUpAndPlanEvaluate) {
  for (const char* half : {"all", "even", "odd"}) {
    auto r = profile({"--corpus", corpus(), "--out", file(std::string(half) + ".json"), "--split", half, "--batch",
                      "1", "--window", "48"});
    ASSERT_EQ(r.exit_code, 0) << half << ": " << r.err;
  }
  ExpertStats all = ExpertStats::load(file("all.json"));
  ExpertStats even = ExpertStats::load(file("even.json"));
  ExpertStats odd = ExpertStats::load(file("odd.json"));
  const auto docs = corpus_docs();
  auto want_even = bytes_by_kind(docs, [](int64_t i) { return i % 2 == 0; });
  auto want_odd = bytes_by_kind(docs, [](int64_t i) { return i % 2 == 1; });
  for (const std::string kind : {"code", "prose"}) {
    EXPECT_EQ(even.tokens(kind), want_even[kind]) << kind;
    EXPECT_EQ(odd.tokens(kind), want_odd[kind]) << kind;
  }
  EXPECT_EQ(even.meta().at("split"), "even");
  // Windows are independent sequences, so the halves partition the full run's traffic exactly.
  ExpertStats sum = even;
  sum.merge(odd);
  EXPECT_EQ(sum.total_rows(), all.total_rows());

  auto r = test::run_tandem({"plan", "--model", model(), "--stats", file("even.json"), "--cold-per-layer", "8",
                             "--out", file("rowmap.json")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_tandem({"plan", "--evaluate", file("rowmap.json"), "--stats", file("odd.json"), "--model", model()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"code", "prose", "all", "cold measured"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
}

TEST_F(Profile, GenerateCountsOnlyDecodeSteps) {
  // 8-token prompts, 5 decode steps each: prompt rows must not be counted (load would reject
  // rows > tokens × k, and expect_full_rows checks equality).
  auto r = profile({"--corpus", corpus(), "--out", file("gen.json"), "--mode", "generate", "--prompt-tokens", "8",
                    "--gen-tokens", "5", "--max-tokens-per-kind", "40", "--batch", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpertStats st = ExpertStats::load(file("gen.json"));
  EXPECT_EQ(st.mode(), ProfileMode::kGenerate);
  for (const char* kind : {"code", "prose"}) {
    EXPECT_GT(st.tokens(kind), 0) << kind;
    EXPECT_LE(st.tokens(kind), 40) << kind;
  }
  expect_full_rows(st);
  EXPECT_EQ(st.meta().at("gen_tokens"), "5");
}

TEST_F(Profile, BadCorpusLinesAreRejectedWithTheirLine) {
  const std::string good = R"({"kind": "prose", "name": "a", "text": "hello"})";
  struct Case {
    std::string third_line, message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"kind": "prose", "name": "b", "text": "unterminated)", ":3: malformed JSON"},
           {R"(["prose", "b", "text"])", ":3: expected a JSON object"},
           {R"({"kind": "prose", "name": "b"})", ":3: missing field \"text\""},
           {R"({"kind": 7, "name": "b", "text": "x"})", ":3: field \"kind\" must be a string"},
           {R"({"kind": "", "name": "b", "text": "x"})", ":3: field \"kind\" is empty"},
           {"{\"kind\": \"prose\", \"name\": \"b\", \"text\": \"\\udc00\"}", ":3:"},
       }) {
    test::write_file(file("bad.jsonl"), good + "\n\n" + c.third_line + "\n" + good + "\n");
    auto r = profile({"--corpus", file("bad.jsonl"), "--out", file("bad.json")});
    EXPECT_EQ(r.exit_code, 2) << c.third_line;
    EXPECT_NE(r.err.find("bad.jsonl" + c.message), std::string::npos) << c.third_line << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(file("bad.json"))) << c.third_line;
  }
}

TEST_F(Profile, BadOptionsAreRejected) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--kinds", "poetry"}, "no document of kind \"poetry\""},
           {{"--mode", "replay"}, "--mode must be teacher or generate"},
           {{"--window", "4096"}, "exceed the context limit of 2048"},
           {{"--ctx", "16", "--window", "32"}, "exceed the context limit of 16"},
           {{"--split", "third"}, "--split"},
       }) {
    std::vector<std::string> args = {"--corpus", corpus(), "--out", file("x.json")};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = profile(args);
    EXPECT_EQ(r.exit_code, 2) << c.args[0];
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args[0] << "\n" << r.err;
  }
  auto r = profile({"--corpus", file("missing.jsonl"), "--out", file("x.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot open corpus"), std::string::npos) << r.err;

  // A model folder without tokenizer.json.
  const std::string bare = file("bare");
  std::filesystem::create_directory(bare);
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(model() + "/" + f, bare + "/" + f);
  r = test::run_tandem({"profile", "--model", bare, "--corpus", corpus(), "--out", file("x.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no tokenizer.json"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
