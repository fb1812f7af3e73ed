// Generated token ids → the text a client may be sent, chunk by chunk. Decodes incrementally (a short
// window of recent ids, so the cost per token stays constant), sends only whole UTF-8 characters (a
// character split across tokens waits for its last byte; bytes that can never complete one become
// U+FFFD, as the tokenizer's decode does), and holds back text that could still become a stop string:
// a stop string and everything after it is never sent. Invariant: every chunk is valid UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace tandem::server {

class TextStream {
 public:
  // stop: up to a few non-empty strings. skip_special drops special tokens from the text.
  TextStream(const Tokenizer& tok, std::vector<std::string> stop, bool skip_special = true);

  // Adds the next generated token; returns the text that is now safe to send (often empty). Once
  // stopped() is true (a stop string matched), the caller must end the answer: later pushes return "".
  std::string push(int32_t id);
  // At the end of generation (budget, end-of-sequence token): the text held back so far, with a
  // trailing partial character as U+FFFD. "" after a stop.
  std::string finish();
  bool stopped() const { return stopped_; }
  // Tokens pushed (the completion's token count, those after a stop match included).
  int64_t tokens() const { return int64_t(ids_.size()); }

 private:
  std::string release(bool final);

  const Tokenizer& tok_;
  std::vector<std::string> stop_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;  // ids_[prefix_, read_) were decoded already (context for the next delta)
  std::string pending_;           // decoded, valid UTF-8, not sent yet (may hold a stop string's start)
  bool stopped_ = false;
};

// True when `s` is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

}  // namespace tandem::server
