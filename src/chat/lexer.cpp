// The chat template lexer (see lexer.h). Follows jinja2's lexer rule for rule where output depends
// on it: tag ends count only outside brackets, `-%}` eats all whitespace after it, `%}` one newline.
#include "chat/lexer.h"

#include <utf8proc.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "chat/value.h"

namespace tandem::chat {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The byte length of the whitespace code point (Python's str.isspace()) at s[i], else 0. What `-`
// strips is Unicode whitespace, as Python's rstrip() and \s are.
size_t space_at(std::string_view s, size_t i) {
  utf8proc_int32_t c = 0;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), static_cast<utf8proc_ssize_t>(s.size() - i), &c);
  return n > 0 && is_py_space(static_cast<char32_t>(c)) ? static_cast<size_t>(n) : 0;
}
size_t skip_spaces(std::string_view s, size_t i) {
  for (size_t n; i < s.size() && (n = space_at(s, i)) > 0;) i += n;
  return i;
}
size_t rstrip_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (space_at(s, start) != end - start) break;
    end = start;
  }
  return end;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag == std::string::npos ? std::string::npos : tag - pos);
      if (tag == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      if (sign == '-') {
        text.resize(rstrip_end(text));
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && text.find_first_not_of(" \t", l_pos) == std::string::npos) {
          text.resize(l_pos);
        }
      }
      emit_text(std::move(text), pos);
      line_ = line_at(tag);
      size_t inner = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = comment(inner, tag);
      } else if (kind == '%' && raw_begin(inner, &pos)) {
        pos = raw(pos, tag);
      } else {
        pos = tag_tokens(inner, kind == '{');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Token eof;
    eof.type = Tok::Eof;
    eof.line = line_at(src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_pos_ = 0;  // line_ counts the newlines before line_pos_

  int line_at(size_t p) {
    if (p < line_pos_) {
      line_ = 1;
      line_pos_ = 0;
    }
    for (; line_pos_ < p && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  size_t find_tag(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  void emit_text(std::string text, size_t pos) {
    if (text.empty()) return;
    Token t;
    t.type = Tok::Text;
    t.text = std::move(text);
    t.line = line_at(pos);
    tokens_.push_back(std::move(t));
  }

  // After a tag's end at `end` (just past it): `-` eats all whitespace, a block or comment end one newline.
  size_t after_end(size_t end, char sign, bool block) const {
    if (sign == '-') {
      end = skip_spaces(src_, end);
    } else if (sign != '+' && block && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t comment(size_t inner, size_t start) {
    size_t end = src_.find("#}", inner);
    if (end == std::string::npos) template_fail(line_at(start), "unclosed comment: missing '#}}'");
    char sign = end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return after_end(end + 2, sign, true);
  }

  // `{% raw %}` (after `{%` and its sign, at inner): sets *body to where the raw text starts.
  bool raw_begin(size_t inner, size_t* body) const {
    size_t p = inner;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      *body = after_end(p + 3, '-', true);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *body = p + 2;
      return true;
    }
    return false;
  }

  size_t raw(size_t body, size_t start) {
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char open_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(body, p - body);
      if (open_sign == '-') {
        text.resize(rstrip_end(text));
      }
      emit_text(std::move(text), body);
      return after_end(q + 2, sign, true);
    }
    template_fail(line_at(start), "unclosed 'raw' block: missing '{{% endraw %}}'");
  }

  // Tokens inside {{ }} or {% %}, from inner; returns the position after the tag's end.
  size_t tag_tokens(size_t p, bool var) {
    push(var ? Tok::VarBegin : Tok::BlockBegin, "", p);
    std::string brackets;
    for (;;) {
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (p >= src_.size()) {
        template_fail(line_at(p), "unexpected end of template: missing '{}'", var ? "}}" : "%}");
      }
      if (brackets.empty()) {
        const char* close = var ? "}}" : "%}";
        char sign = 0;
        size_t q = p;
        if ((src_[q] == '-' || (!var && src_[q] == '+')) && src_.compare(q + 1, 2, close) == 0) sign = src_[q++];
        if (src_.compare(q, 2, close) == 0) {
          push(var ? Tok::VarEnd : Tok::BlockEnd, "", p);
          return after_end(q + 2, sign, !var);
        }
      }
      char c = src_[p];
      if (c == '\'' || c == '"') {
        p = string_literal(p);
      } else if (is_digit(c)) {
        p = number(p);
      } else if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        push(Tok::Name, src_.substr(p, e - p), p);
        p = e;
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2) {
          if (src_.compare(p, 2, o) == 0) op = o;
        }
        if (op.empty() && std::strchr("+-/*%~[](){}<>=.:|,;", c) != nullptr) op = std::string(1, c);
        if (op.empty()) {
          template_fail(line_at(p), "unexpected character {} inside a tag", repr_string(std::string(1, c)));
        }
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(c);
        } else if (op == ")" || op == "]" || op == "}") {
          char want = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) template_fail(line_at(p), "unexpected '{}'", op);
          brackets.pop_back();
        }
        push(Tok::Op, op, p);
        p += op.size();
      }
    }
  }

  void push(Tok type, std::string text, size_t pos) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_at(pos);
    tokens_.push_back(std::move(t));
  }

  // A Python string literal with its escapes (what jinja2's unicode-escape decoding accepts).
  size_t string_literal(size_t p) {
    char quote = src_[p];
    size_t start = p++;
    std::string out;
    for (;;) {
      if (p >= src_.size()) template_fail(line_at(start), "unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) template_fail(line_at(start), "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) {
        char32_t v = 0;
        for (int i = 0; i < n; ++i, ++p) {
          char h = p < src_.size() ? src_[p] : 0;
          int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (d < 0) template_fail(line_at(start), "truncated \\{} escape in a string literal", e);
          v = v * 16 + static_cast<char32_t>(d);
        }
        if (v > 0x10FFFF) template_fail(line_at(start), "illegal Unicode character in a string literal");
        utf8_append(out, v);
      };
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i, ++p) {
              v = v * 8 + static_cast<char32_t>(src_[p] - '0');
            }
            utf8_append(out, v);
          } else {  // an unknown escape stays as written
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    Token t;
    t.type = Tok::String;
    t.text = std::move(out);
    t.line = line_at(start);
    tokens_.push_back(std::move(t));
    return p + 1;
  }

  size_t digits(size_t p) const {  // \d+(_\d+)*
    while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])))) ++p;
    return p;
  }

  size_t number(size_t p) {
    size_t e = digits(p);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        e = digits(q);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    t.line = line_at(p);
    if (is_float) {
      t.type = Tok::Float;
      t.real = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Tok::Int;
      errno = 0;
      t.integer = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) template_fail(t.line, "integer literal {} is too large", text);
    }
    t.text = std::move(text);
    tokens_.push_back(std::move(t));
    return e;
  }
};

}  // namespace

const char* token_desc(Tok t) {
  switch (t) {
    case Tok::Text: return "template data";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::Name: return "name";
    case Tok::String: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::Op: return "operator";
    case Tok::Eof: return "end of template";
  }
  return "?";
}

std::vector<Token> lex(std::string_view source) {
  // jinja2 normalises every newline to \n first, then drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace tandem::chat
