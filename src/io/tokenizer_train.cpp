// Byte-level tokenizer.json builders for synthetic models: the merge-free byte vocabulary, and a small
// deterministic BPE trainer over it. Training counts the pre-tokens of the texts once, then merges the
// most frequent adjacent pair again and again, updating only the words that contain it.
#include <algorithm>
#include <climits>
#include <queue>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

namespace tandem {

using nlohmann::json;

namespace {

// The Qwen2 pre-tokenization regex (the fixture's configuration).
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json byte_level_config(const std::vector<std::string>& special_tokens, json vocab, json merges) {
  json added = json::array();
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back({{"id", i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json split = {{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", std::move(model)}};
}

// Specials first (ids 0..n-1), then the 256 byte symbols in byte order.
std::vector<std::string> base_tokens(const std::vector<std::string>& special_tokens) {
  std::vector<std::string> tokens = special_tokens;
  std::set<std::string> seen;
  for (const auto& s : special_tokens) {
    if (s.empty()) fail("byte-level tokenizer: special tokens must not be empty");
    if (!tok::is_valid_utf8(s)) fail("byte-level tokenizer: special token is not valid UTF-8");
    if (!seen.insert(s).second) fail("byte-level tokenizer: special token '{}' given twice", s);
  }
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    tok::append_utf8(sym, tok::byte_to_char(static_cast<uint8_t>(b)));
    if (seen.count(sym) != 0) fail("byte-level tokenizer: special token '{}' collides with a byte symbol", sym);
    tokens.push_back(sym);
  }
  return tokens;
}

json vocab_json(const std::vector<std::string>& tokens) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  return vocab;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

json make_byte_level_tokenizer(const std::vector<std::string>& special_tokens) {
  return byte_level_config(special_tokens, vocab_json(base_tokens(special_tokens)), json::array());
}

json train_byte_level_bpe(const std::vector<std::string>& texts, int vocab_size,
                          const std::vector<std::string>& special_tokens) {
  std::vector<std::string> tokens = base_tokens(special_tokens);
  const auto n_special = static_cast<int32_t>(special_tokens.size());
  if (vocab_size < static_cast<int64_t>(tokens.size())) {
    fail("train_byte_level_bpe: vocab_size {} is below the {} special and byte tokens", vocab_size, tokens.size());
  }
  std::unordered_map<std::string, int32_t> token_ids;
  for (size_t i = 0; i < tokens.size(); ++i) token_ids[tokens[i]] = static_cast<int32_t>(i);

  // Word types (sorted, so that ids and ties never depend on hash order) and their counts.
  Tokenizer base = Tokenizer::from_json(make_byte_level_tokenizer(special_tokens), "byte-level tokenizer");
  std::unordered_map<std::string, int64_t> counted;
  for (const auto& text : texts) {
    for (auto& piece : base.pre_tokenize(text)) ++counted[piece];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counted.begin(), counted.end());
  std::sort(sorted.begin(), sorted.end());
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [piece, count] : sorted) {
    Word w{{}, count};
    for (size_t i = 0; i < piece.size();) w.symbols.push_back(n_special + tok::char_to_byte(tok::next_char(piece, i)));
    words.push_back(std::move(w));
  }

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // may hold stale or repeated words
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += words[w].count;
      where[k].push_back(w);
    }
  }
  struct Entry {
    int64_t count;
    uint64_t key;
    // Most frequent first; ties: smaller (left, right) ids first.
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : pair_count) heap.push({c, k});

  json merges = json::array();
  std::vector<uint32_t> stamp(words.size(), UINT32_MAX);
  std::vector<uint64_t> touched;
  uint32_t step = 0;
  while (static_cast<int64_t>(tokens.size()) < vocab_size && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto it = pair_count.find(top.key);
    if (it == pair_count.end() || it->second != top.count || top.count <= 0) continue;
    auto a = static_cast<int32_t>(top.key >> 32), b = static_cast<int32_t>(top.key & 0xFFFFFFFFu);
    std::string merged = tokens[a] + tokens[b];
    auto [slot, inserted] = token_ids.emplace(merged, static_cast<int32_t>(tokens.size()));
    if (inserted) tokens.push_back(merged);
    int32_t c = slot->second;
    merges.push_back({tokens[a], tokens[b]});

    std::vector<uint32_t> affected = std::move(where[top.key]);
    where.erase(top.key);
    touched.clear();
    for (uint32_t w : affected) {
      if (stamp[w] == step) continue;
      stamp[w] = step;
      Word& word = words[w];
      auto& s = word.symbols;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = pair_key(s[i], s[i + 1]);
        pair_count[k] -= word.count;
        touched.push_back(k);
      }
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(c);
          i += 2;
        } else {
          next.push_back(s[i++]);
        }
      }
      s = std::move(next);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t k = pair_key(s[i], s[i + 1]);
        pair_count[k] += word.count;
        touched.push_back(k);
        if (s[i] == c || s[i + 1] == c) where[k].push_back(w);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      auto pc = pair_count.find(k);
      if (pc->second > 0) {
        heap.push({pc->second, k});
      } else {
        pair_count.erase(pc);
      }
    }
    ++step;
  }
  return byte_level_config(special_tokens, vocab_json(tokens), std::move(merges));
}

}  // namespace tandem
