// BPE model (see tokenizer_bpe.h). A word starts as one symbol per character (or byte-fallback /
// unk tokens); a min-heap on (merge rank, position) then repeatedly merges the best-ranked adjacent
// pair over a linked list of symbols, exactly as `tokenizers`' Word::merge_all.
#include "io/tokenizer_bpe.h"

#include <fmt/format.h>

#include <climits>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "core/error.h"
#include "io/tokenizer_pipeline.h"
#include "io/tokenizer_text.h"

namespace tandem::tok {

using nlohmann::json;

// Words seen recently → their ids. Bounded like the library's (it stops inserting when full).
struct BpeModel::Cache {
  static constexpr size_t kCapacity = 10000;
  static constexpr size_t kMaxWordBytes = 256;
  mutable std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

namespace {
uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

BpeModel::BpeModel(const json& model, std::string_view where) : cache_(std::make_unique<Cache>()) {
  if (const json* d = json_find(model, "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0) fail("{}: BPE dropout is not supported", where);
  }
  const json* vocab = json_find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) fail("{}: model has no 'vocab' object", where);
  vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) fail("{}: vocab entry '{}' is not an integer id", where, it.key());
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX) fail("{}: vocab entry '{}' has id {} outside [0, 2^31)", where, it.key(), id);
    vocab_[it.key()] = static_cast<int32_t>(id);
    vocab_r_.emplace(static_cast<int32_t>(id), it.key());
    max_id_ = std::max(max_id_, id);
  }
  continuing_subword_prefix_ = json_string(model, "continuing_subword_prefix", where, "");
  end_of_word_suffix_ = json_string(model, "end_of_word_suffix", where, "");
  fuse_unk_ = json_bool(model, "fuse_unk", where, false);
  byte_fallback_ = json_bool(model, "byte_fallback", where, false);
  ignore_merges_ = json_bool(model, "ignore_merges", where, false);
  if (const json* unk = json_find(model, "unk_token")) {
    if (!unk->is_string()) fail("{}: model field 'unk_token' must be a string", where);
    auto id = token_to_id(unk->get<std::string>());
    if (!id) fail("{}: unk_token '{}' is not in the vocab", where, unk->get<std::string>());
    unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    auto id = token_to_id(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = id ? *id : -1;
  }

  const json* merges = json_find(model, "merges");
  if (merges != nullptr && !merges->is_array()) fail("{}: model field 'merges' must be an array", where);
  if (merges == nullptr) return;
  merges_.reserve(merges->size());
  int32_t rank = 0;
  for (const auto& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail("{}: merges[{}] '{}' is not two tokens separated by one space", where, rank, s);
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail("{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", where, rank);
    }
    auto a_id = token_to_id(a);
    auto b_id = token_to_id(b);
    if (!a_id) fail("{}: merges[{}] references '{}', which is not in the vocab", where, rank, a);
    if (!b_id) fail("{}: merges[{}] references '{}', which is not in the vocab", where, rank, b);
    std::string_view tail = b;
    if (!continuing_subword_prefix_.empty() && tail.starts_with(continuing_subword_prefix_)) {
      tail.remove_prefix(continuing_subword_prefix_.size());
    }
    std::string merged = a + std::string(tail);
    auto new_id = token_to_id(merged);
    if (!new_id) fail("{}: merges[{}] produces '{}', which is not in the vocab", where, rank, merged);
    merges_[pair_key(*a_id, *b_id)] = Merge{rank, *new_id};
    if (rank == INT32_MAX) fail("{}: too many merges", where);
    ++rank;
  }
}

BpeModel::~BpeModel() = default;

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view w) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  auto add = [&](int32_t id, size_t len) {
    auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  size_t unk_len = 0;  // bytes covered by a pending unk token; 0: none pending
  for (size_t i = 0; i < w.size();) {
    size_t start = i;
    next_char(w, i);
    size_t byte_len = i - start;
    std::string s(w.substr(start, byte_len));
    if (start > 0) s = continuing_subword_prefix_ + s;
    if (i == w.size()) s += end_of_word_suffix_;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk_len > 0) add(*unk_id_, unk_len);
      unk_len = 0;
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // As the library does, a pending unk token is not flushed before byte-fallback tokens.
        for (char c : s) add(byte_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_len > 0 && !fuse_unk_) {
        add(*unk_id_, unk_len);
        unk_len = 0;
      }
      unk_len += byte_len;
    }
  }
  if (unk_len > 0) add(*unk_id_, unk_len);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const Merge* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    Symbol right = symbols[cur.next];
    const Merge* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    symbols[cur.next].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[cur.prev].id, cur.id)) queue.push({pm->rank, cur.prev, pm->new_id});
    }
    if (cur.next >= 0) {
      if (const Merge* nm = find_merge(cur.id, symbols[cur.next].id)) queue.push({nm->rank, top.pos, nm->new_id});
    }
  }
  std::vector<int32_t> ids;
  for (const auto& s : symbols) {
    if (s.len != 0) ids.push_back(s.id);
  }
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  bool cacheable = word.size() <= Cache::kMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mutex);
    if (auto it = cache_->words.find(std::string(word)); it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_->mutex);
    if (cache_->words.size() < Cache::kCapacity) cache_->words.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace tandem::tok
