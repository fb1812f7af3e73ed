// Typed JSON field access for the placement files (see json_fields.h).
#include "placement/json_fields.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace tandem::placement_json {

using nlohmann::json;

json parse(std::string_view text, std::string_view source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail("{}: malformed JSON (byte {}): {}", source, e.byte, e.what());
  }
}

json parse_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("{}: read error", path);
  return parse(ss.str(), path);
}

static void dump_to(const json& j, int indent, std::string& out) {
  const std::string pad(size_t(indent + 1), ' '), close(size_t(indent), ' ');
  if (j.is_object() && !j.empty()) {
    std::vector<std::string> keys;
    if (j.contains("schema")) keys.push_back("schema");
    for (const auto& [key, v] : j.items())
      if (key != "schema") keys.push_back(key);
    out += "{\n";
    for (size_t i = 0; i < keys.size(); ++i) {
      out += pad + json(keys[i]).dump() + ": ";
      dump_to(j[keys[i]], indent + 1, out);
      out += i + 1 < keys.size() ? ",\n" : "\n";
    }
    out += close + "}";
    return;
  }
  bool structured = false;
  if (j.is_array())
    for (const json& v : j) structured = structured || v.is_structured();
  if (!structured) {
    out += j.dump();
    return;
  }
  out += "[\n";
  for (size_t i = 0; i < j.size(); ++i) {
    out += pad;
    dump_to(j[i], indent + 1, out);
    out += i + 1 < j.size() ? ",\n" : "\n";
  }
  out += close + "]";
}

std::string dump_readable(const json& j) {
  std::string out;
  dump_to(j, 0, out);
  return out + "\n";
}

void write_file(const std::string& path, const json& j) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot open file for writing", path);
  f << dump_readable(j);
  f.flush();
  if (!f) fail("{}: write error", path);
}

static std::string join(std::string_view where, std::string_view key) {
  return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
}

const json& field(const json& j, std::string_view key, std::string_view source, std::string_view where) {
  if (!j.is_object()) fail("{}: {} must be a JSON object", source, where.empty() ? "the document" : where);
  auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field {}", source, join(where, key));
  return *it;
}

const json& object_field(const json& j, std::string_view key, std::string_view source, std::string_view where) {
  const json& v = field(j, key, source, where);
  if (!v.is_object()) fail("{}: field {} must be an object", source, join(where, key));
  return v;
}

const json& array_field(const json& j, std::string_view key, std::string_view source, std::string_view where) {
  const json& v = field(j, key, source, where);
  if (!v.is_array()) fail("{}: field {} must be an array", source, join(where, key));
  return v;
}

std::string string_field(const json& j, std::string_view key, std::string_view source, std::string_view where) {
  const json& v = field(j, key, source, where);
  if (!v.is_string()) fail("{}: field {} must be a string", source, join(where, key));
  return v.get<std::string>();
}

int64_t int_value(const json& v, int64_t lo, int64_t hi, std::string_view source, std::string_view what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(hi)) fail("{}: {} = {} is out of range [{}, {}]", source, what, u, lo, hi);
    return int64_t(u);
  }
  if (!v.is_number_integer()) fail("{}: {} must be an integer, got {}", source, what, v.dump());
  int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) fail("{}: {} = {} is out of range [{}, {}]", source, what, i, lo, hi);
  return i;
}

int64_t int_field(const json& j, std::string_view key, int64_t lo, int64_t hi, std::string_view source,
                  std::string_view where) {
  return int_value(field(j, key, source, where), lo, hi, source, join(where, key));
}

double nonneg_number(const json& v, std::string_view source, std::string_view what) {
  if (!v.is_number()) fail("{}: {} must be a number, got {}", source, what, v.dump());
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) fail("{}: {} = {} must be finite and >= 0", source, what, d);
  return d;
}

}  // namespace tandem::placement_json
