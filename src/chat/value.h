// The values a chat template computes with: a small dynamic type with Python's semantics where
// output depends on them (str() and repr() of every kind, truthiness, ==, ordering, json.dumps), and
// the one error type every part of the interpreter throws. Strings are UTF-8 bytes; indexing, slicing
// and length count code points, as Python's str does. Lists and dicts are shared and never mutated
// once built (the sandbox transformers uses is immutable); only a namespace() is written to.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem::chat {

// Bad template source or a failure while rendering. line() is the template line (0: unknown);
// raised() is true for the template's own raise_exception(message), whose text is message().
class ChatTemplateError : public InputError {
 public:
  // what(): "<origin>, line <line>: <message>".
  ChatTemplateError(std::string message, int line, bool raised, const std::string& origin = "chat template");
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  bool raised() const { return raised_; }

 private:
  std::string message_;
  int line_;
  bool raised_;
};

template <class... Args>
[[noreturn]] void template_fail(int line, fmt::format_string<Args...> format, Args&&... args) {
  throw ChatTemplateError(fmt::format(format, std::forward<Args>(args)...), line, false);
}

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value;
class Interpreter;
using List = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

struct CallArgs {
  std::vector<Value> args;
  Kwargs kwargs;
  int line = 0;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

class Dict;

struct Value {
  Kind kind = Kind::Undefined;
  bool tuple = false;                  // a List written as a tuple: repr (1, 2)
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string str;                     // String; for Undefined: why it is undefined ("'x' is undefined")
  std::shared_ptr<const List> list;    // List
  std::shared_ptr<Dict> dict;          // Dict, Namespace
  std::shared_ptr<const Callable> fn;  // Callable

  static Value undefined(std::string why) { Value v; v.str = std::move(why); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value from(bool b) { Value v; v.kind = Kind::Bool; v.boolean = b; return v; }
  static Value from(int64_t i) { Value v; v.kind = Kind::Int; v.integer = i; return v; }
  static Value from(double d) { Value v; v.kind = Kind::Float; v.real = d; return v; }
  static Value from(std::string s) { Value v; v.kind = Kind::String; v.str = std::move(s); return v; }
  static Value from(List l, bool tuple = false);
  static Value from(std::shared_ptr<Dict> d);
  static Value namespace_of(std::shared_ptr<Dict> d);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict; }
};

// An insertion-ordered dict with string keys (all a chat template's inputs and literals need).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);  // replaces in place or appends
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Python semantics.
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); Undefined prints as ""
std::string repr(const Value& v);    // repr(v)
std::string repr_string(std::string_view s);
std::string float_repr(double d);    // repr(float): shortest round trip, 1.0, 1e-05, 1e+16
std::string type_name(const Value& v);  // 'str', 'int', 'dict', ... for error messages
bool equals(const Value& a, const Value& b);
// <0, 0, >0; fails (line) where Python raises TypeError.
int compare(const Value& a, const Value& b, int line);
// Where an Undefined is used in a way jinja2 refuses (arithmetic, attribute of it, calling it).
[[noreturn]] void undefined_fail(const Value& v, int line);

// Before `ns.attr = v`: fails (line) when v holds the namespace ns (a cycle) or nests too deeply, so
// that values stay trees of bounded depth.
void check_storable(const Value& v, const Dict* ns, int line);

// JSON in and out. Object key order is kept (inputs must come as ordered_json for that).
Value from_json(const nlohmann::ordered_json& j);
struct JsonStyle {
  std::string indent;  // empty and !indented: one line
  bool indented = false;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
std::string to_json(const Value& v, const JsonStyle& style, int line);  // json.dumps

// UTF-8 as code points. Invalid bytes become U+DC80..U+DCFF (Python's surrogateescape), so
// decode then encode gives back the same bytes.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
bool is_py_space(char32_t c);  // str.isspace()

}  // namespace tandem::chat
