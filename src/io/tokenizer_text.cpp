// Text primitives of the tokenizer (see tokenizer_text.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/tokenizer_text.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>

#include "core/error.h"

namespace tandem::tok {

size_t utf8_valid_len(std::string_view s, size_t i) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<uint8_t>(s[i + k]) : -1; };
  int b = at(0);
  if (b < 0) return 0;
  if (b < 0x80) return 1;
  int lo = 0x80, hi = 0xBF, n = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  int b1 = at(1);
  if (b1 < lo || b1 > hi) return 0;
  for (int k = 2; k < n; ++k) {
    int c = at(k);
    if (c < 0x80 || c > 0xBF) return 0;
  }
  return static_cast<size_t>(n);
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

char32_t next_char(std::string_view s, size_t& i) {
  auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t c = b & (0x7F >> n);
  for (int k = 1; k < n && i + k < s.size(); ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

char32_t prev_char(std::string_view s, size_t end, size_t& start) {
  start = end;
  do {
    --start;
  } while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80);
  size_t i = start;
  return next_char(s, i);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t n = utf8_valid_len(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // A maximal invalid subpart: the lead byte plus the continuation bytes that still fit its ranges.
    auto b = static_cast<uint8_t>(bytes[i]);
    size_t len = 1;
    int need = (b >= 0xC2 && b <= 0xDF) ? 1 : (b >= 0xE0 && b <= 0xEF) ? 2 : (b >= 0xF0 && b <= 0xF4) ? 3 : 0;
    for (int k = 1; k <= need && i + k < bytes.size(); ++k) {
      auto c = static_cast<uint8_t>(bytes[i + k]);
      int lo = 0x80, hi = 0xBF;
      if (k == 1 && b == 0xE0) lo = 0xA0;
      if (k == 1 && b == 0xED) hi = 0x9F;
      if (k == 1 && b == 0xF0) lo = 0x90;
      if (k == 1 && b == 0xF4) hi = 0x8F;
      if (c < lo || c > hi) break;
      len = static_cast<size_t>(k) + 1;
    }
    out += "\xEF\xBF\xBD";
    i += len;
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_word_char(char32_t c) {
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
         k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

bool is_numeric(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

std::string unicode_normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  if (s.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("tokenizer: unicode normalisation failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_char(s, i);
    if (c == 0x130) {  // the one code point whose lowercase is two: i + combining dot above
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

namespace {
struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};
  std::array<std::string, 256> utf8{};
  ByteTables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
      append_utf8(utf8[b], to_char[b]);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}
}  // namespace

char32_t byte_to_char(uint8_t b) { return byte_tables().to_char[b]; }
int char_to_byte(char32_t c) { return c < 324 ? byte_tables().to_byte[c] : -1; }
std::string byte_level_encode(std::string_view bytes) {
  const auto& t = byte_tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += t.utf8[static_cast<uint8_t>(b)];
  return out;
}

Regex::Regex(std::string_view pattern, std::string_view where) : where_(where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  // Oniguruma's \uHHHH escapes (used in some hub patterns) need ALT_BSUX; EXTRA keeps \x{...} working.
  pcre2_set_compile_extra_options(ctx, PCRE2_EXTRA_ALT_BSUX);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_ALT_BSUX, &err, &offset, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("{}: invalid regex at offset {}: {}", where_, offset, reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  TANDEM_ASSERT(md != nullptr, "pcre2_match_data_create_from_pattern failed");
  std::vector<std::pair<size_t, size_t>> out;
  size_t pos = 0;
  size_t last_end = std::string_view::npos;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("{}: regex matching failed: {}", where_, reinterpret_cast<const char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (s == e && e == last_end) {
      // Oniguruma/Rust iteration: no empty match right after a match; move on one character.
      if (pos >= text.size()) break;
      size_t n = utf8_valid_len(text, pos);
      pos += n == 0 ? 1 : n;
      continue;
    }
    out.emplace_back(s, e);
    pos = e;
    last_end = e;
  }
  pcre2_match_data_free(md);
  return out;
}

std::vector<std::pair<size_t, size_t>> Pattern::find_all(std::string_view text) const {
  if (regex) return regex->find_all(text);
  std::vector<std::pair<size_t, size_t>> out;
  if (literal.empty()) return out;
  for (size_t pos = text.find(literal); pos != std::string_view::npos; pos = text.find(literal, pos)) {
    out.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return out;
}

std::string replace_all(std::string_view text, const Pattern& pattern, std::string_view content) {
  std::string out;
  size_t prev = 0;
  for (auto [s, e] : pattern.find_all(text)) {
    out.append(text.substr(prev, s - prev));
    out.append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace tandem::tok
