// Tokenizer: tokenizer.json loading, added-token extraction, encode and decode (see tokenizer.h).
// Added tokens are found like the library's leftmost-longest Aho-Corasick pass: first those with
// normalized=false on the raw text, then those with normalized=true on each normalised remainder.
#include "io/tokenizer.h"

#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_pipeline.h"
#include "io/tokenizer_text.h"

namespace tandem {
namespace tok {

using nlohmann::json;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A byte trie over added-token patterns; find() yields leftmost-longest matches.
class AddedTrie {
 public:
  AddedTrie() : nodes_(1) {}
  void add(std::string_view pattern, int32_t token) {
    if (pattern.empty()) return;
    int32_t n = 0;
    for (char ch : pattern) {
      auto b = static_cast<uint8_t>(ch);
      int32_t next = child(n, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[n].children.emplace_back(b, next);
        nodes_.emplace_back();
      }
      n = next;
    }
    if (nodes_[n].token < 0) nodes_[n].token = token;  // the first of duplicate patterns wins
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest pattern starting at text[pos]: (token, end), or token -1.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const {
    int32_t n = 0, best = -1;
    size_t best_end = pos;
    for (size_t i = pos; i < text.size(); ++i) {
      n = child(n, static_cast<uint8_t>(text[i]));
      if (n < 0) break;
      if (nodes_[n].token >= 0) {
        best = nodes_[n].token;
        best_end = i + 1;
      }
    }
    return {best, best_end};
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  int32_t child(int32_t n, uint8_t b) const {
    for (auto [c, next] : nodes_[n].children) {
      if (c == b) return next;
    }
    return -1;
  }
  std::vector<Node> nodes_;
};

struct Segment {
  size_t start, end;
  int32_t token;  // index into TokenizerImpl::added, or -1 for plain text
};

struct TokenizerImpl {
  std::string source;
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::optional<Decoder> decoder;
  std::optional<PostProcessor> post_processor;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, size_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;
  AddedTrie raw_trie, normalized_trie;
  int64_t vocab_size = 0;

  // AddedVocabulary::find_matches: segments covering `text`, added tokens flagged.
  std::vector<Segment> find_added(std::string_view text, const AddedTrie& trie) const {
    std::vector<Segment> out;
    if (trie.empty()) {
      if (!text.empty()) out.push_back({0, text.size(), -1});
      return out;
    }
    size_t start_offset = 0;
    for (size_t pos = 0; pos < text.size();) {
      auto [token, stop] = trie.longest_at(text, pos);
      if (token < 0) {
        ++pos;
        continue;
      }
      size_t start = pos;
      pos = stop;  // the search resumes after the match, even when the match is discarded
      const AddedToken& t = added[static_cast<size_t>(token)];
      if (t.single_word) {
        size_t before = 0, after = stop;
        bool word_before = start > 0 && is_word_char(prev_char(text, start, before));
        bool word_after = stop < text.size() && is_word_char(next_char(text, after));
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        size_t s = start;
        while (s > 0) {
          size_t cs = 0;
          if (!is_whitespace(prev_char(text, s, cs))) break;
          s = cs;
        }
        start = std::max(s, start_offset);
      }
      if (t.rstrip) {
        while (stop < text.size()) {
          size_t next = stop;
          if (!is_whitespace(next_char(text, next))) break;
          stop = next;
        }
      }
      if (start < start_offset) continue;  // overlaps whitespace an earlier rstrip took
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, token});
      start_offset = stop;
      pos = std::max(pos, stop);
    }
    if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
    return out;
  }

  // Runs the encode pipeline; on_token(id) for added tokens, on_piece(text) for model input.
  template <class OnToken, class OnPiece>
  void walk(std::string_view text, OnToken on_token, OnPiece on_piece) const {
    if (!is_valid_utf8(text)) {
      size_t bad = 0;
      while (bad < text.size() && utf8_valid_len(text, bad) > 0) bad += utf8_valid_len(text, bad);
      fail("{}: cannot encode text that is not valid UTF-8 (bad byte at offset {})", source, bad);
    }
    for (const Segment& seg : find_added(text, raw_trie)) {
      if (seg.token >= 0) {
        on_token(added[static_cast<size_t>(seg.token)].id);
        continue;
      }
      std::string s(text.substr(seg.start, seg.end - seg.start));
      if (normalizer) s = normalize(*normalizer, std::move(s));
      for (const Segment& sub : find_added(s, normalized_trie)) {
        if (sub.token >= 0) {
          on_token(added[static_cast<size_t>(sub.token)].id);
          continue;
        }
        std::vector<Piece> pieces{{s.substr(sub.start, sub.end - sub.start), seg.start == 0 && sub.start == 0}};
        if (pre_tokenizer) pre_tokenize(*pre_tokenizer, pieces);
        for (const auto& p : pieces) on_piece(p.text);
      }
    }
  }
};

namespace {

std::vector<AddedToken> parse_added_tokens(const json& j, std::string_view where) {
  std::vector<AddedToken> out;
  const json* list = json_find(j, "added_tokens");
  if (list == nullptr) return out;
  if (!list->is_array()) fail("{}: 'added_tokens' must be an array", where);
  for (const auto& e : *list) {
    if (!e.is_object()) fail("{}: added_tokens entries must be objects", where);
    AddedToken t;
    t.content = json_string(e, "content", where);
    int64_t id = json_int(e, "id", where);
    if (id < 0 || id > INT32_MAX) fail("{}: added token '{}' has id {} outside [0, 2^31)", where, t.content, id);
    t.id = static_cast<int32_t>(id);
    t.special = json_bool(e, "special", where, false);
    t.single_word = json_bool(e, "single_word", where, false);
    t.lstrip = json_bool(e, "lstrip", where, false);
    t.rstrip = json_bool(e, "rstrip", where, false);
    t.normalized = json_bool(e, "normalized", where, !t.special);
    if (t.content.empty()) continue;  // the library ignores empty added tokens
    out.push_back(std::move(t));
  }
  return out;
}

std::shared_ptr<TokenizerImpl> build(const json& j, std::string_view where) {
  if (!j.is_object()) fail("{}: tokenizer.json must be a JSON object", where);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->source = std::string(where);
  const json* model = json_find(j, "model");
  if (model == nullptr || !model->is_object()) fail("{}: missing 'model' object", where);
  std::string type;
  if (const json* t = json_find(*model, "type")) {
    if (!t->is_string()) fail("{}: model 'type' must be a string", where);
    type = t->get<std::string>();
  } else if (json_find(*model, "merges") != nullptr) {
    type = "BPE";  // files from before the library wrote the type
  }
  if (type != "BPE") fail("{}: unsupported model type '{}' (only BPE is implemented)", where, type);
  impl->model = std::make_unique<BpeModel>(*model, where);

  auto component = [&](const char* key) -> const json& {
    static const json kNull;
    const json* v = json_find(j, key);
    return v != nullptr ? *v : kNull;
  };
  impl->normalizer = parse_normalizer(component("normalizer"), where);
  impl->pre_tokenizer = parse_pre_tokenizer(component("pre_tokenizer"), where);
  impl->decoder = parse_decoder(component("decoder"), where);
  impl->post_processor = parse_post_processor(component("post_processor"), where);

  impl->vocab_size = impl->model->max_id() + 1;
  for (AddedToken& t : parse_added_tokens(j, where)) {
    if (impl->added_by_content.count(t.content) != 0) continue;
    // As the library does, a token already in the model's vocab keeps the vocab's id.
    if (auto vid = impl->model->token_to_id(t.content)) t.id = *vid;
    size_t index = impl->added.size();
    impl->added_by_content.emplace(t.content, index);
    impl->added_by_id[t.id] = index;
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, int64_t{t.id} + 1);
    if (t.normalized) {
      std::string pattern = impl->normalizer ? normalize(*impl->normalizer, t.content) : t.content;
      impl->normalized_trie.add(pattern, static_cast<int32_t>(index));
    } else {
      impl->raw_trie.add(t.content, static_cast<int32_t>(index));
    }
    impl->added.push_back(std::move(t));
  }
  return impl;
}

}  // namespace
}  // namespace tok

Tokenizer::Tokenizer(std::shared_ptr<const tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open tokenizer file", file);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", file, e.what());
  }
  return from_json(j, file);
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, std::string_view source) {
  try {
    return Tokenizer(tok::build(j, source));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: bad tokenizer.json: {}", source, e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  impl_->walk(
      text, [&](int32_t id) { ids.push_back(id); },
      [&](const std::string& piece) { impl_->model->tokenize(piece, ids); });
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<int32_t> ids = encode(text);
  if (!impl_->post_processor) return ids;
  return tok::post_process(*impl_->post_processor, std::move(ids));
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  impl_->walk(
      text, [](int32_t) {}, [&](const std::string& piece) { pieces.push_back(piece); });
  return pieces;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      const auto& t = impl_->added[it->second];
      if (!(skip_special && t.special)) tokens.push_back(t.content);
      continue;
    }
    const std::string* token = impl_->model->id_to_token(id);
    if (token == nullptr) fail("{}: cannot decode id {}: no such token (vocab size {})", impl_->source, id, vocab_size());
    tokens.push_back(*token);
  }
  if (impl_->decoder) tokens = tok::decode_chain(*impl_->decoder, std::move(tokens));
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 && !impl_->decoder) out += ' ';
    out += tokens[i];
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) {
    return impl_->added[it->second].id;
  }
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  fail("{}: no token has id {}", impl_->source, id);
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace tandem
