// Typed access to fields of the placement JSON files (stats, rowmaps). Every accessor names the file
// (`source`) and the field path in its error, so a bad file is rejected with a message that says
// where it is broken. Used only by the placement readers; not a general JSON layer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::placement_json {

// Parses text as JSON; malformed text is an InputError naming `source` and the parser's position.
nlohmann::json parse(std::string_view text, std::string_view source);
// Reads a whole file and parses it; a missing or unreadable file is an InputError.
nlohmann::json parse_file(const std::string& path);
// Readable, diff-friendly text: objects one member a line ("schema" first, then by key), arrays of
// scalars on one line (a layer's expert ids or counts), other arrays one element a line.
std::string dump_readable(const nlohmann::json& j);
// Writes dump_readable(j) to path, failing with an InputError when the file cannot be written.
void write_file(const std::string& path, const nlohmann::json& j);

// j must be an object; returns j[key] or fails ("<source>: missing field <where>.<key>").
const nlohmann::json& field(const nlohmann::json& j, std::string_view key, std::string_view source,
                            std::string_view where);
const nlohmann::json& object_field(const nlohmann::json& j, std::string_view key, std::string_view source,
                                   std::string_view where);
const nlohmann::json& array_field(const nlohmann::json& j, std::string_view key, std::string_view source,
                                  std::string_view where);
std::string string_field(const nlohmann::json& j, std::string_view key, std::string_view source,
                         std::string_view where);
// An integer in [lo, hi]; a float, a string or an out-of-range value fails.
int64_t int_value(const nlohmann::json& v, int64_t lo, int64_t hi, std::string_view source, std::string_view what);
int64_t int_field(const nlohmann::json& j, std::string_view key, int64_t lo, int64_t hi, std::string_view source,
                  std::string_view where);
// A finite number >= 0.
double nonneg_number(const nlohmann::json& v, std::string_view source, std::string_view what);

}  // namespace tandem::placement_json
