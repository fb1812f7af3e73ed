// Text corpora as JSON lines: one {"kind", "name", "text"} object a line (shared/corpus/public.jsonl,
// what `tandem corpus` writes). The one reader of `profile`, `check` and `bench`: one set of rules,
// and a malformed line is an InputError naming the file and the line number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct CorpusDoc {
  std::string kind;
  std::string name;
  std::string text;
  int64_t line = 0;  // 1-based line of the corpus file
};

// Every document, in file order. A line is one JSON object with the string members "kind" (not
// empty) and "text", and optionally "name" ("" when absent); other members are ignored, blank lines skipped, a trailing '\r' dropped.
// InputError "PATH:LINE: ..." for anything else (malformed JSON, not an object, a member missing or
// not a string, an empty kind), "cannot open corpus PATH" and "corpus PATH has no documents".
std::vector<CorpusDoc> read_corpus(const std::string& path);

// read_corpus, keeping only the documents of `kinds` (empty: every kind), in file order. A listed kind
// the file doesn't have is an InputError naming it and the kinds the file has.
std::vector<CorpusDoc> load_corpus(const std::string& path, const std::vector<std::string>& kinds = {});

}  // namespace tandem
