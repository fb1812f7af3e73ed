// Attribute and item lookup, slicing, and the Python methods of str, dict and list that templates call
// (see builtins.h). The filters and tests are in filters.cpp.
#include "chat/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "chat/interpreter.h"

namespace tandem::chat {
namespace {

std::string object_type(const Value& v) { return v.kind == Kind::None ? "None" : type_name(v) + " object"; }

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type(obj), name));
}

const std::string& str_arg(const CallArgs& a, size_t i, std::string_view name, std::string_view method) {
  const Value* v = arg(a, i, name);
  if (!v) template_fail(a.line, "{}() is missing the argument '{}'", method, name);
  if (v->kind != Kind::String) template_fail(a.line, "{}() expects a string for '{}', got '{}'", method, name, type_name(*v));
  return v->str;
}

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t fallback) {
  const Value* v = arg(a, i, name);
  if (!v || v->kind == Kind::None) return fallback;
  if (v->kind != Kind::Int && v->kind != Kind::Bool) template_fail(a.line, "'{}' must be an integer", name);
  return v->kind == Kind::Bool ? v->boolean : v->integer;
}

// str.strip family: chars null → whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right, int line) {
  std::u32string cps = utf8_decode(s);
  std::u32string set;
  bool ws = !chars || chars->kind == Kind::None;
  if (!ws) {
    if (chars->kind != Kind::String) template_fail(line, "strip arg must be None or str");
    set = utf8_decode(chars->str);
  }
  auto drop = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && drop(cps[b])) ++b;
  }
  if (right) {
    while (e > b && drop(cps[e - 1])) --e;
  }
  return utf8_encode(cps.substr(b, e - b));
}

List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right, int line) {
  List out;
  if (!sep || sep->kind == Kind::None) {  // runs of whitespace, no empty parts
    std::u32string cps = utf8_decode(s);
    std::vector<std::u32string> parts;
    if (!from_right) {
      size_t i = 0;
      while (i < cps.size()) {
        while (i < cps.size() && is_py_space(cps[i])) ++i;
        if (i == cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t e = cps.size();
          while (e > i && is_py_space(cps[e - 1])) --e;
          parts.push_back(cps.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !is_py_space(cps[j])) ++j;
        parts.push_back(cps.substr(i, j - i));
        i = j;
      }
    } else {
      size_t i = cps.size();
      while (i > 0) {
        while (i > 0 && is_py_space(cps[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t b = 0;
          while (b < i && is_py_space(cps[b])) ++b;
          parts.push_back(cps.substr(b, i - b));
          break;
        }
        size_t j = i;
        while (j > 0 && !is_py_space(cps[j - 1])) --j;
        parts.push_back(cps.substr(j, i - j));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::from(utf8_encode(p)));
    return out;
  }
  if (sep->kind != Kind::String) template_fail(line, "must be str or None, not {}", type_name(*sep));
  const std::string& d = sep->str;
  if (d.empty()) template_fail(line, "empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t pos = 0;
    for (;;) {
      size_t f = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ? std::string::npos : s.find(d, pos);
      if (f == std::string::npos) {
        parts.push_back(s.substr(pos));
        break;
      }
      parts.push_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
  } else {
    size_t end = s.size();
    for (;;) {
      size_t f = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) || end < d.size()
                     ? std::string::npos : s.rfind(d, end - d.size());
      if (f == std::string::npos) {
        parts.push_back(s.substr(0, end));
        break;
      }
      parts.push_back(s.substr(f + d.size(), end - f - d.size()));
      end = f;
    }
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::from(std::move(p)));
  return out;
}

bool affix(const std::string& s, const Value* v, bool prefix, int line) {
  if (!v) template_fail(line, "{}() takes at least 1 argument", prefix ? "startswith" : "endswith");
  auto one = [&](const Value& x) {
    if (x.kind != Kind::String) template_fail(line, "{} first arg must be str or a tuple of str", prefix ? "startswith" : "endswith");
    return prefix ? s.starts_with(x.str) : s.ends_with(x.str);
  };
  if (v->kind == Kind::List) {
    return std::any_of(v->list->begin(), v->list->end(), one);
  }
  return one(*v);
}

std::string map_case(const std::string& s, bool upper) {
  std::u32string cps = utf8_decode(s);
  for (char32_t& c : cps) {
    if (c >= 0xDC80 && c <= 0xDCFF) continue;
    c = static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                    : utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  }
  return utf8_encode(cps);
}

bool all_category(const std::string& s, bool (*pred)(char32_t)) {
  std::u32string cps = utf8_decode(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
bool is_alpha(char32_t c) { auto k = cat(c); return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO; }
bool is_digit(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; }

Value str_method(const std::string& s, const std::string& name, CallArgs& a) {
  int line = a.line;
  if (name == "startswith" || name == "endswith") return Value::from(affix(s, arg(a, 0, "prefix"), name == "startswith", line));
  if (name == "strip") return Value::from(strip(s, arg(a, 0, "chars"), true, true, line));
  if (name == "lstrip") return Value::from(strip(s, arg(a, 0, "chars"), true, false, line));
  if (name == "rstrip") return Value::from(strip(s, arg(a, 0, "chars"), false, true, line));
  if (name == "split" || name == "rsplit") {
    return Value::from(split(s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1), name == "rsplit", line));
  }
  if (name == "lower" || name == "casefold") return Value::from(map_case(s, false));
  if (name == "upper") return Value::from(map_case(s, true));
  if (name == "replace") {
    const std::string& from = str_arg(a, 0, "old", name);
    const std::string& to = str_arg(a, 1, "new", name);
    int64_t count = int_arg(a, 2, "count", -1);
    std::string out;
    if (from.empty()) {
      std::u32string cps = utf8_decode(s);
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || static_cast<int64_t>(i) < count) out += to;
        if (i < cps.size()) utf8_append(out, cps[i]);
      }
      return Value::from(std::move(out));
    }
    size_t pos = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
      size_t f = s.find(from, pos);
      if (f == std::string::npos) break;
      out.append(s, pos, f - pos);
      out += to;
      pos = f + from.size();
    }
    out.append(s, pos);
    return Value::from(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string& sub = str_arg(a, 0, "sub", name);
    size_t f = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (f == std::string::npos) {
      if (name.ends_with("index")) template_fail(line, "substring not found");
      return Value::from(int64_t{-1});
    }
    return Value::from(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, f))));
  }
  if (name == "count") {
    const std::string& sub = str_arg(a, 0, "sub", name);
    if (sub.empty()) return Value::from(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
    return Value::from(n);
  }
  if (name == "format") return Value::from(py_format(s, a, line));
  if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) template_fail(line, "join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(*items, line)) {
      if (x.kind != Kind::String) template_fail(line, "sequence item: expected str instance, {} found", type_name(x));
      if (!first) out += s;
      first = false;
      out += x.str;
    }
    return Value::from(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    std::string cur;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        out.push_back(Value::from(cur));
        cur.clear();
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      } else {
        cur.push_back(s[i]);
      }
    }
    if (!cur.empty()) out.push_back(Value::from(cur));
    return Value::from(std::move(out));
  }
  if (name == "isspace") return Value::from(all_category(s, is_py_space));
  if (name == "isalpha") return Value::from(all_category(s, is_alpha));
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") return Value::from(all_category(s, is_digit));
  if (name == "isalnum") return Value::from(all_category(s, [](char32_t c) { return is_alpha(c) || is_digit(c); }));
  if (name == "islower") return Value::from(map_case(s, false) == s && map_case(s, true) != s);
  if (name == "isupper") return Value::from(map_case(s, true) == s && map_case(s, false) != s);
  template_fail(line, "str has no method '{}'", name);
}

const std::unordered_set<std::string_view> kStrMethods = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "lower", "casefold", "upper",
    "replace", "find", "rfind", "index", "rindex", "count", "format", "join", "splitlines", "isspace",
    "isalpha", "isdigit", "isnumeric", "isdecimal", "isalnum", "islower", "isupper"};
const std::unordered_set<std::string_view> kUnsafeMethods = {
    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "popitem", "setdefault", "update"};

List items_of(const Dict& d) {
  List out;
  for (const auto& [k, v] : d.entries()) out.push_back(Value::from(List{Value::from(k), v}, true));
  return out;
}

Value bound(const Value& obj, const std::string& name) {
  return Value::function(name, [obj, name](Interpreter&, CallArgs& a) -> Value {
    if (obj.kind == Kind::String) return str_method(obj.str, name, a);
    if (obj.kind == Kind::Dict) {
      if (name == "items") return Value::from(items_of(*obj.dict));
      List out;
      for (const auto& [k, v] : obj.dict->entries()) out.push_back(name == "keys" ? Value::from(k) : v);
      if (name == "keys" || name == "values") return Value::from(std::move(out));
      const Value* key = arg(a, 0, "key");
      if (!key) template_fail(a.line, "get() takes at least 1 argument");
      const Value* found = key->kind == Kind::String ? obj.dict->find(key->str) : nullptr;
      if (found) return *found;
      const Value* fallback = arg(a, 1, "default");
      return fallback ? *fallback : Value::none();
    }
    const Value* x = arg(a, 0, "value");
    if (!x) template_fail(a.line, "{}() takes exactly one argument", name);
    int64_t n = 0;
    for (size_t i = 0; i < obj.list->size(); ++i) {
      if (!equals((*obj.list)[i], *x)) continue;
      if (name == "index") return Value::from(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") template_fail(a.line, "{} is not in list", repr(*x));
    return Value::from(n);
  });
}

// The Python attribute `name` of obj (a method), or null.
std::optional<Value> method(const Value& obj, const std::string& name) {
  if (obj.kind == Kind::String && kStrMethods.count(name)) return bound(obj, name);
  if (obj.kind == Kind::Dict && (name == "items" || name == "keys" || name == "values" || name == "get")) {
    return bound(obj, name);
  }
  if (obj.kind == Kind::List && (name == "index" || name == "count")) return bound(obj, name);
  if ((obj.kind == Kind::Dict || obj.kind == Kind::List) && kUnsafeMethods.count(name)) {
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe", name, type_name(obj)));
  }
  return std::nullopt;
}

int64_t code_points(const Value& v) {
  return static_cast<int64_t>(v.kind == Kind::String ? utf8_length(v.str) : v.list->size());
}

}  // namespace

const Value* arg(const CallArgs& a, size_t i, std::string_view name) {
  if (i < a.args.size()) return &a.args[i];
  for (const auto& [k, v] : a.kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (auto m = method(obj, name)) return *m;
  if ((obj.kind == Kind::Dict || obj.kind == Kind::Namespace)) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return no_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace) {
    if (key.kind == Kind::String) {
      if (const Value* v = obj.dict->find(key.str)) return *v;
      return get_attr(obj, key.str, line);
    }
    return Value::undefined(fmt::format("'{}' has no element {}", object_type(obj), repr(key)));
  }
  if ((obj.kind == Kind::List || obj.kind == Kind::String) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    int64_t n = code_points(obj);
    int64_t i = key.kind == Kind::Bool ? key.boolean : key.integer;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(fmt::format("'{}' has no element {}", object_type(obj), repr(key)));
    if (obj.kind == Kind::List) return (*obj.list)[static_cast<size_t>(i)];
    std::u32string cps = utf8_decode(obj.str);
    std::string s;
    utf8_append(s, cps[static_cast<size_t>(i)]);
    return Value::from(std::move(s));
  }
  if (key.kind == Kind::String) return get_attr(obj, key.str, line);
  return Value::undefined(fmt::format("'{}' has no element {}", object_type(obj), repr(key)));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (obj.kind != Kind::List && obj.kind != Kind::String) template_fail(line, "'{}' object is not subscriptable", type_name(obj));
  auto index = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.kind == Kind::None) return std::nullopt;
    if (v.kind != Kind::Int && v.kind != Kind::Bool) template_fail(line, "slice {} must be an integer or None", what);
    return v.kind == Kind::Bool ? v.boolean : v.integer;
  };
  int64_t n = code_points(obj);
  int64_t st = index(step, "step").value_or(1);
  if (st == 0) template_fail(line, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i = i < -n ? (st < 0 ? -1 : 0) : i + n;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t b = clamp(index(start, "start"), st < 0 ? n - 1 : 0);
  int64_t e = clamp(index(stop, "stop"), st < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(static_cast<size_t>(i));
  if (obj.kind == Kind::List) {
    List out;
    for (size_t i : picks) out.push_back((*obj.list)[i]);
    return Value::from(std::move(out), obj.tuple);
  }
  std::u32string cps = utf8_decode(obj.str), out;
  for (size_t i : picks) out.push_back(cps[i]);
  return Value::from(utf8_encode(out));
}

std::string py_format(const std::string& f, const CallArgs& a, int line) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') ++i;
      else template_fail(line, "format: single '}}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = f.find('}', i);
    if (close == std::string::npos) template_fail(line, "format: single '{{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!{[.") != std::string::npos) template_fail(line, "format: field '{}' is not supported", field);
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.args.size() ? &a.args[auto_index++] : nullptr;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t k = field.size() < 6 ? std::stoul(field) : a.args.size();
      v = k < a.args.size() ? &a.args[k] : nullptr;
    } else {
      for (const auto& [k, x] : a.kwargs) {
        if (k == field) v = &x;
      }
    }
    if (!v) template_fail(line, "format: no argument for field '{{{}}}'", field);
    out += to_str(*v);
    i = close;
  }
  return out;
}

}  // namespace tandem::chat
