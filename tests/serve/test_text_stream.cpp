// TextStream: incremental detokenization on a byte-level tokenizer (one id per byte, so a character
// can be split across tokens at will), stop strings held back and never emitted.
#include <gtest/gtest.h>

#include "io/tokenizer.h"
#include "server/text_stream.h"

namespace tandem::server {
namespace {

// Specials <|endoftext|>, <|im_start|>, <|im_end|> are ids 0..2; byte b is id 3 + ... in byte-level
// symbol order, so ids come from encode() of single bytes.
const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_json(make_byte_level_tokenizer({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}), "test");
  return t;
}

std::vector<int32_t> ids_of(const std::string& text) { return tok().encode(text); }

std::string run(TextStream& ts, const std::vector<int32_t>& ids, std::vector<std::string>* chunks = nullptr) {
  std::string out;
  for (int32_t id : ids) {
    std::string c = ts.push(id);
    EXPECT_TRUE(valid_utf8(c)) << "chunk is not valid UTF-8";
    if (chunks && !c.empty()) chunks->push_back(c);
    out += c;
    if (ts.stopped()) break;
  }
  std::string tail = ts.finish();
  EXPECT_TRUE(valid_utf8(tail));
  return out + tail;
}

TEST(TextStream, SplitCharactersAreSentWhole) {
  const std::string text = "a€b😀c";  // 3- and 4-byte characters, one token per byte
  const auto ids = ids_of(text);
  ASSERT_EQ(ids.size(), text.size());  // byte-level: one id per byte
  TextStream ts(tok(), {});
  std::vector<std::string> chunks;
  EXPECT_EQ(run(ts, ids, &chunks), text);
  for (const auto& c : chunks) EXPECT_TRUE(valid_utf8(c)) << c;
  EXPECT_GE(chunks.size(), 3u);  // streamed, not all held to the end
}

TEST(TextStream, InvalidBytesBecomeReplacementNotHeldForever) {
  // A lone continuation byte 0x80 (never valid) between text: U+FFFD in its place.
  const int32_t cont = ids_of("\xC2\x80")[1];
  std::vector<int32_t> ids = ids_of("x");
  ids.push_back(cont);
  for (int32_t id : ids_of("yz")) ids.push_back(id);
  TextStream ts(tok(), {});
  EXPECT_EQ(run(ts, ids), "x\xEF\xBF\xBDyz");
}

TEST(TextStream, TrailingPartialCharacterAtTheEndIsReplacement) {
  auto ids = ids_of("ok€");
  ids.pop_back();  // "ok" + the first two bytes of '€'
  TextStream ts(tok(), {});
  EXPECT_EQ(run(ts, ids), "ok\xEF\xBF\xBD");
}

TEST(TextStream, StopStringIsNeverEmitted) {
  TextStream ts(tok(), {"STOP"});
  std::vector<std::string> chunks;
  EXPECT_EQ(run(ts, ids_of("hello STOP world"), &chunks), "hello ");
  EXPECT_TRUE(ts.stopped());
  for (const auto& c : chunks) EXPECT_EQ(c.find('S'), std::string::npos) << c;
  EXPECT_EQ(ts.push(ids_of("x")[0]), "");  // nothing after a stop
}

TEST(TextStream, PartialStopPrefixIsReleasedWhenItDoesNotMatch) {
  TextStream ts(tok(), {"STOP"});
  EXPECT_EQ(run(ts, ids_of("a STO b ST")), "a STO b ST");  // never matched: all of it at the end
  EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, EarliestOfSeveralStopStrings) {
  TextStream ts(tok(), {"zz", "b"});
  EXPECT_EQ(run(ts, ids_of("aaabzz")), "aaa");
}

TEST(TextStream, MultiByteStopString) {
  TextStream ts(tok(), {"€x"});
  EXPECT_EQ(run(ts, ids_of("1€2€x3")), "1€2");
}

TEST(TextStream, SpecialTokensSkipped) {
  std::vector<int32_t> ids = ids_of("a");
  ids.push_back(2);  // <|im_end|>
  for (int32_t id : ids_of("b")) ids.push_back(id);
  TextStream ts(tok(), {});
  EXPECT_EQ(run(ts, ids), "ab");
}

TEST(TextStream, ValidUtf8Checker) {
  EXPECT_TRUE(valid_utf8("abc€😀"));
  EXPECT_FALSE(valid_utf8("\xC3"));
  EXPECT_FALSE(valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
}

}  // namespace
}  // namespace tandem::server
