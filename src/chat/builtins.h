// What a template can call without defining it: jinja2's filters and tests (the ones chat templates
// use), Python's str/dict methods reached by attribute (s.startswith, d.items), and attribute and item
// lookup with jinja2's rules (`a.b` tries the attribute first, `a['b']` the item first; a missing one
// is Undefined, never an error).
#pragma once

#include <string>
#include <string_view>

#include "chat/value.h"

namespace tandem::chat {

using FilterFn = Value (*)(Interpreter&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& input, CallArgs& args);

const FilterFn* find_filter(std::string_view name);  // null: no such filter
const TestFn* find_test(std::string_view name);      // null: no such test

Value get_attr(const Value& obj, const std::string& name, int line);  // obj.name
Value get_item(const Value& obj, const Value& key, int line);         // obj[key]
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);

// Python's str.format for the plain fields templates use: {}, {0}, {name}, {{ and }}.
std::string py_format(const std::string& fmt, const CallArgs& args, int line);

// Positional argument i or keyword `name` of a call, else null.
const Value* arg(const CallArgs& a, size_t i, std::string_view name);

}  // namespace tandem::chat
