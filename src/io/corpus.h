// Text corpora as JSON lines: one {"kind", "name", "text"} object a line (shared/corpus/public.jsonl).
// A malformed line is an InputError naming the file and the line number.
#pragma once

#include <string>
#include <vector>

namespace tandem {

struct CorpusDoc {
  std::string kind;
  std::string name;
  std::string text;
};

// `kinds` empty: every kind. Otherwise documents of other kinds are skipped; a listed kind the file
// doesn't have is an error.
std::vector<CorpusDoc> load_corpus(const std::string& path, const std::vector<std::string>& kinds = {});

}  // namespace tandem
