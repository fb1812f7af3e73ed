// Tokenizer tests: the reference encodings of tests/fixtures/tokenizer (and of ../shared's set when it is
// there; ids and decoded text
// exactly), both merges spellings, added tokens, each supported component on small hand-built files,
// bad files, the byte-level builder and BPE trainer, and the `tandem tokenize` command.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <thread>

#include "core/error.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string fixture_dir() { return test::tokenizer_dir(); }

const json& fixture_json() {
  static const json j = json::parse(test::read_file(fixture_dir() + "/tokenizer.json"));
  return j;
}
const Tokenizer& fixture() {
  static const Tokenizer t = Tokenizer::load(fixture_dir() + "/tokenizer.json");
  return t;
}
const json& cases() {
  static const json j = json::parse(test::read_file(fixture_dir() + "/encodings.json"));
  return j.at("cases");
}

// The fixture's vocabulary size as the file states it: model entries plus added tokens outside them.
int fixture_vocab() {
  const json& j = fixture_json();
  int n = int(j.at("model").at("vocab").size());
  for (const auto& a : j.at("added_tokens"))
    if (a.at("id").get<int>() >= n) ++n;
  return n;
}

std::string ids_str(const std::vector<int32_t>& ids) { return json(ids).dump(); }

// Every case: ids and the decoded text reproduce exactly; failures are listed one by one.
void expect_all_cases(const Tokenizer& tk, const json& all) {
  int failed = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const json& c = all[i];
    auto text = c.at("text").get<std::string>();
    auto want = c.at("ids").get<std::vector<int32_t>>();
    auto got = tk.encode(text);
    if (got != want) {
      ++failed;
      ADD_FAILURE() << "case " << i << " ids differ for " << json(text).dump() << "\n want " << ids_str(want)
                    << "\n got  " << ids_str(got);
    }
    auto decoded = tk.decode(want);
    if (decoded != c.at("decoded").get<std::string>()) {
      ++failed;
      ADD_FAILURE() << "case " << i << " decode differs: want " << c.at("decoded").dump() << " got "
                    << json(decoded).dump();
    }
  }
  EXPECT_EQ(failed, 0);
}

TEST(TokenizerFixture, AllCasesReproduce) {
  ASSERT_GE(cases().size(), 100u);
  expect_all_cases(fixture(), cases());
}

// The extra set beside the checkout (a 16,384-entry tokenizer trained on the shared corpus), when present.
TEST(TokenizerFixture, SharedSetReproduces) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "no ../shared beside the checkout: the extra fixture set is not there";
  const std::string dir = test::shared_dir() + "/fixtures/tokenizer";
  const Tokenizer tk = Tokenizer::load(dir + "/tokenizer.json");
  EXPECT_EQ(tk.vocab_size(), 16384);
  const json all = json::parse(test::read_file(dir + "/encodings.json")).at("cases");
  ASSERT_EQ(all.size(), 140u);
  expect_all_cases(tk, all);
}

TEST(TokenizerFixture, Basics) {
  const Tokenizer& tk = fixture();
  const int vocab = fixture_vocab();
  ASSERT_GT(vocab, 259);  // 256 bytes, 3 specials and some merges
  EXPECT_EQ(tk.vocab_size(), vocab);
  EXPECT_EQ(tk.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(tk.id_to_token(2), "<|im_end|>");
  EXPECT_TRUE(tk.is_special(0));
  EXPECT_FALSE(tk.is_special(100));
  EXPECT_FALSE(tk.token_to_id("no such token at all").has_value());
  EXPECT_TRUE(tk.encode("").empty());
  EXPECT_EQ(tk.decode(std::vector<int32_t>{}), "");
  EXPECT_THROW(tk.id_to_token(vocab), InputError);
}

TEST(TokenizerFixture, SpecialTokensInsideText) {
  const Tokenizer& tk = fixture();
  auto ids = tk.encode("<|im_start|>user\nhi<|im_end|><|endoftext|>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids[ids.size() - 2], 2);
  EXPECT_EQ(ids.back(), 0);
  EXPECT_EQ(tk.decode(ids), "<|im_start|>user\nhi<|im_end|><|endoftext|>");
  EXPECT_EQ(tk.decode(ids, /*skip_special=*/true), "user\nhi");
  // The text between special tokens encodes as it would alone.
  auto alone = tk.encode("user\nhi");
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end() - 2), alone);
  // A broken special token is plain text.
  auto broken = tk.encode("<|im_start|");
  EXPECT_EQ(std::count(broken.begin(), broken.end(), 1), 0);
}

TEST(TokenizerFixture, DecodeRejectsUnknownIds) {
  const Tokenizer& tk = fixture();
  std::vector<int32_t> bad{5, fixture_vocab()};
  EXPECT_THROW(tk.decode(bad), InputError);
  std::vector<int32_t> negative{-1};
  EXPECT_THROW(tk.decode(negative), InputError);
}

TEST(TokenizerFixture, InvalidUtf8IsAnInputError) {
  const Tokenizer& tk = fixture();
  for (std::string bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xe2\x82"),
                          std::string("\xed\xa0\x80"), std::string("x\xc0\xafy")}) {
    try {
      tk.encode(bad);
      ADD_FAILURE() << "accepted " << json::binary_t(std::vector<uint8_t>(bad.begin(), bad.end())).size();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    }
  }
}

TEST(TokenizerFixture, MergesAsStringsEncodeIdentically) {
  json j = fixture_json();
  auto& merges = j["model"]["merges"];
  ASSERT_TRUE(merges[0].is_array());
  for (auto& m : merges) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  Tokenizer strings = Tokenizer::from_json(j, "strings-form");
  for (size_t i = 0; i < cases().size(); i += 3) {
    auto text = cases()[i].at("text").get<std::string>();
    EXPECT_EQ(strings.encode(text), fixture().encode(text)) << "case " << i;
  }
}

TEST(TokenizerFixture, ConcurrentEncodeIsConsistent) {
  const Tokenizer& tk = fixture();
  std::vector<std::vector<int32_t>> want;
  for (const auto& c : cases()) want.push_back(c.at("ids").get<std::vector<int32_t>>());
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < cases().size(); i += 2) {
        if (tk.encode(cases()[i].at("text").get<std::string>()) != want[i]) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}


// ---- Small hand-built files: one component at a time. ----

// A tokenizer.json around a BPE model with `vocab` (token → id) and `merges`.
json tiny(json vocab, json merges = json::array(), json extra = json::object()) {
  json j = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", nullptr},
            {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.key() == "model_options") {
      for (auto m = it->begin(); m != it->end(); ++m) j["model"][m.key()] = m.value();
    } else {
      j[it.key()] = it.value();
    }
  }
  return j;
}

std::vector<std::string> pieces_with(json pre_tokenizer, const std::string& text, json added = json::array()) {
  json j = tiny(json::object(), json::array(), {{"pre_tokenizer", std::move(pre_tokenizer)}, {"added_tokens", added}});
  return Tokenizer::from_json(j, "test").pre_tokenize(text);
}
std::string normalized_with(json normalizer, const std::string& text) {
  auto p = Tokenizer::from_json(tiny(json::object(), json::array(), {{"normalizer", std::move(normalizer)}}), "test")
               .pre_tokenize(text);
  return p.empty() ? std::string() : p.at(0);
}
using Pieces = std::vector<std::string>;

TEST(TokenizerPreTokenizers, SplitBehaviours) {
  auto split = [](const char* behavior) {
    return pieces_with({{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}}, "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (Pieces{"the", "-", "final", "--", "countdown"}));
  json inverted = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pieces_with(inverted, "ab12cd"), (Pieces{"ab", "cd"}));
  json regex = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(pieces_with(regex, "x١2y"), (Pieces{"x", "١", "2", "y"}));
}

TEST(TokenizerPreTokenizers, WhitespaceDigitsPunctuationBert) {
  EXPECT_EQ(pieces_with({{"type", "Whitespace"}}, "Hey friend!  How are you?!?"),
            (Pieces{"Hey", "friend", "!", "How", "are", "you", "?!?"}));
  EXPECT_EQ(pieces_with({{"type", "WhitespaceSplit"}}, "Hey friend!\u00a0 x"), (Pieces{"Hey", "friend!", "x"}));
  EXPECT_EQ(pieces_with({{"type", "Digits"}, {"individual_digits", true}}, "Call 123 please"),
            (Pieces{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pieces_with({{"type", "Digits"}, {"individual_digits", false}}, "Call 123 please"),
            (Pieces{"Call ", "123", " please"}));
  EXPECT_EQ(pieces_with({{"type", "Punctuation"}}, "Hey friend, what's up?"),
            (Pieces{"Hey friend", ",", " what", "'", "s up", "?"}));
  EXPECT_EQ(pieces_with({{"type", "BertPreTokenizer"}}, "Hey friend!  How"), (Pieces{"Hey", "friend", "!", "How"}));
  json seq = {{"type", "Sequence"},
              {"pretokenizers", {{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}}}};
  EXPECT_EQ(pieces_with(seq, "ab12 c"), (Pieces{"ab", "1", "2", "c"}));
}

TEST(TokenizerPreTokenizers, ByteLevel) {
  json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(pieces_with(gpt2, "Hello   world"), (Pieces{"ĠHello", "ĠĠ", "Ġworld"}));
  EXPECT_EQ(pieces_with(gpt2, "it's 42"), (Pieces{"Ġit", "'s", "Ġ42"}));
  json plain = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(pieces_with(plain, "a b\n"), (Pieces{"aĠbĊ"}));
}

TEST(TokenizerPreTokenizers, Metaspace) {
  json always = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pieces_with(always, "Hey friend!"), (Pieces{"▁Hey", "▁friend!"}));
  EXPECT_EQ(pieces_with(always, "Hey   friend!"), (Pieces{"▁Hey", "▁", "▁", "▁friend!"}));
  json legacy = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  EXPECT_EQ(pieces_with(legacy, "Hey friend"), (Pieces{"Hey", "▁friend"}));
  // "first": only the piece at the very start of the input gets the prefix.
  json first = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
  json s_token = {{{"id", 0}, {"content", "<s>"}, {"special", true}, {"normalized", false}}};
  EXPECT_EQ(pieces_with(first, "Hey my <s>how are", s_token), (Pieces{"▁Hey▁my▁", "how▁are"}));
  EXPECT_EQ(pieces_with(first, "<s>how", s_token), (Pieces{"how"}));
}

TEST(TokenizerNormalizers, EachType) {
  EXPECT_EQ(normalized_with({{"type", "NFD"}}, "\u00e9"), "e\u0301");
  EXPECT_EQ(normalized_with({{"type", "NFC"}}, "e\u0301"), "\u00e9");
  EXPECT_EQ(normalized_with({{"type", "NFKC"}}, "\ufb01x"), "fix");
  EXPECT_EQ(normalized_with({{"type", "NFKD"}}, "\u2460\u00e9"), "1e\u0301");
  EXPECT_EQ(normalized_with({{"type", "Lowercase"}}, "HeLLo \u0130\u03a3"), "hello i\u0307\u03c3");
  EXPECT_EQ(normalized_with({{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}}, "a   b c"), "a_b_c");
  EXPECT_EQ(normalized_with({{"type", "Replace"}, {"pattern", {{"String", "."}}}, {"content", "!"}}, "a.b"), "a!b");
  EXPECT_EQ(normalized_with({{"type", "Prepend"}, {"prepend", "▁"}}, "x"), "▁x");
  EXPECT_EQ(normalized_with({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \t x y \n"), "x y");
  json seq = {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", "▁"}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  EXPECT_EQ(normalized_with(seq, "a b"), "▁a▁b");
}

// Mixtral's layout: Prepend + Replace normalizer, BPE with byte_fallback, a decoder sequence.
json mixtral_like(bool byte_fallback, bool fuse_unk) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int next = 259;
  for (const char* t : {"▁", "h", "e", "l", "o", "w", "▁h", "▁he", "ll", "llo", "▁hello"}) vocab[t] = next++;
  json merges = {"▁ h", "▁h e", "l l", "ll o", "▁he llo"};
  json normalizer = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "▁"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  json decoder = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  json added = {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}};
  json post = {{"type", "TemplateProcessing"},
               {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  return tiny(vocab, merges,
              {{"normalizer", normalizer},
               {"decoder", decoder},
               {"added_tokens", added},
               {"post_processor", post},
               {"model_options", {{"unk_token", "<unk>"}, {"byte_fallback", byte_fallback}, {"fuse_unk", fuse_unk}}}});
}

TEST(TokenizerModels, MetaspaceBpeWithByteFallback) {
  Tokenizer tk = Tokenizer::from_json(mixtral_like(true, true), "mixtral-like");
  int hello = *tk.token_to_id("▁hello"), space = *tk.token_to_id("▁"), w = *tk.token_to_id("w");
  // "é" has no token: its UTF-8 bytes C3 A9 fall back to <0xC3> <0xA9>.
  std::vector<int32_t> want{hello, space, w, 3 + 0xC3, 3 + 0xA9};
  EXPECT_EQ(tk.encode("hello wé"), want);
  EXPECT_EQ(tk.decode(want), "hello wé");
  EXPECT_EQ(tk.encode_with_special("hello"), (std::vector<int32_t>{1, hello}));
  // Pieces after an added token are normalised on their own (Prepend applies to each).
  EXPECT_EQ(tk.encode("<s>hello"), (std::vector<int32_t>{1, hello}));
  // Bytes that are not valid UTF-8 decode to one U+FFFD each.
  EXPECT_EQ(tk.decode(std::vector<int32_t>{hello, 3 + 0xE2, 3 + 0x82}), "hello\uFFFD\uFFFD");
  EXPECT_EQ(tk.decode(std::vector<int32_t>{1, hello, 2}, true), "hello");
}

TEST(TokenizerModels, UnknownCharactersAndFuseUnk) {
  Tokenizer fused = Tokenizer::from_json(mixtral_like(false, true), "fused");
  Tokenizer separate = Tokenizer::from_json(mixtral_like(false, false), "separate");
  int hello = *fused.token_to_id("▁hello");
  EXPECT_EQ(fused.encode("hello zz"), (std::vector<int32_t>{hello, *fused.token_to_id("▁"), 0}));
  EXPECT_EQ(separate.encode("hello zz"), (std::vector<int32_t>{hello, *fused.token_to_id("▁"), 0, 0}));
}

TEST(TokenizerModels, BpeOptions) {
  json base = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  Tokenizer normal = Tokenizer::from_json(tiny(base, {"a b"}), "t");
  Tokenizer ignore = Tokenizer::from_json(tiny(base, {"a b"}, {{"model_options", {{"ignore_merges", true}}}}), "t");
  EXPECT_EQ(normal.encode("abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(ignore.encode("abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(ignore.encode("cab"), (std::vector<int32_t>{2, 3}));

  json prefixed = {{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}};
  Tokenizer pre = Tokenizer::from_json(tiny(prefixed, {"a ##b"}, {{"model_options", {{"continuing_subword_prefix", "##"}}}}), "t");
  EXPECT_EQ(pre.encode("abc"), (std::vector<int32_t>{3, 2}));

  json suffixed = {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"b", 3}};
  Tokenizer suf = Tokenizer::from_json(tiny(suffixed, {"a b</w>"}, {{"model_options", {{"end_of_word_suffix", "</w>"}}}}), "t");
  EXPECT_EQ(suf.encode("ab"), (std::vector<int32_t>{2}));
  EXPECT_EQ(suf.encode("ba"), (std::vector<int32_t>{3}));  // "a</w>" has no token and there is no unk

  // Merge order follows rank, not position: "b c" (rank 0) wins over "a b" in "abc".
  json ranked = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}};
  Tokenizer rank = Tokenizer::from_json(tiny(ranked, {"b c", "a b"}), "t");
  EXPECT_EQ(rank.encode("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(rank.encode("abab"), (std::vector<int32_t>{3, 3}));
}

TEST(TokenizerDecoders, EachType) {
  json vocab = {{"▁Hey", 0}, {"▁friend!", 1}, {"xxaxx", 2}, {"hel", 3}, {"lo</w>", 4}, {"wor", 5}, {"ld</w>", 6}};
  auto decode_with = [&](json decoder, std::vector<int32_t> ids) {
    return Tokenizer::from_json(tiny(vocab, json::array(), {{"decoder", decoder}}), "t").decode(ids);
  };
  EXPECT_EQ(decode_with({{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}}, {0, 1}), "Hey friend!");
  EXPECT_EQ(decode_with({{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "never"}}, {0, 1}), " Hey friend!");
  EXPECT_EQ(decode_with({{"type", "Strip"}, {"content", "x"}, {"start", 1}, {"stop", 1}}, {2}), "xax");
  EXPECT_EQ(decode_with({{"type", "BPEDecoder"}, {"suffix", "</w>"}}, {3, 4, 5, 6}), "hello world");
  EXPECT_EQ(decode_with(nullptr, {3, 5}), "hel wor");  // no decoder: tokens joined by spaces
  EXPECT_EQ(decode_with({{"type", "ByteLevel"}}, {3, 0}), "hel\u2581Hey");  // not byte symbols: kept as is
}

TEST(TokenizerAddedTokens, StripSingleWordNormalizedLongest) {
  json j = make_byte_level_tokenizer({});
  j["normalizer"] = {{"type", "Lowercase"}};
  auto add = [&](int id, const char* content, json flags) {
    json t = {{"id", id}, {"content", content}, {"special", false}, {"normalized", false},
              {"lstrip", false}, {"rstrip", false}, {"single_word", false}};
    for (auto it = flags.begin(); it != flags.end(); ++it) t[it.key()] = it.value();
    j["added_tokens"].push_back(t);
  };
  add(300, "<l>", json::object({{"lstrip", true}, {"special", true}}));
  add(301, "<r>", json::object({{"rstrip", true}, {"special", true}}));
  add(302, "hi", json::object({{"single_word", true}}));
  add(303, "yes", json::object({{"normalized", true}}));
  add(304, "<a>", json::object());
  add(305, "<a><b>", {});
  Tokenizer tk = Tokenizer::from_json(j, "added");
  auto bytes = [](std::string s) { return std::vector<int32_t>(s.begin(), s.end()); };
  EXPECT_EQ(tk.encode("a <l> b"), (std::vector<int32_t>{'a', 300, ' ', 'b'}));
  EXPECT_EQ(tk.encode("a <r> b"), (std::vector<int32_t>{'a', ' ', 301, 'b'}));
  EXPECT_EQ(tk.encode("hi there"), (std::vector<int32_t>{302, ' ', 't', 'h', 'e', 'r', 'e'}));
  EXPECT_EQ(tk.encode("this"), bytes("this"));
  EXPECT_EQ(tk.encode("YES!"), (std::vector<int32_t>{303, '!'}));  // matched after lowercasing
  EXPECT_EQ(tk.encode("<a><b><a>"), (std::vector<int32_t>{305, 304}));
  EXPECT_EQ(tk.decode(std::vector<int32_t>{'a', 300, 305}), "a<l><a><b>");
  EXPECT_EQ(tk.decode(std::vector<int32_t>{'a', 300, 305}, true), "a<a><b>");
}

// ---- Bad files. ----

void expect_input_error(const json& j, const std::string& needle) {
  try {
    Tokenizer::from_json(j, "bad.json");
    ADD_FAILURE() << "accepted a file that should fail with '" << needle << "'";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(TokenizerBadInput, RejectedWithClearErrors) {
  json ok = tiny({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"});
  EXPECT_NO_THROW(Tokenizer::from_json(ok, "ok"));
  expect_input_error(json::array(), "JSON object");
  json no_model = ok;
  no_model.erase("model");
  expect_input_error(no_model, "model");
  json unigram = ok;
  unigram["model"]["type"] = "Unigram";
  expect_input_error(unigram, "unsupported model type 'Unigram'");
  json pre = ok;
  pre["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_input_error(pre, "unsupported pre_tokenizer type 'UnicodeScripts'");
  json norm = ok;
  norm["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  expect_input_error(norm, "unsupported normalizer type 'Precompiled'");
  json dec = ok;
  dec["decoder"] = {{"type", "CTC"}};
  expect_input_error(dec, "unsupported decoder type 'CTC'");
  json post = ok;
  post["post_processor"] = {{"type", "Mystery"}};
  expect_input_error(post, "unsupported post_processor type 'Mystery'");
  expect_input_error(tiny({{"a", 0}, {"b", 1}}, {"a x"}), "'x', which is not in the vocab");
  expect_input_error(tiny({{"a", 0}, {"b", 1}}, {"a b"}), "'ab', which is not in the vocab");
  expect_input_error(tiny({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b c"}), "merges[0]");
  expect_input_error(tiny({{"a", 0}, {"b", 1}, {"ab", 2}}, {json::array({"a"})}), "merges[0]");
  expect_input_error(tiny({{"a", -1}}), "outside");
  expect_input_error(tiny({{"a", "zero"}}), "not an integer id");
  expect_input_error(tiny({{"a", 0}}, json::array(), {{"model_options", {{"unk_token", "<unk>"}}}}), "unk_token");
  json regex = ok;
  regex["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_input_error(regex, "invalid regex");
  json behavior = regex;
  behavior["pre_tokenizer"]["pattern"] = {{"Regex", "a"}};
  behavior["pre_tokenizer"]["behavior"] = "Sideways";
  expect_input_error(behavior, "Sideways");
  json added = ok;
  added["added_tokens"] = {{{"content", 5}, {"id", 3}}};
  expect_input_error(added, "content");
  json typed = ok;
  typed["normalizer"] = {{"type", 7}};
  expect_input_error(typed, "normalizer");
}

TEST(TokenizerBadInput, Files) {
  test::TempDir dir;
  test::write_file(dir.file("broken.json"), "{\"model\": ");
  try {
    Tokenizer::load(dir.file("broken.json"));
    ADD_FAILURE() << "malformed JSON accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load(dir.file("missing.json")), InputError);
  EXPECT_THROW(Tokenizer::load(dir.path), InputError);  // a folder without tokenizer.json
  test::write_file(dir.file("tokenizer.json"), make_byte_level_tokenizer({"<s>"}).dump());
  EXPECT_EQ(Tokenizer::load(dir.path).vocab_size(), 257);
}

// ---- Builders. ----

TEST(TokenizerBuilders, ByteLevelVocabRoundTrips) {
  std::vector<std::string> specials{"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  Tokenizer tk = Tokenizer::from_json(make_byte_level_tokenizer(specials), "bytes");
  EXPECT_EQ(tk.vocab_size(), 3 + 256);
  EXPECT_EQ(tk.token_to_id("<|im_end|>"), 2);
  EXPECT_EQ(tk.token_to_id("Ġ"), 3 + ' ');
  std::mt19937 rng(7);
  const std::vector<std::string> pieces{"a", "Z", " ", "  ", "\n", "\r\n", "\t", "7", "!", "é", "中文", "\U0001F600",
                                        "\u200d", "'s", "\x01", "\x7f", "<|im_start|>"};
  for (int round = 0; round < 200; ++round) {
    std::string text;
    for (int k = std::uniform_int_distribution<int>(0, 12)(rng); k > 0; --k) {
      text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    }
    auto ids = tk.encode(text);
    EXPECT_EQ(tk.decode(ids), text);
    // Without merges every byte outside special tokens is its own id.
    std::vector<int32_t> want;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 12, "<|im_start|>") == 0) {
        want.push_back(1);
        i += 12;
      } else {
        want.push_back(3 + static_cast<uint8_t>(text[i++]));
      }
    }
    EXPECT_EQ(ids, want) << text;
  }
  // Any byte sequence is a list of ids; invalid UTF-8 decodes to U+FFFD per maximal bad subsequence.
  std::vector<int32_t> invalid{3 + 'a', 3 + 0xE2, 3 + 0x82, 3 + 0xFF, 3 + 'b'};
  EXPECT_EQ(tk.decode(invalid), "a\uFFFD\uFFFDb");
  EXPECT_THROW(make_byte_level_tokenizer({"<s>", "<s>"}), InputError);
  EXPECT_THROW(make_byte_level_tokenizer({""}), InputError);
}

TEST(TokenizerBuilders, TrainedBpeRoundTripsAndIsDeterministic) {
  std::vector<std::string> texts{"the cat sat on the mat", "the dog ate the hat", "a cat and a dog",
                                 "the theme of the thesis", "ab ab ab cd"};
  json j = train_byte_level_bpe(texts, 3 + 256 + 24, {"<s>", "</s>", "<pad>"});
  EXPECT_EQ(j, train_byte_level_bpe(texts, 3 + 256 + 24, {"<s>", "</s>", "<pad>"}));
  Tokenizer tk = Tokenizer::from_json(j, "trained");
  EXPECT_EQ(tk.vocab_size(), 3 + 256 + 24);
  EXPECT_EQ(j["model"]["merges"].size(), 24u);
  // The most frequent pair merges first; ties go to the smaller (left, right) byte ids (Ġ is byte 32).
  EXPECT_EQ(train_byte_level_bpe({"ab ab ab cd"}, 256 + 1, {})["model"]["merges"], json::parse(R"([["a","b"]])"));
  EXPECT_EQ(train_byte_level_bpe({"ab cd"}, 256 + 1, {})["model"]["merges"], json::parse(R"([["Ġ","c"]])"));
  EXPECT_TRUE(tk.token_to_id("Ġthe").has_value());
  EXPECT_EQ(tk.encode(" the").size(), 1u);
  for (const std::string text : {"the cat", "unseen words, 123!", "<s>the</s>", "", "中文 \U0001F600"}) {
    EXPECT_EQ(tk.decode(tk.encode(text)), text);
  }
  EXPECT_LT(tk.encode("the cat sat on the mat").size(), std::string("the cat sat on the mat").size());
  // Asking for more tokens than there are pairs stops when no pair is left.
  json all = train_byte_level_bpe({"abab"}, 3 + 256 + 50, {});
  EXPECT_EQ(all["model"]["merges"].size(), 2u);  // a+b, then ab+ab
  EXPECT_THROW(train_byte_level_bpe(texts, 100, {}), InputError);
}

// ---- The CLI. ----

TEST(TokenizerCli, RoundTripAndErrors) {
  std::string path = fixture_dir() + "/tokenizer.json";
  auto enc = test::run_tandem({"tokenize", "--tokenizer", path}, "Hello, world!");
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  ASSERT_EQ(cases()[0].at("text"), "Hello, world!");
  EXPECT_EQ(json::parse(enc.out), cases()[0].at("ids"));
  auto dec = test::run_tandem({"tokenize", "--tokenizer", fixture_dir(), "--decode"}, enc.out);
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, "Hello, world!");
  auto missing = test::run_tandem({"tokenize", "--tokenizer", "/nonexistent/tokenizer.json"}, "x");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("error:"), std::string::npos) << missing.err;
  auto bad_ids = test::run_tandem({"tokenize", "--tokenizer", path, "--decode"}, "[1, \"two\"]");
  EXPECT_EQ(bad_ids.exit_code, 2);
  auto out_of_range = test::run_tandem({"tokenize", "--tokenizer", path, "--decode"}, "[99999]");
  EXPECT_EQ(out_of_range.exit_code, 2);
  auto bad_utf8 = test::run_tandem({"tokenize", "--tokenizer", path}, "ab\xff");
  EXPECT_EQ(bad_utf8.exit_code, 2);
}

}  // namespace
}  // namespace tandem
