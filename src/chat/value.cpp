// Values with Python's semantics (see value.h): str/repr, truthiness, equality and ordering,
// json.dumps, and the UTF-8 code point helpers.
#include "chat/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tandem::chat {
namespace {

// Bounds every walk over nested values (print, compare, convert): hostile input gets an error, not a
// stack overflow.
constexpr int kMaxNesting = 512;
thread_local int t_depth = 0;
struct NestGuard {
  NestGuard() {
    if (++t_depth > kMaxNesting) {
      --t_depth;
      template_fail(0, "value nested more than {} levels deep", kMaxNesting);
    }
  }
  ~NestGuard() { --t_depth; }
  NestGuard(const NestGuard&) = delete;
  NestGuard& operator=(const NestGuard&) = delete;
};

}  // namespace

ChatTemplateError::ChatTemplateError(std::string message, int line, bool raised, const std::string& origin)
    : InputError(line > 0 ? fmt::format("{}, line {}: {}", origin, line, message) : fmt::format("{}: {}", origin, message)),
      message_(std::move(message)),
      line_(line),
      raised_(raised) {}

Value Value::from(List l, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.tuple = tuple;
  v.list = std::make_shared<const List>(std::move(l));
  return v;
}
Value Value::from(std::shared_ptr<Dict> d) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::move(d);
  return v;
}
Value Value::namespace_of(std::shared_ptr<Dict> d) {
  Value v = from(std::move(d));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const Value* Dict::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}
void Dict::set(const std::string& key, Value value) {
  auto [it, inserted] = index_.try_emplace(key, entries_.size());
  if (inserted) {
    entries_.emplace_back(key, std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
}

// ---- UTF-8 ----

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t c = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &c);
    if (n <= 0) {
      out.push_back(0xDC00 + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(c));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // an escaped invalid byte goes back as itself
    out.push_back(static_cast<char>(c - 0xDC00));
    return;
  }
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  }
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? n : utf8_decode(s).size();
}

bool is_py_space(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85) return true;
  if (c < 0x80 || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// ---- str / repr ----

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16, else exponent.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (d == 0) return out + "0.0";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out.append("0.").append(static_cast<size_t>(-exp - 1), '0').append(digits);
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out.append(digits).append(static_cast<size_t>(exp + 1) - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(exp + 1)).append(1, '.').append(digits, static_cast<size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out.append(1, '.').append(digits, 1);
  out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  return out;
}

static bool py_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string repr_string(std::string_view s) {
  std::u32string cps = utf8_decode(s);
  bool has_single = cps.find(U'\'') != std::u32string::npos;
  bool has_double = cps.find(U'"') != std::u32string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : cps) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_printable(c)) {
      utf8_append(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string repr(const Value& v) {
  NestGuard guard;
  switch (v.kind) {
    case Kind::String:
      return repr_string(v.str);
    case Kind::Undefined:
      return "Undefined";
    case Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        out += repr((*v.list)[i]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out = v.kind == Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->entries()) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(x);
      }
      return out + (v.kind == Kind::Namespace ? "}>" : "}");
    }
    case Kind::None:
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
    case Kind::Callable:
      return to_str(v);
  }
  return "";
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.boolean ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.integer);
    case Kind::Float:
      return float_repr(v.real);
    case Kind::String:
      return v.str;
    case Kind::Callable:
      return "<function " + v.fn->name + ">";
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace:
      return repr(v);
  }
  return "";
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

void undefined_fail(const Value& v, int line) { template_fail(line, "{}", v.str.empty() ? "undefined value" : v.str); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.boolean;
    case Kind::Int:
      return v.integer != 0;
    case Kind::Float:
      return v.real != 0;
    case Kind::String:
      return !v.str.empty();
    case Kind::List:
      return !v.list->empty();
    case Kind::Dict:
      return v.dict->size() != 0;
    case Kind::Namespace:
    case Kind::Callable:
      return true;
  }
  return false;
}

static double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.real : v.kind == Kind::Bool ? (v.boolean ? 1.0 : 0.0) : static_cast<double>(v.integer);
}

bool equals(const Value& a, const Value& b) {
  NestGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      int64_t x = a.kind == Kind::Bool ? a.boolean : a.integer;
      int64_t y = b.kind == Kind::Bool ? b.boolean : b.integer;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str == b.str;
    case Kind::List:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    case Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : a.dict->entries()) {
        const Value* y = b.dict->find(k);
        if (!y || !equals(x, *y)) return false;
      }
      return true;
    case Kind::Namespace:
      return a.dict == b.dict;
    case Kind::Callable:
      return a.fn == b.fn;
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
      break;
  }
  return false;
}

int compare(const Value& a, const Value& b, int line) {
  NestGuard guard;
  if (a.is_undefined()) undefined_fail(a, line);
  if (b.is_undefined()) undefined_fail(b, line);
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      int64_t x = a.kind == Kind::Bool ? a.boolean : a.integer;
      int64_t y = b.kind == Kind::Bool ? b.boolean : b.integer;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::String && b.kind == Kind::String) {
    // UTF-8 byte order is code point order, as Python compares str.
    int c = a.str.compare(b.str);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
    for (size_t i = 0; i < a.list->size() && i < b.list->size(); ++i) {
      if (!equals((*a.list)[i], (*b.list)[i])) return compare((*a.list)[i], (*b.list)[i], line);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  template_fail(line, "'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

// ---- JSON ----

Value from_json(const nlohmann::ordered_json& j) {
  NestGuard guard;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::from(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::from(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::from(static_cast<int64_t>(u));
      return Value::from(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::from(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::from(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::from(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [k, x] : j.items()) d->set(k, from_json(x));
      return Value::from(std::move(d));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  return Value::none();
}

static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto escape_cp = [&](char32_t c) {
    if (c >= 0x10000) {
      char32_t v = c - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    }
  };
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          escape_cp(c);
        } else {
          utf8_append(out, c);
        }
    }
  }
  out.push_back('"');
}

static void json_value(std::string& out, const Value& v, const JsonStyle& st, int depth, int line) {
  if (depth > 512) template_fail(line, "tojson: value nested too deeply");
  auto newline = [&](int d) {
    if (!st.indented) return;
    out.push_back('\n');
    for (int i = 0; i < d; ++i) out += st.indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.integer); return;
    case Kind::Float:
      out += std::isnan(v.real) ? "NaN" : std::isinf(v.real) ? (v.real < 0 ? "-Infinity" : "Infinity") : float_repr(v.real);
      return;
    case Kind::String: json_string(out, v.str, st.ensure_ascii); return;
    case Kind::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out.push_back('[');
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += st.item_sep;
        newline(depth + 1);
        json_value(out, (*v.list)[i], st, depth + 1, line);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Kind::Dict: {
      if (v.dict->size() == 0) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : v.dict->entries()) items.push_back(&e);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += st.item_sep;
        newline(depth + 1);
        json_string(out, items[i]->first, st.ensure_ascii);
        out += st.key_sep;
        json_value(out, items[i]->second, st, depth + 1, line);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    case Kind::Undefined:
    case Kind::Namespace:
    case Kind::Callable:
      template_fail(line, "Object of type {} is not JSON serializable", type_name(v));
  }
}

void check_storable(const Value& v, const Dict* ns, int line) {
  NestGuard guard;
  if ((v.kind == Kind::Dict || v.kind == Kind::Namespace) && v.dict.get() == ns) {
    template_fail(line, "a namespace cannot hold itself");
  }
  if (v.kind == Kind::List) {
    for (const Value& x : *v.list) check_storable(x, ns, line);
  } else if (v.kind == Kind::Dict || v.kind == Kind::Namespace) {
    for (const auto& [k, x] : v.dict->entries()) check_storable(x, ns, line);
  }
}

std::string to_json(const Value& v, const JsonStyle& style, int line) {
  std::string out;
  json_value(out, v, style, 0, line);
  return out;
}

}  // namespace tandem::chat
