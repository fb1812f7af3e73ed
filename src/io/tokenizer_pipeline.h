// The configurable stages of a tokenizer.json around its model: normalizer, pre-tokenizer, decoder and
// post-processor, parsed from JSON into plain structs and applied as the `tokenizers` library does.
// Parsing rejects any type or option it cannot reproduce (InputError "<file>: unsupported ...").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer_text.h"

namespace tandem::tok {

// JSON access for tokenizer.json; every failure is an InputError naming `where` and the field.
const nlohmann::json* json_find(const nlohmann::json& j, const char* key);  // null when absent or null
std::string json_string(const nlohmann::json& j, const char* key, std::string_view where,
                        std::optional<std::string> fallback = std::nullopt);
bool json_bool(const nlohmann::json& j, const char* key, std::string_view where, bool fallback);
int64_t json_int(const nlohmann::json& j, const char* key, std::string_view where,
                 std::optional<int64_t> fallback = std::nullopt);
// The "type" of a component object (`what` names the component: "normalizer", ...).
std::string json_type(const nlohmann::json& j, std::string_view what, std::string_view where);

enum class NormalizerKind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip, kSequence };
struct Normalizer {
  NormalizerKind kind = NormalizerKind::kSequence;
  std::string content;                           // kPrepend: the prefix; kReplace: the replacement
  Pattern pattern;                               // kReplace
  bool strip_left = false, strip_right = false;  // kStrip
  std::vector<Normalizer> children;              // kSequence
};
// A JSON null → nullopt.
std::optional<Normalizer> parse_normalizer(const nlohmann::json& j, std::string_view where);
std::string normalize(const Normalizer& n, std::string s);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };
enum class PreTokenizerKind {
  kSplit, kByteLevel, kMetaspace, kDigits, kWhitespace, kWhitespaceSplit, kPunctuation, kBert, kSequence
};
struct PreTokenizer {
  PreTokenizerKind kind = PreTokenizerKind::kSequence;
  Pattern pattern;  // kSplit; kByteLevel / kWhitespace: the built-in regex (null when use_regex is off)
  SplitBehavior behavior = SplitBehavior::kIsolated;  // kSplit, kPunctuation
  bool invert = false;                                // kSplit
  bool add_prefix_space = false;                      // kByteLevel
  std::string replacement;                            // kMetaspace (one character)
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;               // kMetaspace
  bool individual_digits = false;  // kDigits
  std::vector<PreTokenizer> children;
};
// A piece of text on its way to the model; at_start: it begins at byte 0 of the original text
// (Metaspace's prepend_scheme "first" looks at it).
struct Piece {
  std::string text;
  bool at_start = false;
};
std::optional<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, std::string_view where);
// Splits / rewrites `pieces` in place; empty pieces are dropped.
void pre_tokenize(const PreTokenizer& p, std::vector<Piece>& pieces);

enum class DecoderKind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace, kBpeSuffix, kSequence };
struct Decoder {
  DecoderKind kind = DecoderKind::kSequence;
  Pattern pattern;      // kReplace
  std::string content;  // kReplace: replacement; kStrip: the stripped character; kMetaspace: replacement;
                        // kBpeSuffix: the suffix
  int64_t start = 0, stop = 0;  // kStrip
  bool prepend = true;          // kMetaspace: prepend_scheme != never
  std::vector<Decoder> children;
};
std::optional<Decoder> parse_decoder(const nlohmann::json& j, std::string_view where);
std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> tokens);

// Single-sequence post-processing: the ids to put around the encoded sequence.
struct PostItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;  // !is_sequence: special-token ids to insert
};
struct PostProcessor {
  std::vector<std::vector<PostItem>> stages;  // applied in order; an empty template leaves ids alone
};
std::optional<PostProcessor> parse_post_processor(const nlohmann::json& j, std::string_view where);
std::vector<int32_t> post_process(const PostProcessor& p, std::vector<int32_t> ids);

}  // namespace tandem::tok
