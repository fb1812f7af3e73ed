// Incremental detokenization with stop strings (see text_stream.h).
#include "server/text_stream.h"

#include <algorithm>
#include <span>

namespace tandem::server {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stop, bool skip_special)
    : tok_(tok), stop_(std::move(stop)), skip_special_(skip_special) {}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  // Decode the window with and without the new ids: the difference is the new text. Decoding the
  // window's head again keeps decoders that treat a first token specially (Metaspace) consistent.
  const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string after = tok_.decode(all.subspan(prefix_), skip_special_);
  // A trailing U+FFFD may be a character still missing bytes (at most 3 more tokens): wait for them.
  if (ends_with(after, kReplacement) && ids_.size() - read_ < 4) return {};
  if (after.size() < before.size() || after.compare(0, before.size(), before) != 0) {
    // The decoder rewrote earlier text (not seen with byte-level or Metaspace decoders): wait for more.
    if (ids_.size() - read_ < 4) return {};
  }
  if (after.size() > before.size() && after.compare(0, before.size(), before) == 0)
    pending_ += after.substr(before.size());
  prefix_ = read_;
  read_ = ids_.size();
  return release(false);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  if (read_ < ids_.size()) {
    const std::span<const int32_t> all(ids_);
    const std::string before = tok_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
    const std::string after = tok_.decode(all.subspan(prefix_), skip_special_);
    if (after.size() > before.size() && after.compare(0, before.size(), before) == 0)
      pending_ += after.substr(before.size());
    prefix_ = read_ = ids_.size();
  }
  return release(true);
}

std::string TextStream::release(bool final) {
  // A stop string anywhere in the unsent text ends the answer before it.
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of a stop string (it starts on a character boundary:
  // its first byte is a stop string's first byte, never a continuation byte).
  size_t hold = 0;
  if (!final)
    for (const auto& s : stop_)
      for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
        if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1 && b == 0xE0) lo = 0xA0;
      if (k == 1 && b == 0xED) hi = 0x9F;
      if (k == 1 && b == 0xF0) lo = 0x90;
      if (k == 1 && b == 0xF4) hi = 0x8F;
      if (c < lo || c > hi) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace tandem::server
