// The BPE model of tokenizer.json: vocab, ranked merges, unk / byte_fallback / fuse_unk /
// ignore_merges / continuing_subword_prefix / end_of_word_suffix, as the `tokenizers` library applies
// them to one pre-token. Immutable after parse except a bounded per-word cache (thread-safe).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::tok {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (type BPE). Vocab entries must be non-negative int32
  // ids; each merge ("a b" or ["a", "b"]) must name two vocab tokens whose concatenation is in the
  // vocab; unk_token must be in the vocab. Violations: InputError naming `where`.
  BpeModel(const nlohmann::json& model, std::string_view where);
  ~BpeModel();

  // Appends the ids of one pre-token (valid UTF-8). Characters with no token, no byte fallback and
  // no unk_token are dropped, as the library does.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // null when the id has no token
  int64_t max_id() const { return max_id_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct Cache;
  std::vector<int32_t> merge_word(std::string_view word) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<int32_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: (left id << 32) | right id
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> tokens for byte_fallback, -1 when absent
  int64_t max_id_ = -1;
  std::unique_ptr<Cache> cache_;
};

}  // namespace tandem::tok
