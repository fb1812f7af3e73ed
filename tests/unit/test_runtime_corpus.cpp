// One corpus reader (io/corpus) for every command: the same bad file is refused by `tandem profile` and
// `tandem bench` with the same message, which is the reader's own; the corpora the repo ships and
// `tandem corpus` writes are read by both.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/corpus.h"
#include "test_util.h"

namespace tandem {
namespace {

// The first "error: " line of a command's stderr, without the prefix.
std::string error_line(const std::string& err) {
  const size_t at = err.find("error: ");
  if (at == std::string::npos) return "";
  const size_t end = err.find('\n', at);
  return err.substr(at + 7, (end == std::string::npos ? err.size() : end) - at - 7);
}

std::string reader_error(const std::string& path, const std::vector<std::string>& kinds) {
  try {
    load_corpus(path, kinds);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(OneCorpusReader, TheSameBadFileGetsTheSameMessageFromEveryCommand) {
  test::TempDir tmp;
  const std::string model = tmp.file("tiny");
  auto r = test::run_tandem({"synth", "--preset", "tiny", "--out", model, "--seed", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string good = R"({"kind": "prose", "name": "a", "text": "hello there"})";
  struct Case {
    std::string third_line, message;
  };
  const std::vector<Case> cases = {
      {R"({"kind": "prose", "name": "b", "text": "unterminated)", ":3: malformed JSON"},
      {R"(["prose", "b", "text"])", ":3: expected a JSON object"},
      {R"({"kind": "prose", "name": 3, "text": "x"})", ":3: field \"name\" must be a string"},
      {R"({"kind": "prose", "name": "b"})", ":3: missing field \"text\""},
      {R"({"kind": 7, "name": "b", "text": "x"})", ":3: field \"kind\" must be a string"},
      {R"({"kind": "", "name": "b", "text": "x"})", ":3: field \"kind\" is empty"},
  };
  const std::string path = tmp.file("bad.jsonl");
  for (const Case& c : cases) {
    test::write_file(path, good + "\n\n" + c.third_line + "\n" + good + "\n");
    const std::string want = reader_error(path, {"prose"});
    EXPECT_NE(want.find("bad.jsonl" + c.message), std::string::npos) << c.third_line << ": " << want;
    const auto profile =
        test::run_tandem({"profile", "--model", model, "--corpus", path, "--kinds", "prose", "--out", tmp.file("s.json")});
    const auto bench = test::run_tandem({"bench", "--model", model, "--corpus", path, "--kinds", "prose", "--lanes",
                                         "local", "--threads", "1", "--out-dir", tmp.file("out")});
    EXPECT_EQ(profile.exit_code, 2) << c.third_line << ": " << profile.err;
    EXPECT_EQ(bench.exit_code, 2) << c.third_line << ": " << bench.err;
    EXPECT_EQ(error_line(profile.err), want) << c.third_line;
    EXPECT_EQ(error_line(bench.err), want) << c.third_line;
  }
  // A kind the file lacks: the same message too, naming the kinds it has.
  test::write_file(path, good + "\n");
  const std::string want = reader_error(path, {"poetry"});
  EXPECT_NE(want.find("no document of kind \"poetry\""), std::string::npos) << want;
  EXPECT_NE(want.find("(kinds: prose)"), std::string::npos) << want;
  const auto profile =
      test::run_tandem({"profile", "--model", model, "--corpus", path, "--kinds", "poetry", "--out", tmp.file("s.json")});
  const auto bench = test::run_tandem({"bench", "--model", model, "--corpus", path, "--kinds", "poetry", "--lanes",
                                       "local", "--threads", "1", "--out-dir", tmp.file("out")});
  EXPECT_EQ(error_line(profile.err), want);
  EXPECT_EQ(error_line(bench.err), want);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("out")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("s.json")));
}

TEST(OneCorpusReader, KeepsLinesKindsAndOrder) {
  test::TempDir tmp;
  const std::string path = tmp.file("c.jsonl");
  test::write_file(path, "{\"kind\": \"code\", \"name\": \"x\", \"text\": \"int a;\", \"extra\": 1}\r\n"
                         "   \n"
                         "{\"kind\": \"prose\", \"name\": \"y\", \"text\": \"Hi.\"}\n"
                         "{\"kind\": \"code\", \"name\": \"z\", \"text\": \"\"}\n");
  const auto all = load_corpus(path);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].kind, "code");
  EXPECT_EQ(all[0].text, "int a;");  // the '\r' of a CRLF line is not part of the JSON
  EXPECT_EQ(all[1].line, 3);
  EXPECT_EQ(all[2].line, 4);
  // "name" is optional (bench and check always took such documents; profile takes them now).
  test::write_file(tmp.file("noname.jsonl"), "{\"kind\": \"prose\", \"text\": \"no name\"}\n");
  const auto unnamed = load_corpus(tmp.file("noname.jsonl"));
  ASSERT_EQ(unnamed.size(), 1u);
  EXPECT_EQ(unnamed[0].name, "");
  EXPECT_EQ(unnamed[0].text, "no name");
  const auto code = load_corpus(path, {"code"});
  ASSERT_EQ(code.size(), 2u);
  EXPECT_EQ(code[0].name, "x");
  EXPECT_EQ(code[1].name, "z");
  test::write_file(path, "\n  \n");
  EXPECT_NE(reader_error(path, {}).find("has no documents"), std::string::npos);
  EXPECT_NE(reader_error(tmp.file("missing.jsonl"), {}).find("cannot open corpus"), std::string::npos);
}

// The corpus the repo's demo and benchmarks read, when the shared set is there.
TEST(OneCorpusReader, ReadsTheSharedCorpus) {
  const std::string shared = test::shared_dir();
  if (shared.empty() || !std::filesystem::exists(shared + "/corpus/public.jsonl"))
    GTEST_SKIP() << "no ../shared/corpus/public.jsonl";
  EXPECT_GT(load_corpus(shared + "/corpus/public.jsonl").size(), 100u);
}

}  // namespace
}  // namespace tandem
