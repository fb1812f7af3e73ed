// Hugging Face tokenizer.json: byte-level / metaspace BPE tokenizers as shipped with Qwen3, DeepSeek-V3,
// OLMoE and Mixtral checkpoints, reproducing the `tokenizers` library's ids and decoded text exactly.
// Pipeline: added tokens (raw, then normalized) → normalizer → pre-tokenizer → BPE per pre-token;
// decode: ids → tokens → decoder chain. Any component this file does not implement is an InputError
// naming the file and the component type, never a silent approximation.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace tok {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json file, or a model folder holding one). Malformed JSON, a missing or
  // unsupported model / normalizer / pre-tokenizer / decoder / post-processor, merges or added tokens
  // that reference tokens outside the vocab: InputError naming the file.
  static Tokenizer load(const std::string& path);
  // Same from parsed JSON; `source` names it in error messages.
  static Tokenizer from_json(const nlohmann::json& j, std::string_view source);

  // Token ids of `text` (must be valid UTF-8, else InputError). Like `tokenizers`'
  // encode(text, add_special_tokens=False): no BOS/EOS is added — the post-processor is not applied
  // (see encode_with_special). Added tokens (e.g. <|im_start|>) written in the text are recognised.
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // encode() followed by the post-processor's single-sequence template (TemplateProcessing,
  // Roberta/BertProcessing; ByteLevel and none add nothing), as add_special_tokens=True does.
  std::vector<int32_t> encode_with_special(std::string_view text) const;
  // Text of `ids` through the decoder chain (tokens joined by " " when the file has no decoder).
  // skip_special drops special added tokens. An id with no token: InputError.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // 1 + the largest id of the vocab and the added tokens (the embedding rows a model needs).
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id` (added tokens first, then the model's vocab); InputError when none.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // a special added token (skipped by decode(skip_special))
  // The pre-tokens `text` is split into before BPE (after added-token extraction, normalisation and
  // pre-tokenisation; added tokens themselves are left out). For tests and the trainer.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  const std::string& source() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerImpl> impl);
  std::shared_ptr<const tok::TokenizerImpl> impl_;  // immutable after load; shared by copies
};

// A tokenizer.json configured like the fixture (NFC, Split with the Qwen2 regex, ByteLevel, ByteLevel
// decoder, BPE) whose vocab is the special tokens (ids 0..n-1) followed by exactly the 256 byte-level
// symbols in byte order (ids n..n+255), with no merges: every byte string encodes, one id per byte.
nlohmann::json make_byte_level_tokenizer(const std::vector<std::string>& special_tokens);

// Trains a byte-level BPE (same configuration as make_byte_level_tokenizer) on `texts` until the vocab
// holds `vocab_size` entries or no pair of symbols is left. Deterministic: the most
// frequent pair wins, ties go to the pair with the smaller (left id, right id). vocab_size must be at
// least special_tokens.size() + 256, else InputError.
nlohmann::json train_byte_level_bpe(const std::vector<std::string>& texts, int vocab_size,
                                    const std::vector<std::string>& special_tokens);

}  // namespace tandem
