// JSON-lines corpora (see corpus.h).
#include "io/corpus.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"

namespace tandem {

std::vector<CorpusDoc> read_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open corpus {}", path);
  std::vector<CorpusDoc> docs;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail("{}:{}: malformed JSON (byte {} of the line)", path, n, e.byte);
    }
    if (!j.is_object())
      fail("{}:{}: expected a JSON object {{\"kind\", \"name\", \"text\"}}, got {}", path, n, j.type_name());
    CorpusDoc d;
    d.line = n;
    for (auto [key, dst] : {std::pair{"kind", &d.kind}, std::pair{"name", &d.name}, std::pair{"text", &d.text}}) {
      auto it = j.find(key);
      if (it == j.end()) {
        if (dst == &d.name) continue;  // optional: a document without a name is named by its line
        fail("{}:{}: missing field \"{}\"", path, n, key);
      }
      if (!it->is_string()) fail("{}:{}: field \"{}\" must be a string, got {}", path, n, key, it->type_name());
      *dst = it->get<std::string>();
    }
    if (d.kind.empty()) fail("{}:{}: field \"kind\" is empty", path, n);
    docs.push_back(std::move(d));
  }
  if (docs.empty()) fail("corpus {} has no documents", path);
  return docs;
}

std::vector<CorpusDoc> load_corpus(const std::string& path, const std::vector<std::string>& kinds) {
  std::vector<CorpusDoc> docs = read_corpus(path);
  if (kinds.empty()) return docs;
  std::set<std::string> present;
  for (const auto& d : docs) present.insert(d.kind);
  for (const auto& k : kinds) {
    if (present.count(k)) continue;
    std::string known;
    for (const auto& p : present) known += (known.empty() ? "" : ", ") + p;
    fail("--kinds: no document of kind \"{}\" in {} (kinds: {})", k, path, known);
  }
  std::erase_if(docs, [&](const CorpusDoc& d) { return std::find(kinds.begin(), kinds.end(), d.kind) == kinds.end(); });
  return docs;
}

}  // namespace tandem
