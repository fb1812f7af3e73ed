// jinja2's filters and tests as chat templates use them, with transformers' tojson (ensure_ascii off,
// Python json.dumps spacing, indent / separators / sort_keys). Filters not listed fail as unknown.
#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/interpreter.h"

namespace tandem::chat {
namespace {

bool flag(const CallArgs& a, size_t i, std::string_view name, bool fallback) {
  const Value* v = arg(a, i, name);
  return v ? truthy(*v) : fallback;
}

size_t length_of(const Value& v, int line) {
  switch (v.kind) {
    case Kind::String: return utf8_length(v.str);
    case Kind::List: return v.list->size();
    case Kind::Dict:
    case Kind::Namespace: return v.dict->size();
    case Kind::Undefined: return 0;
    case Kind::None:
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
    case Kind::Callable:
      break;
  }
  template_fail(line, "object of type '{}' has no len()", type_name(v));
}

// jinja2's make_attrgetter: "a.b.0" looks up item by item (item first, then attribute).
Value attr_path(const Value& item, const std::string& path, int line) {
  Value v = item;
  size_t pos = 0;
  for (;;) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (v.is_undefined()) undefined_fail(v, line);
    bool digits = !part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(v, digits ? Value::from(static_cast<int64_t>(std::stoll(part))) : Value::from(part), line);
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

const std::string* attribute_arg(const CallArgs& a, size_t i) {
  const Value* v = arg(a, i, "attribute");
  if (!v || v->kind == Kind::None) return nullptr;
  if (v->kind != Kind::String) template_fail(a.line, "attribute must be a string");
  return &v->str;
}

std::string lower(const std::string& s) {
  std::u32string cps = utf8_decode(s);
  for (char32_t& c : cps) {
    if (c < 0xDC80 || c > 0xDCFF) c = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  }
  return utf8_encode(cps);
}

// The key a sort, min, max or unique compares: the attribute, lowercased unless case_sensitive.
Value sort_key(const Value& item, const std::string* attribute, bool case_sensitive, int line) {
  Value v = attribute ? attr_path(item, *attribute, line) : item;
  if (!case_sensitive && v.kind == Kind::String) return Value::from(lower(v.str));
  return v;
}

Value select_common(Interpreter& in, const Value& input, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  std::string attribute;
  if (by_attr) {
    const Value* at = arg(a, next++, "attribute");
    if (!at || at->kind != Kind::String) template_fail(a.line, "selectattr/rejectattr need an attribute name");
    attribute = at->str;
  }
  const Value* test = next < a.args.size() ? &a.args[next++] : nullptr;
  if (test && test->kind != Kind::String) template_fail(a.line, "the test name must be a string");
  CallArgs targs;
  targs.line = a.line;
  targs.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.args.size())), a.args.end());
  List out;
  for (const Value& item : iterate(input, a.line)) {
    in.step(a.line);
    Value v = by_attr ? attr_path(item, attribute, a.line) : item;
    CallArgs call = targs;
    bool ok = test ? in.test(test->str, v, call, a.line) : truthy(v);
    if (ok == keep) out.push_back(item);
  }
  return Value::from(std::move(out));
}

Value f_tojson(Interpreter&, const Value& v, CallArgs& a) {
  JsonStyle st;
  const Value* indent = arg(a, 0, "indent");
  st.ensure_ascii = flag(a, 1, "ensure_ascii", false);
  st.sort_keys = flag(a, 3, "sort_keys", false);
  if (indent && indent->kind != Kind::None) {
    st.indented = true;
    st.item_sep = ",";
    if (indent->kind == Kind::String) {
      st.indent = indent->str;
    } else if (indent->kind == Kind::Int) {
      st.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent->integer, 0, 64)), ' ');
    } else {
      template_fail(a.line, "tojson: indent must be an integer or a string");
    }
  }
  const Value* sep = arg(a, 2, "separators");
  if (sep && sep->kind != Kind::None) {
    if (sep->kind != Kind::List || sep->list->size() != 2 || (*sep->list)[0].kind != Kind::String ||
        (*sep->list)[1].kind != Kind::String) {
      template_fail(a.line, "tojson: separators must be a pair of strings");
    }
    st.item_sep = (*sep->list)[0].str;
    st.key_sep = (*sep->list)[1].str;
  }
  return Value::from(to_json(v, st, a.line));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default_value");
  bool boolean = flag(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return d ? *d : Value::from(std::string());
  return v;
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "d");
  const std::string* attribute = attribute_arg(a, 1);
  std::string sep = d ? to_str(*d) : "";
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v, a.line)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute ? attr_path(x, *attribute, a.line) : x);
    in.check_size(out.size(), a.line);
  }
  return Value::from(std::move(out));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  List out;
  constexpr size_t kKeywordOnly = SIZE_MAX;  // map(attribute=..., default=...) takes them by name only
  const std::string* attribute = attribute_arg(a, kKeywordOnly);
  if (attribute) {
    const Value* d = arg(a, kKeywordOnly, "default");
    for (const Value& x : iterate(v, a.line)) {
      Value r = attr_path(x, *attribute, a.line);
      out.push_back(r.is_undefined() && d ? *d : r);
    }
    return Value::from(std::move(out));
  }
  if (a.args.empty() || a.args[0].kind != Kind::String) template_fail(a.line, "map needs a filter name or attribute=");
  CallArgs fargs;
  fargs.args.assign(a.args.begin() + 1, a.args.end());
  fargs.kwargs = a.kwargs;
  for (const Value& x : iterate(v, a.line)) {
    in.step(a.line);
    CallArgs call = fargs;
    out.push_back(in.filter(a.args[0].str, x, call, a.line));
  }
  return Value::from(std::move(out));
}

Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  if (v.is_undefined()) return Value::from(List{});
  if (v.kind != Kind::Dict) template_fail(a.line, "can only get item pairs from a mapping");
  List out;
  for (const auto& [k, x] : v.dict->entries()) out.push_back(Value::from(List{Value::from(k), x}, true));
  return Value::from(std::move(out));
}

Value f_sort(Interpreter&, const Value& v, CallArgs& a) {
  bool reverse = flag(a, 0, "reverse", false);
  bool case_sensitive = flag(a, 1, "case_sensitive", false);
  const std::string* attribute = attribute_arg(a, 2);
  List items = iterate(v, a.line);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : items) keyed.emplace_back(sort_key(x, attribute, case_sensitive, a.line), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, a.line) < 0 : compare(x.first, y.first, a.line) < 0;
  });
  List out;
  for (auto& [k, x] : keyed) out.push_back(std::move(x));
  return Value::from(std::move(out));
}

Value f_minmax(const Value& v, CallArgs& a, bool want_max) {
  bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const std::string* attribute = attribute_arg(a, 1);
  List items = iterate(v, a.line);
  if (items.empty()) return Value::undefined("no items to take the min or max of");
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, case_sensitive, a.line);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], attribute, case_sensitive, a.line);
    int c = compare(k, best_key, a.line);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  if (v.is_undefined()) undefined_fail(v, a.line);  // int(Undefined) raises in jinja2
  const Value* d = arg(a, 0, "default");
  Value fallback = d ? *d : Value::from(int64_t{0});
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::from(static_cast<int64_t>(v.boolean));
    case Kind::Float:
      if (!std::isfinite(v.real) || std::fabs(v.real) >= 9.2e18) return fallback;
      return Value::from(static_cast<int64_t>(v.real));
    case Kind::String: {
      std::string s = v.str;
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      errno = 0;
      char* end = nullptr;
      long long i = std::strtoll(s.c_str(), &end, 10);
      while (end && *end && (*end == ' ' || *end == '\t' || *end == '\n')) ++end;
      if (errno == 0 && end && *end == 0 && !s.empty()) return Value::from(static_cast<int64_t>(i));
      double f = std::strtod(s.c_str(), &end);
      while (end && *end && (*end == ' ' || *end == '\t' || *end == '\n')) ++end;
      if (end && *end == 0 && !s.empty() && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value::from(static_cast<int64_t>(f));
      return fallback;
    }
    case Kind::Undefined:
    case Kind::None:
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace:
    case Kind::Callable:
      break;
  }
  return fallback;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  if (v.is_undefined()) undefined_fail(v, a.line);
  const Value* d = arg(a, 0, "default");
  Value fallback = d ? *d : Value::from(0.0);
  if (v.is_number()) return Value::from(v.kind == Kind::Float ? v.real : static_cast<double>(v.kind == Kind::Bool ? v.boolean : v.integer));
  if (v.kind == Kind::String) {
    char* end = nullptr;
    double f = std::strtod(v.str.c_str(), &end);
    if (!v.str.empty() && end && *end == 0) return Value::from(f);
  }
  return fallback;
}

Value f_indent(Interpreter&, const Value& v, CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  std::string pad = !w ? "    " : w->kind == Kind::String ? w->str : std::string(static_cast<size_t>(std::clamp<int64_t>(w->integer, 0, 256)), ' ');
  bool first = flag(a, 1, "first", false), blank = flag(a, 2, "blank", false);
  std::string s = to_str(v) + "\n";
  std::vector<std::string> lines;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(cur);
      cur.clear();
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      cur.push_back(s[i]);
    }
  }
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + ((blank || !lines[i].empty()) ? pad : "") + lines[i];
  return Value::from(first ? pad + out : out);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  Value method = get_attr(Value::from(to_str(v)), "replace", a.line);
  return in.call(method, a, a.line);
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  Value method = get_attr(Value::from(to_str(v)), "strip", a.line);
  return in.call(method, a, a.line);
}

Value f_title_or_capitalize(const Value& v, bool title) {
  std::u32string cps = utf8_decode(to_str(v));
  bool start = true;
  for (char32_t& c : cps) {
    bool letter = c < 0xDC80 || c > 0xDCFF;
    if (letter) c = static_cast<char32_t>(start ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
    start = title ? (is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') : false;
  }
  return Value::from(utf8_encode(cps));
}

Value f_escape(const Value& v) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value::from(std::move(out));
}

Value f_round(const Value& v, CallArgs& a) {
  if (v.is_undefined()) undefined_fail(v, a.line);
  if (!v.is_number()) template_fail(a.line, "round: '{}' is not a number", type_name(v));
  double x = v.kind == Kind::Float ? v.real : static_cast<double>(v.kind == Kind::Bool ? v.boolean : v.integer);
  int64_t precision = 0;
  if (const Value* p = arg(a, 0, "precision"); p && p->kind == Kind::Int) precision = std::clamp<int64_t>(p->integer, -20, 20);
  const Value* m = arg(a, 1, "method");
  std::string method = m ? to_str(*m) : "common";
  double scale = std::pow(10.0, static_cast<double>(precision));
  double y = x * scale;
  y = method == "ceil" ? std::ceil(y) : method == "floor" ? std::floor(y) : std::nearbyint(y);  // Python: half to even
  return Value::from(y / scale);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"tojson", f_tojson},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"map", f_map},
      {"items", f_items},
      {"sort", f_sort},
      {"int", f_int},
      {"float", f_float},
      {"indent", f_indent},
      {"replace", f_replace},
      {"trim", f_trim},
      {"length", +[](Interpreter&, const Value& v, CallArgs& a) { return Value::from(static_cast<int64_t>(length_of(v, a.line))); }},
      {"count", +[](Interpreter&, const Value& v, CallArgs& a) { return Value::from(static_cast<int64_t>(length_of(v, a.line))); }},
      {"string", +[](Interpreter&, const Value& v, CallArgs&) { return Value::from(to_str(v)); }},
      {"safe", +[](Interpreter&, const Value& v, CallArgs&) { return v; }},
      {"upper", +[](Interpreter& in, const Value& v, CallArgs& a) {
        CallArgs none{{}, {}, a.line};
        return in.call(get_attr(Value::from(to_str(v)), "upper", a.line), none, a.line);
      }},
      {"lower", +[](Interpreter&, const Value& v, CallArgs&) { return Value::from(lower(to_str(v))); }},
      {"title", +[](Interpreter&, const Value& v, CallArgs&) { return f_title_or_capitalize(v, true); }},
      {"capitalize", +[](Interpreter&, const Value& v, CallArgs&) { return f_title_or_capitalize(v, false); }},
      {"escape", +[](Interpreter&, const Value& v, CallArgs&) { return f_escape(v); }},
      {"e", +[](Interpreter&, const Value& v, CallArgs&) { return f_escape(v); }},
      {"round", +[](Interpreter&, const Value& v, CallArgs& a) { return f_round(v, a); }},
      {"list", +[](Interpreter&, const Value& v, CallArgs& a) { return Value::from(iterate(v, a.line)); }},
      {"first", +[](Interpreter&, const Value& v, CallArgs& a) {
        List l = iterate(v, a.line);
        return l.empty() ? Value::undefined("no first item, sequence was empty") : l.front();
      }},
      {"last", +[](Interpreter&, const Value& v, CallArgs& a) {
        List l = iterate(v, a.line);
        return l.empty() ? Value::undefined("no last item, sequence was empty") : l.back();
      }},
      {"reverse", +[](Interpreter&, const Value& v, CallArgs& a) {
        if (v.kind == Kind::String) {
          std::u32string cps = utf8_decode(v.str);
          std::reverse(cps.begin(), cps.end());
          return Value::from(utf8_encode(cps));
        }
        List l = iterate(v, a.line);
        std::reverse(l.begin(), l.end());
        return Value::from(std::move(l));
      }},
      {"unique", +[](Interpreter&, const Value& v, CallArgs& a) {
        bool case_sensitive = flag(a, 0, "case_sensitive", false);
        const std::string* attribute = attribute_arg(a, 1);
        List out, seen;
        for (const Value& x : iterate(v, a.line)) {
          Value k = sort_key(x, attribute, case_sensitive, a.line);
          if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
            seen.push_back(k);
            out.push_back(x);
          }
        }
        return Value::from(std::move(out));
      }},
      {"min", +[](Interpreter&, const Value& v, CallArgs& a) { return f_minmax(v, a, false); }},
      {"max", +[](Interpreter&, const Value& v, CallArgs& a) { return f_minmax(v, a, true); }},
      {"sum", +[](Interpreter& in, const Value& v, CallArgs& a) {
        const std::string* attribute = attribute_arg(a, 0);
        const Value* start = arg(a, 1, "start");
        Value total = start ? *start : Value::from(int64_t{0});
        for (const Value& x : iterate(v, a.line)) {
          Value item = attribute ? attr_path(x, *attribute, a.line) : x;
          if (!item.is_number() || !total.is_number()) template_fail(a.line, "sum: '{}' is not a number", type_name(item));
          if (total.kind == Kind::Float || item.kind == Kind::Float) {
            auto d = [](const Value& n) { return n.kind == Kind::Float ? n.real : static_cast<double>(n.kind == Kind::Bool ? n.boolean : n.integer); };
            total = Value::from(d(total) + d(item));
          } else {
            int64_t r = 0;
            int64_t t = total.kind == Kind::Bool ? total.boolean : total.integer;
            if (__builtin_add_overflow(t, item.kind == Kind::Bool ? item.boolean : item.integer, &r)) {
              template_fail(a.line, "integer overflow in sum");
            }
            total = Value::from(r);
          }
          in.step(a.line);
        }
        return total;
      }},
      {"abs", +[](Interpreter&, const Value& v, CallArgs& a) {
        if (v.is_undefined()) undefined_fail(v, a.line);
        if (v.kind == Kind::Float) return Value::from(std::fabs(v.real));
        if (v.kind != Kind::Int && v.kind != Kind::Bool) template_fail(a.line, "bad operand type for abs(): '{}'", type_name(v));
        int64_t i = v.kind == Kind::Bool ? v.boolean : v.integer;
        if (i == INT64_MIN) template_fail(a.line, "integer overflow");
        return Value::from(i < 0 ? -i : i);
      }},
      {"attr", +[](Interpreter&, const Value& v, CallArgs& a) {
        const Value* name = arg(a, 0, "name");
        if (!name || name->kind != Kind::String) template_fail(a.line, "attr needs a name");
        if (v.is_undefined()) undefined_fail(v, a.line);
        if (v.kind == Kind::Dict) {  // getattr only: a dict's keys are not attributes
          Value m = get_attr(v, name->str, a.line);
          return v.dict->find(name->str) && m.kind != Kind::Callable ? Value::undefined("'dict object' has no attribute '" + name->str + "'") : m;
        }
        return get_attr(v, name->str, a.line);
      }},
      {"dictsort", +[](Interpreter&, const Value& v, CallArgs& a) {
        if (v.kind != Kind::Dict) template_fail(a.line, "dictsort: you can only sort a dict");
        bool case_sensitive = flag(a, 0, "case_sensitive", false);
        const Value* by = arg(a, 1, "by");
        bool by_value = by && to_str(*by) == "value";
        bool reverse = flag(a, 2, "reverse", false);
        List items;
        for (const auto& [k, x] : v.dict->entries()) items.push_back(Value::from(List{Value::from(k), x}, true));
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          Value kx = sort_key((*x.list)[by_value ? 1 : 0], nullptr, case_sensitive, a.line);
          Value ky = sort_key((*y.list)[by_value ? 1 : 0], nullptr, case_sensitive, a.line);
          return reverse ? compare(ky, kx, a.line) < 0 : compare(kx, ky, a.line) < 0;
        });
        return Value::from(std::move(items));
      }},
      {"select", +[](Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, false, true); }},
      {"reject", +[](Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, false, false); }},
      {"selectattr", +[](Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, true, true); }},
      {"rejectattr", +[](Interpreter& in, const Value& v, CallArgs& a) { return select_common(in, v, a, true, false); }},
  };
  return table;
}

// Python's x % n for the number tests (odd, even, divisibleby): ints exactly, floats as floats.
double py_mod(const Value& x, const Value& n, int line) {
  if (x.is_undefined()) undefined_fail(x, line);
  if (!x.is_number() || !n.is_number()) {
    template_fail(line, "unsupported operand type(s) for %: '{}' and '{}'", type_name(x), type_name(n));
  }
  auto as_d = [](const Value& v) { return v.kind == Kind::Float ? v.real : static_cast<double>(v.kind == Kind::Bool ? v.boolean : v.integer); };
  if (x.kind != Kind::Float && n.kind != Kind::Float) {
    int64_t a = x.kind == Kind::Bool ? x.boolean : x.integer, b = n.kind == Kind::Bool ? n.boolean : n.integer;
    if (b == 0) template_fail(line, "integer division or modulo by zero");
    if (b == -1) return 0;
    int64_t m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return static_cast<double>(m);
  }
  double a = as_d(x), b = as_d(n);
  if (b == 0) template_fail(line, "float modulo");
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

const Value& other(const CallArgs& a) {
  const Value* v = arg(a, 0, "other");
  if (!v) template_fail(a.line, "this test needs a value to compare with");
  return *v;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", +[](Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", +[](Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::None; }},
      {"boolean", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Bool; }},
      {"true", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && v.boolean; }},
      {"false", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && !v.boolean; }},
      {"integer", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Int; }},
      {"float", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Float; }},
      {"number", +[](Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }},
      {"string", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::String; }},
      {"mapping", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Dict; }},
      {"iterable", +[](Interpreter&, const Value& v, CallArgs&) {
        return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
      }},
      {"sequence", +[](Interpreter&, const Value& v, CallArgs&) {
        return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
      }},
      {"callable", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::Callable; }},
      {"odd", +[](Interpreter&, const Value& v, CallArgs& a) { return py_mod(v, Value::from(int64_t{2}), a.line) == 1; }},
      {"even", +[](Interpreter&, const Value& v, CallArgs& a) { return py_mod(v, Value::from(int64_t{2}), a.line) == 0; }},
      {"divisibleby", +[](Interpreter&, const Value& v, CallArgs& a) {
        const Value* n = arg(a, 0, "num");
        if (!n) template_fail(a.line, "divisibleby needs a number");
        return py_mod(v, *n, a.line) == 0;
      }},
      {"eq", +[](Interpreter&, const Value& v, CallArgs& a) { return equals(v, other(a)); }},
      {"equalto", +[](Interpreter&, const Value& v, CallArgs& a) { return equals(v, other(a)); }},
      {"==", +[](Interpreter&, const Value& v, CallArgs& a) { return equals(v, other(a)); }},
      {"sameas", +[](Interpreter&, const Value& v, CallArgs& a) {
        const Value& o = other(a);
        return v.kind == o.kind && equals(v, o);
      }},
      {"ne", +[](Interpreter&, const Value& v, CallArgs& a) { return !equals(v, other(a)); }},
      {"!=", +[](Interpreter&, const Value& v, CallArgs& a) { return !equals(v, other(a)); }},
      {"lt", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) < 0; }},
      {"<", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) < 0; }},
      {"le", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) <= 0; }},
      {"<=", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) <= 0; }},
      {"gt", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) > 0; }},
      {">", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) > 0; }},
      {"ge", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) >= 0; }},
      {">=", +[](Interpreter&, const Value& v, CallArgs& a) { return compare(v, other(a), a.line) >= 0; }},
      {"in", +[](Interpreter&, const Value& v, CallArgs& a) {
        const Value& seq = other(a);
        for (const Value& x : iterate(seq, a.line)) {
          if (seq.kind == Kind::String ? (v.kind == Kind::String && seq.str.find(v.str) != std::string::npos) : equals(x, v)) return true;
        }
        return seq.kind == Kind::String && v.kind == Kind::String && v.str.empty();
      }},
      {"lower", +[](Interpreter&, const Value& v, CallArgs&) { return v.kind == Kind::String && lower(v.str) == v.str; }},
      {"upper", +[](Interpreter& in, const Value& v, CallArgs& a) {
        if (v.kind != Kind::String) return false;
        CallArgs none{{}, {}, a.line};
        return to_str(in.call(get_attr(v, "upper", a.line), none, a.line)) == v.str;
      }},
  };
  return table;
}

}  // namespace

const FilterFn* find_filter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : &it->second;
}

const TestFn* find_test(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : &it->second;
}

}  // namespace tandem::chat
