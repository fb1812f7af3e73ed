// Text primitives of the tokenizer: UTF-8 walking and validation, Rust-compatible lossy decoding,
// Unicode predicates (as Rust's char methods define them), utf8proc normalisation, the GPT-2
// byte↔char alphabet, and a PCRE2 regex whose find-all iterates like the Oniguruma/Rust crates the
// `tokenizers` library uses (an empty match right after a previous match is skipped).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tok {

// Byte length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_valid_len(std::string_view s, size_t i);
bool is_valid_utf8(std::string_view s);
// Decodes the (valid) code point at s[i] and advances i past it.
char32_t next_char(std::string_view s, size_t& i);
// Code point ending at byte `end` (valid UTF-8 before it); `start` receives its first byte.
char32_t prev_char(std::string_view s, size_t end, size_t& start);
void append_utf8(std::string& out, char32_t c);
// String::from_utf8_lossy: every maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Rust char::is_whitespace (the Unicode White_Space property).
bool is_whitespace(char32_t c);
// Rust regex \w: letters, marks, decimal numbers, letter numbers, connector punctuation.
bool is_word_char(char32_t c);
bool is_numeric(char32_t c);      // char::is_numeric: Nd, Nl, No
bool is_punctuation(char32_t c);  // ASCII punctuation or a Unicode P* category

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string unicode_normalize(std::string_view s, NormalForm form);
// Per-character full lowercase mapping (Rust char::to_lowercase).
std::string lowercase(std::string_view s);

// GPT-2's bytes_to_unicode: byte b ↔ a printable code point.
char32_t byte_to_char(uint8_t b);
// The byte of a byte-level symbol, or -1.
int char_to_byte(char32_t c);
std::string byte_level_encode(std::string_view bytes);  // each byte → its symbol, UTF-8

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable, shared across threads.
class Regex {
 public:
  // Compile errors: InputError "<where>: invalid regex ...".
  Regex(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Byte ranges [start, end) of successive matches in `text` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string where_;
};

// A Split/Replace pattern: a literal string (found by plain search) or a regex.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;  // null: literal
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
};

// Replaces every match of `pattern` in `text` with `content`.
std::string replace_all(std::string_view text, const Pattern& pattern, std::string_view content);

}  // namespace tandem::tok
