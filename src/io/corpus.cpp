// JSON-lines corpora (see corpus.h).
#include "io/corpus.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tandem {

std::vector<CorpusDoc> load_corpus(const std::string& path, const std::vector<std::string>& kinds) {
  std::ifstream in(path);
  if (!in) fail("cannot open corpus {}", path);
  std::vector<CorpusDoc> docs;
  std::set<std::string> seen;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{}:{}: not a JSON object", path, n);
    for (const char* key : {"kind", "text"})
      if (!j.contains(key) || !j[key].is_string()) fail("{}:{}: field '{}' missing or not a string", path, n, key);
    CorpusDoc d{j["kind"].get<std::string>(), j.value("name", ""), j["text"].get<std::string>()};
    seen.insert(d.kind);
    if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), d.kind) == kinds.end()) continue;
    docs.push_back(std::move(d));
  }
  for (const auto& k : kinds)
    if (!seen.count(k)) fail("{}: no document of kind '{}'", path, k);
  if (docs.empty()) fail("{}: no documents", path);
  return docs;
}

}  // namespace tandem
