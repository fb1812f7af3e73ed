// Tokenizer tests: the 140 reference encodings of shared/fixtures/tokenizer (ids and decoded text
// exactly), both merges spellings, added tokens, each supported component on small hand-built files,
// bad files, the byte-level builder and BPE trainer, and the `tandem tokenize` command.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <thread>

#include "core/error.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string fixture_dir() { return test::shared_dir() + "/fixtures/tokenizer"; }

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

std::string ids_str(const std::vector<int32_t>& ids) { return json(ids).dump(); }

// Every fixture case: ids and the decoded text reproduce exactly; failures are listed one by one.
TEST(TokenizerFixture, AllCasesReproduce) {
  const Tokenizer& tk = fixture();
  ASSERT_EQ(cases().size(), 140u);
  int failed = 0;
  for (size_t i = 0; i < cases().size(); ++i) {
    const json& c = cases()[i];
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

TEST(TokenizerFixture, Basics) {
  const Tokenizer& tk = fixture();
  EXPECT_EQ(tk.vocab_size(), 16384);
  EXPECT_EQ(tk.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(tk.id_to_token(2), "<|im_end|>");
  EXPECT_TRUE(tk.is_special(0));
  EXPECT_FALSE(tk.is_special(100));
  EXPECT_FALSE(tk.token_to_id("no such token at all").has_value());
  EXPECT_TRUE(tk.encode("").empty());
  EXPECT_EQ(tk.decode(std::vector<int32_t>{}), "");
  EXPECT_THROW(tk.id_to_token(16384), InputError);
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
  std::vector<int32_t> bad{5, 16384};
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

}  // namespace
}  // namespace tandem
