// `tandem corpus`: text files and folders → the JSON-lines corpus ({"kind", "name", "text"} a line)
// that `tandem profile`, `check` and `bench` read. Kinds come from the file extensions or --kind; what
// was skipped (binary, empty, unknown type) is said on stderr; the per-kind summary too.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "io/corpus_build.h"

namespace tandem::cli {
namespace {

struct CorpusArgs {
  std::vector<std::string> inputs;
  std::string out, kind;
  int64_t max_file_bytes = 16 << 20;
};

int run_corpus(const CorpusArgs& a) {
  if (a.inputs.empty()) fail("no input: give text files or folders, e.g. tandem corpus docs/ src/ --out corpus.jsonl");
  if (!a.kind.empty() && a.kind.find_first_of(" \t\n\"") != std::string::npos)
    fail("--kind \"{}\": give one word, e.g. prose or code_python", a.kind);
  CorpusBuild built = build_corpus(a.inputs, {a.kind, a.max_file_bytes});
  for (const auto& note : built.notes) fmt::print(stderr, "corpus: {}\n", note);
  std::FILE* f = stdout;
  std::string tmp;
  if (!a.out.empty()) {
    tmp = a.out + ".tmp";
    f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("cannot write {}: {}", tmp, std::strerror(errno));
  }
  std::map<std::string, std::pair<int64_t, int64_t>> per_kind;  // kind → (documents, bytes)
  bool ok = true;
  for (const auto& d : built.docs) {
    const std::string line = corpus_line(d);
    ok = ok && std::fwrite(line.data(), 1, line.size(), f) == line.size();
    per_kind[d.kind].first += 1;
    per_kind[d.kind].second += int64_t(d.text.size());
  }
  if (f != stdout) {
    ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), a.out.c_str()) != 0) {
      std::remove(tmp.c_str());
      fail("cannot write {}: {}", a.out, std::strerror(errno));
    }
  } else if (std::fflush(stdout) != 0 || !ok) {
    fail("cannot write the corpus to stdout");
  }
  for (const auto& [kind, n] : per_kind)
    fmt::print(stderr, "corpus: {:<12} {:>6} documents {:>12} bytes\n", kind, n.first, n.second);
  fmt::print(stderr, "corpus: {} documents{}{}\n", built.docs.size(), a.out.empty() ? "" : " written to ", a.out);
  if (!a.out.empty())
    fmt::print(stderr, "next: tandem profile --model DIR --corpus {} --out stats.json\n", a.out);
  return 0;
}

RunFn corpus_setup(CLI::App& app) {
  auto a = std::make_shared<CorpusArgs>();
  app.add_option("inputs", a->inputs, "Text files and folders (folders are read recursively; hidden entries skipped)");
  app.add_option("--out", a->out, "Corpus file to write (default: stdout)");
  app.add_option("--kind", a->kind,
                 "One kind for every file (default: by extension: " + corpus_kind_table() +
                     "; in a folder, files of other types are skipped)");
  app.add_option("--max-file-bytes", a->max_file_bytes, "Skip larger files, with a note (default 16 MiB; 0: no limit)")
      ->check(CLI::NonNegativeNumber);
  return [a] { return run_corpus(*a); };
}

}  // namespace
TANDEM_COMMAND(corpus, "corpus", "Make a JSON-lines corpus for profile from text files and folders",
               corpus_setup);
}  // namespace tandem::cli
