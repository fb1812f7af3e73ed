// `tandem corpus`: text files and folders → the JSON-lines corpus that profile, check and bench read.
// Kinds from extensions or --kind; binary, empty and unknown files skipped with a note; clear errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/corpus.h"
#include "io/corpus_build.h"
#include "test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Corpus, KindsFromExtensions) {
  EXPECT_EQ(corpus_kind_for_path("docs/README.md"), "prose");
  EXPECT_EQ(corpus_kind_for_path("notes.TXT"), "prose");
  EXPECT_EQ(corpus_kind_for_path("a/b/train.py"), "code_python");
  for (const char* p : {"x.c", "x.h", "x.cpp", "x.hpp", "x.cu"}) EXPECT_EQ(corpus_kind_for_path(p), "code_c") << p;
  EXPECT_EQ(corpus_kind_for_path("config.json"), "json");
  EXPECT_EQ(corpus_kind_for_path("run.sh"), "shell");
  EXPECT_EQ(corpus_kind_for_path("image.png"), std::nullopt);
  EXPECT_EQ(corpus_kind_for_path("Makefile"), std::nullopt);
  EXPECT_NE(corpus_kind_table().find("code_python: .py"), std::string::npos);
}

TEST(Corpus, TextIsWellFormedUtf8WithoutNul) {
  EXPECT_EQ(why_not_text("plain ascii\n"), "");
  EXPECT_EQ(why_not_text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "");  // é € 😀
  EXPECT_NE(why_not_text(std::string("a\0b", 3)).find("NUL byte at 1"), std::string::npos);
  EXPECT_NE(why_not_text("ab\xff").find("not UTF-8 at byte 2"), std::string::npos);
  EXPECT_NE(why_not_text("\xc0\x80"), "");          // overlong NUL
  EXPECT_NE(why_not_text("\xed\xa0\x80"), "");      // a surrogate
  EXPECT_NE(why_not_text("\xf4\x90\x80\x80"), "");  // above U+10FFFF
  EXPECT_NE(why_not_text("x\xe2\x82").find("truncated"), std::string::npos);
}

struct Tree {
  test::TempDir tmp;
  std::string root = tmp.file("text");
  Tree() {
    fs::create_directories(root + "/sub");
    fs::create_directories(root + "/.git");
    test::write_file(root + "/b.md", "# Title\nSome prose.\n");
    test::write_file(root + "/a.py", "print('hi')\n");
    test::write_file(root + "/sub/c.h", "int f(void);\n");
    test::write_file(root + "/.git/config.txt", "hidden\n");
    test::write_file(root + "/data.bin", "whatever");
    test::write_file(root + "/blob.txt", std::string("\x7f" "ELF\0\0\0", 7));
    test::write_file(root + "/empty.txt", "");
  }
};

TEST(Corpus, FolderByExtensionSkipsWhatIsNotText) {
  Tree t;
  CorpusBuild b = build_corpus({t.root}, {});
  ASSERT_EQ(b.docs.size(), 3u);
  EXPECT_EQ(b.docs[0].name, t.root + "/a.py");  // sorted by path
  EXPECT_EQ(b.docs[0].kind, "code_python");
  EXPECT_EQ(b.docs[1].kind, "prose");
  EXPECT_EQ(b.docs[1].text, "# Title\nSome prose.\n");
  EXPECT_EQ(b.docs[2].name, t.root + "/sub/c.h");
  EXPECT_EQ(b.docs[2].kind, "code_c");
  std::string notes;
  for (const auto& n : b.notes) notes += n + "\n";
  EXPECT_NE(notes.find("blob.txt: binary, not text (NUL byte at 4)"), std::string::npos) << notes;
  EXPECT_NE(notes.find("empty.txt: empty"), std::string::npos) << notes;
  EXPECT_NE(notes.find("skipped 1 file(s) of no known kind (.bin 1)"), std::string::npos) << notes;
  EXPECT_EQ(notes.find(".git"), std::string::npos) << notes;  // hidden entries are not even looked at
}

TEST(Corpus, OneKindForEveryFile) {
  Tree t;
  CorpusBuild b = build_corpus({t.root + "/data.bin", t.root + "/a.py"}, {"notes", 0});
  ASSERT_EQ(b.docs.size(), 2u);
  EXPECT_EQ(b.docs[0].kind, "notes");
  EXPECT_EQ(b.docs[0].name, t.root + "/data.bin");
  EXPECT_EQ(b.docs[1].kind, "notes");
}

TEST(Corpus, ClearErrors) {
  Tree t;
  EXPECT_NE(error_of([&] { build_corpus({}, {}); }).find("no input"), std::string::npos);
  EXPECT_NE(error_of([&] { build_corpus({t.root + "/nope.md"}, {}); }).find("nope.md: no such file or folder"),
            std::string::npos);
  const std::string unknown = error_of([&] { build_corpus({t.root + "/data.bin"}, {}); });
  EXPECT_NE(unknown.find("data.bin: cannot tell its kind"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("--kind"), std::string::npos) << unknown;
  const std::string none = error_of([&] { build_corpus({t.root + "/blob.txt", t.root + "/empty.txt"}, {}); });
  EXPECT_NE(none.find("no text documents found"), std::string::npos) << none;
  EXPECT_NE(none.find("blob.txt: binary"), std::string::npos) << none;
  const std::string big = error_of([&] { build_corpus({t.root + "/b.md"}, {"", 4}); });
  EXPECT_NE(big.find("over --max-file-bytes 4"), std::string::npos) << big;
  if (geteuid() != 0) {  // root reads any file
    chmod((t.root + "/a.py").c_str(), 0);
    const std::string unreadable = error_of([&] { build_corpus({t.root}, {}); });
    EXPECT_NE(unreadable.find("cannot read " + t.root + "/a.py"), std::string::npos) << unreadable;
  }
}

TEST(Corpus, CommandWritesWhatProfileAndCheckRead) {
  Tree t;
  const std::string out = t.tmp.file("corpus.jsonl");
  auto r = test::run_tandem({"corpus", t.root, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("corpus: 3 documents written to " + out), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skipped " + t.root + "/blob.txt: binary"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("next: tandem profile"), std::string::npos) << r.err;
  auto docs = load_corpus(out);  // the reader of check and bench
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].kind, "code_python");
  EXPECT_EQ(docs[0].text, "print('hi')\n");
  // stdout when no --out: one JSON object a line with exactly kind, name, text.
  r = test::run_tandem({"corpus", t.root + "/b.md"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j, (nlohmann::json{{"kind", "prose"}, {"name", t.root + "/b.md"}, {"text", "# Title\nSome prose.\n"}}));
  // Errors: exit 2 with what to do.
  r = test::run_tandem({"corpus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no input"), std::string::npos) << r.err;
  r = test::run_tandem({"corpus", t.root + "/data.bin"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kind"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(t.tmp.file("none.jsonl")));
}

}  // namespace
}  // namespace tandem
