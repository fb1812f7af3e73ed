// Normalizers, pre-tokenizers, decoders and post-processors of tokenizer.json (see tokenizer_pipeline.h).
// Each mirrors the `tokenizers` library's behaviour piece by piece (offsets are not tracked: only the
// "starts at byte 0 of the input" bit that Metaspace's prepend_scheme "first" needs).
#include "io/tokenizer_pipeline.h"

#include <algorithm>
#include <cctype>
#include <climits>

#include "core/error.h"

namespace tandem::tok {

using nlohmann::json;
using Ranges = std::vector<std::pair<size_t, size_t>>;

// GPT-2's pre-tokenization regex (ByteLevel with use_regex).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Whitespace pre-tokenizer's \w+|[^\w\s]+ with Oniguruma's Unicode \w spelled out.
constexpr const char* kWordRegex = R"([\p{L}\p{M}\p{Nd}\p{Pc}]+|[^\p{L}\p{M}\p{Nd}\p{Pc}\s]+)";

const json* json_find(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string json_string(const json& j, const char* key, std::string_view where,
                        std::optional<std::string> fallback) {
  const json* v = json_find(j, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    fail("{}: missing string field '{}'", where, key);
  }
  if (!v->is_string()) fail("{}: field '{}' must be a string", where, key);
  return v->get<std::string>();
}

bool json_bool(const json& j, const char* key, std::string_view where, bool fallback) {
  const json* v = json_find(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail("{}: field '{}' must be true or false", where, key);
  return v->get<bool>();
}

int64_t json_int(const json& j, const char* key, std::string_view where, std::optional<int64_t> fallback) {
  const json* v = json_find(j, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    fail("{}: missing integer field '{}'", where, key);
  }
  if (!v->is_number_integer()) fail("{}: field '{}' must be an integer", where, key);
  return v->get<int64_t>();
}

std::string json_type(const json& j, std::string_view what, std::string_view where) {
  if (!j.is_object()) fail("{}: {} must be an object or null", where, what);
  const json* t = json_find(j, "type");
  if (t == nullptr || !t->is_string()) fail("{}: {} has no 'type'", where, what);
  return t->get<std::string>();
}

namespace {

const json& json_array(const json& j, const char* key, std::string_view where) {
  const json* v = json_find(j, key);
  if (v == nullptr || !v->is_array()) fail("{}: missing array field '{}'", where, key);
  return *v;
}

// {"String": s} (a literal) or {"Regex": r}.
Pattern parse_pattern(const json& j, std::string_view where) {
  Pattern p;
  if (j.is_string()) {
    p.literal = j.get<std::string>();
  } else if (const json* s = json_find(j, "String"); s != nullptr && s->is_string()) {
    p.literal = s->get<std::string>();
  } else if (const json* r = json_find(j, "Regex"); r != nullptr && r->is_string()) {
    p.regex = std::make_shared<const Regex>(r->get<std::string>(), where);
  } else {
    fail("{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
  return p;
}

SplitBehavior parse_behavior(const json& j, std::string_view where) {
  std::string b = json_string(j, "behavior", where, "Isolated");
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: unsupported split behavior '{}'", where, b);
}

// prepend_scheme, or the older add_prefix_space flag.
PrependScheme parse_prepend_scheme(const json& j, std::string_view where) {
  if (const json* s = json_find(j, "prepend_scheme")) {
    if (!s->is_string()) fail("{}: field 'prepend_scheme' must be a string", where);
    std::string v = s->get<std::string>();
    if (v == "always") return PrependScheme::kAlways;
    if (v == "first") return PrependScheme::kFirst;
    if (v == "never") return PrependScheme::kNever;
    fail("{}: unsupported Metaspace prepend_scheme '{}'", where, v);
  }
  return json_bool(j, "add_prefix_space", where, true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

std::string one_char(const json& j, const char* key, std::string_view where, std::string fallback) {
  std::string s = json_string(j, key, where, fallback);
  if (s.empty() || !is_valid_utf8(s) || utf8_valid_len(s, 0) != s.size()) {
    fail("{}: field '{}' must be a single character", where, key);
  }
  return s;
}

// Per-character matches of `pred` (the library's char-predicate patterns: every char its own match).
template <class Pred>
Ranges char_matches(std::string_view text, Pred pred) {
  Ranges out;
  for (size_t i = 0; i < text.size();) {
    size_t start = i;
    char32_t c = next_char(text, i);
    if (pred(c)) out.emplace_back(start, i);
  }
  return out;
}

// NormalizedString::split: the matches and the gaps between them cover the text; `behavior` decides
// which are removed or merged with a neighbour; empty results are dropped.
void split_piece(const Piece& p, const Ranges& matches, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out) {
  struct Seg {
    size_t start, end;
    bool match;
  };
  const std::string& t = p.text;
  std::vector<Seg> segs;
  if (t.empty()) {
    segs.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (auto [s, e] : matches) {
      if (prev != s) segs.push_back({prev, s, false});
      segs.push_back({s, e, true});
      prev = e;
    }
    if (prev != t.size()) segs.push_back({prev, t.size(), false});
  }
  if (invert) {
    for (auto& s : segs) s.match = !s.match;
  }
  std::vector<Seg> kept;  // `match` now means "remove"
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto s : segs) kept.push_back({s.start, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      kept = segs;
      break;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (auto s : segs) {
        if (s.match == previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.start, s.end, false});
        }
        previous = s.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (auto s : segs) {
        if (s.match && !previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.start, s.end, false});
        }
        previous = s.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) {
          kept.back().start = it->start;
        } else {
          kept.push_back({it->start, it->end, false});
        }
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& s : kept) {
    if (s.match || s.end == s.start) continue;
    out.push_back({t.substr(s.start, s.end - s.start), p.at_start && s.start == 0});
  }
}

template <class Fn>
void split_each(std::vector<Piece>& pieces, Fn fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces) fn(p, out);
  pieces = std::move(out);
}

}  // namespace

std::optional<Normalizer> parse_normalizer(const json& j, std::string_view where) {
  if (j.is_null()) return std::nullopt;
  std::string type = json_type(j, "normalizer", where);
  Normalizer n;
  if (type == "NFC") {
    n.kind = NormalizerKind::kNfc;
  } else if (type == "NFD") {
    n.kind = NormalizerKind::kNfd;
  } else if (type == "NFKC") {
    n.kind = NormalizerKind::kNfkc;
  } else if (type == "NFKD") {
    n.kind = NormalizerKind::kNfkd;
  } else if (type == "Lowercase") {
    n.kind = NormalizerKind::kLowercase;
  } else if (type == "Prepend") {
    n.kind = NormalizerKind::kPrepend;
    n.content = json_string(j, "prepend", where);
  } else if (type == "Replace") {
    n.kind = NormalizerKind::kReplace;
    const json* pat = json_find(j, "pattern");
    if (pat == nullptr) fail("{}: Replace normalizer has no 'pattern'", where);
    n.pattern = parse_pattern(*pat, where);
    n.content = json_string(j, "content", where);
  } else if (type == "Strip") {
    n.kind = NormalizerKind::kStrip;
    n.strip_left = json_bool(j, "strip_left", where, false);
    n.strip_right = json_bool(j, "strip_right", where, false);
  } else if (type == "Sequence") {
    n.kind = NormalizerKind::kSequence;
    for (const auto& c : json_array(j, "normalizers", where)) {
      if (auto child = parse_normalizer(c, where)) n.children.push_back(std::move(*child));
    }
  } else {
    fail("{}: unsupported normalizer type '{}'", where, type);
  }
  return n;
}

std::string normalize(const Normalizer& n, std::string s) {
  switch (n.kind) {
    case NormalizerKind::kNfc: return unicode_normalize(s, NormalForm::kNfc);
    case NormalizerKind::kNfd: return unicode_normalize(s, NormalForm::kNfd);
    case NormalizerKind::kNfkc: return unicode_normalize(s, NormalForm::kNfkc);
    case NormalizerKind::kNfkd: return unicode_normalize(s, NormalForm::kNfkd);
    case NormalizerKind::kLowercase: return lowercase(s);
    case NormalizerKind::kPrepend: return s.empty() ? s : n.content + s;
    case NormalizerKind::kReplace: return replace_all(s, n.pattern, n.content);
    case NormalizerKind::kStrip: {
      size_t begin = 0, end = s.size();
      while (n.strip_left && begin < end) {
        size_t i = begin;
        if (!is_whitespace(next_char(s, i))) break;
        begin = i;
      }
      while (n.strip_right && end > begin) {
        size_t start = 0;
        if (!is_whitespace(prev_char(s, end, start))) break;
        end = start;
      }
      return s.substr(begin, end - begin);
    }
    case NormalizerKind::kSequence:
      for (const auto& c : n.children) s = normalize(c, std::move(s));
      return s;
  }
  return s;
}

std::optional<PreTokenizer> parse_pre_tokenizer(const json& j, std::string_view where) {
  if (j.is_null()) return std::nullopt;
  std::string type = json_type(j, "pre_tokenizer", where);
  PreTokenizer p;
  if (type == "Split") {
    p.kind = PreTokenizerKind::kSplit;
    const json* pat = json_find(j, "pattern");
    if (pat == nullptr) fail("{}: Split pre_tokenizer has no 'pattern'", where);
    p.pattern = parse_pattern(*pat, where);
    p.behavior = parse_behavior(j, where);
    p.invert = json_bool(j, "invert", where, false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizerKind::kByteLevel;
    p.add_prefix_space = json_bool(j, "add_prefix_space", where, true);
    if (json_bool(j, "use_regex", where, true)) p.pattern.regex = std::make_shared<const Regex>(kGpt2Regex, where);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizerKind::kMetaspace;
    p.replacement = one_char(j, "replacement", where, "\xE2\x96\x81");
    p.prepend_scheme = parse_prepend_scheme(j, where);
    p.split = json_bool(j, "split", where, true);
  } else if (type == "Digits") {
    p.kind = PreTokenizerKind::kDigits;
    p.individual_digits = json_bool(j, "individual_digits", where, false);
  } else if (type == "Whitespace") {
    p.kind = PreTokenizerKind::kWhitespace;
    p.pattern.regex = std::make_shared<const Regex>(kWordRegex, where);
  } else if (type == "WhitespaceSplit") {
    p.kind = PreTokenizerKind::kWhitespaceSplit;
  } else if (type == "Punctuation") {
    p.kind = PreTokenizerKind::kPunctuation;
    p.behavior = parse_behavior(j, where);
  } else if (type == "BertPreTokenizer") {
    p.kind = PreTokenizerKind::kBert;
  } else if (type == "Sequence") {
    p.kind = PreTokenizerKind::kSequence;
    for (const auto& c : json_array(j, "pretokenizers", where)) {
      if (auto child = parse_pre_tokenizer(c, where)) p.children.push_back(std::move(*child));
    }
  } else {
    fail("{}: unsupported pre_tokenizer type '{}'", where, type);
  }
  return p;
}

void pre_tokenize(const PreTokenizer& p, std::vector<Piece>& pieces) {
  switch (p.kind) {
    case PreTokenizerKind::kSplit:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, p.pattern.find_all(x.text), p.behavior, p.invert, out);
      });
      return;
    case PreTokenizerKind::kByteLevel:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        bool prefix = p.add_prefix_space && (x.text.empty() || x.text[0] != ' ');
        Piece y{prefix ? " " + x.text : x.text, x.at_start};
        size_t first = out.size();
        if (p.pattern.regex) {
          split_piece(y, p.pattern.find_all(y.text), SplitBehavior::kIsolated, false, out);
        } else if (!y.text.empty()) {
          out.push_back(std::move(y));
        }
        for (size_t i = first; i < out.size(); ++i) out[i].text = byte_level_encode(out[i].text);
      });
      return;
    case PreTokenizerKind::kMetaspace:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        Piece y{replace_all(x.text, Pattern{" ", nullptr}, p.replacement), x.at_start};
        bool starts = y.text.compare(0, p.replacement.size(), p.replacement) == 0;
        bool prepend = p.prepend_scheme == PrependScheme::kAlways ||
                       (p.prepend_scheme == PrependScheme::kFirst && x.at_start);
        if (prepend && !starts) y.text.insert(0, p.replacement);
        if (p.split) {
          split_piece(y, Pattern{p.replacement, nullptr}.find_all(y.text), SplitBehavior::kMergedWithNext, false,
                      out);
        } else if (!y.text.empty()) {
          out.push_back(std::move(y));
        }
      });
      return;
    case PreTokenizerKind::kDigits:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, char_matches(x.text, is_numeric),
                    p.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, out);
      });
      return;
    case PreTokenizerKind::kWhitespace:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, p.pattern.find_all(x.text), SplitBehavior::kRemoved, true, out);
      });
      return;
    case PreTokenizerKind::kWhitespaceSplit:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, char_matches(x.text, is_whitespace), SplitBehavior::kRemoved, false, out);
      });
      return;
    case PreTokenizerKind::kPunctuation:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, char_matches(x.text, is_punctuation), p.behavior, false, out);
      });
      return;
    case PreTokenizerKind::kBert:
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, char_matches(x.text, is_whitespace), SplitBehavior::kRemoved, false, out);
      });
      split_each(pieces, [&](const Piece& x, std::vector<Piece>& out) {
        split_piece(x, char_matches(x.text, is_punctuation), SplitBehavior::kIsolated, false, out);
      });
      return;
    case PreTokenizerKind::kSequence:
      for (const auto& c : p.children) pre_tokenize(c, pieces);
      return;
  }
}

std::optional<Decoder> parse_decoder(const json& j, std::string_view where) {
  if (j.is_null()) return std::nullopt;
  std::string type = json_type(j, "decoder", where);
  Decoder d;
  if (type == "ByteLevel") {
    d.kind = DecoderKind::kByteLevel;
  } else if (type == "Replace") {
    d.kind = DecoderKind::kReplace;
    const json* pat = json_find(j, "pattern");
    if (pat == nullptr) fail("{}: Replace decoder has no 'pattern'", where);
    d.pattern = parse_pattern(*pat, where);
    d.content = json_string(j, "content", where);
  } else if (type == "ByteFallback") {
    d.kind = DecoderKind::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = DecoderKind::kFuse;
  } else if (type == "Strip") {
    d.kind = DecoderKind::kStrip;
    d.content = one_char(j, "content", where, " ");
    d.start = json_int(j, "start", where, 0);
    d.stop = json_int(j, "stop", where, 0);
    if (d.start < 0 || d.stop < 0) fail("{}: Strip decoder start/stop must be >= 0", where);
  } else if (type == "Metaspace") {
    d.kind = DecoderKind::kMetaspace;
    d.content = one_char(j, "replacement", where, "\xE2\x96\x81");
    d.prepend = parse_prepend_scheme(j, where) != PrependScheme::kNever;
  } else if (type == "BPEDecoder") {
    d.kind = DecoderKind::kBpeSuffix;
    d.content = json_string(j, "suffix", where, "</w>");
  } else if (type == "Sequence") {
    d.kind = DecoderKind::kSequence;
    for (const auto& c : json_array(j, "decoders", where)) {
      if (auto child = parse_decoder(c, where)) d.children.push_back(std::move(*child));
    }
  } else {
    fail("{}: unsupported decoder type '{}'", where, type);
  }
  return d;
}

std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> tokens) {
  switch (d.kind) {
    case DecoderKind::kByteLevel: {
      std::string bytes;
      for (const auto& t : tokens) {
        std::string raw;
        bool all_bytes = true;
        for (size_t i = 0; i < t.size() && all_bytes;) {
          int b = char_to_byte(next_char(t, i));
          if (b < 0) all_bytes = false;
          raw += static_cast<char>(b);
        }
        bytes += all_bytes ? raw : t;
      }
      return {utf8_lossy(bytes)};
    }
    case DecoderKind::kReplace:
      for (auto& t : tokens) t = replace_all(t, d.pattern, d.content);
      return tokens;
    case DecoderKind::kByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (is_valid_utf8(pending)) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (auto& t : tokens) {
        auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4])) {
          pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case DecoderKind::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      return {all};
    }
    case DecoderKind::kStrip:
      for (auto& t : tokens) {
        std::vector<std::pair<size_t, size_t>> chars;  // byte range of each character
        for (size_t i = 0; i < t.size();) {
          size_t s = i;
          next_char(t, i);
          chars.emplace_back(s, i);
        }
        auto is_content = [&](size_t k) { return t.compare(chars[k].first, chars[k].second - chars[k].first, d.content) == 0; };
        size_t begin = 0, end = chars.size();
        while (begin < end && begin < static_cast<size_t>(d.start) && is_content(begin)) ++begin;
        size_t stripped = 0;
        while (end > begin && stripped < static_cast<size_t>(d.stop) && is_content(end - 1)) {
          --end;
          ++stripped;
        }
        t = begin == end ? std::string() : t.substr(chars[begin].first, chars[end - 1].second - chars[begin].first);
      }
      return tokens;
    case DecoderKind::kMetaspace:
      for (size_t k = 0; k < tokens.size(); ++k) {
        tokens[k] = replace_all(tokens[k], Pattern{d.content, nullptr}, k == 0 && d.prepend ? "" : " ");
      }
      return tokens;
    case DecoderKind::kBpeSuffix:
      for (size_t k = 0; k < tokens.size(); ++k) {
        tokens[k] = replace_all(tokens[k], Pattern{d.content, nullptr}, k + 1 == tokens.size() ? "" : " ");
      }
      return tokens;
    case DecoderKind::kSequence:
      for (const auto& c : d.children) tokens = decode_chain(c, std::move(tokens));
      return tokens;
  }
  return tokens;
}

std::optional<PostProcessor> parse_post_processor(const json& j, std::string_view where) {
  if (j.is_null()) return std::nullopt;
  std::string type = json_type(j, "post_processor", where);
  PostProcessor p;
  if (type == "ByteLevel") return p;
  if (type == "TemplateProcessing") {
    const json* specials = json_find(j, "special_tokens");
    std::vector<PostItem> items;
    for (const auto& item : json_array(j, "single", where)) {
      if (json_find(item, "Sequence") != nullptr) {
        items.push_back({true, {}});
        continue;
      }
      const json* st = json_find(item, "SpecialToken");
      if (st == nullptr) fail("{}: TemplateProcessing item must be Sequence or SpecialToken", where);
      std::string name = json_string(*st, "id", where);
      const json* entry = specials != nullptr ? json_find(*specials, name.c_str()) : nullptr;
      if (entry == nullptr) fail("{}: TemplateProcessing special token '{}' is not in special_tokens", where, name);
      PostItem pi;
      for (const auto& id : json_array(*entry, "ids", where)) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          fail("{}: TemplateProcessing special token '{}' has a bad id", where, name);
        }
        pi.ids.push_back(id.get<int32_t>());
      }
      items.push_back(std::move(pi));
    }
    p.stages.push_back(std::move(items));
    return p;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) {
      const json* v = json_find(j, key);
      if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
        fail("{}: {} field '{}' must be [token, id]", where, type, key);
      }
      return (*v)[1].get<int32_t>();
    };
    p.stages.push_back({{false, {id_of("cls")}}, {true, {}}, {false, {id_of("sep")}}});
    return p;
  }
  if (type == "Sequence") {
    for (const auto& c : json_array(j, "processors", where)) {
      if (auto child = parse_post_processor(c, where)) {
        for (auto& s : child->stages) p.stages.push_back(std::move(s));
      }
    }
    return p;
  }
  fail("{}: unsupported post_processor type '{}'", where, type);
}

std::vector<int32_t> post_process(const PostProcessor& p, std::vector<int32_t> ids) {
  for (const auto& stage : p.stages) {
    std::vector<int32_t> out;
    for (const auto& item : stage) {
      if (item.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    ids = std::move(out);
  }
  return ids;
}

}  // namespace tandem::tok
