// libFuzzer target: the input is tokenizer.json content. A file that loads must encode and decode a
// few strings; the only exception allowed anywhere is InputError (bad input), anything else is a bug.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    tandem::Tokenizer tk = tandem::Tokenizer::from_json(j, "fuzz");
    for (const char* text : {"", "Hello, world!", "  spaces\t\nand\r\n lines  ", "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 42",
                             "<|im_start|>user<|im_end|>", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB"}) {
      auto ids = tk.encode(text);
      tk.decode(ids);
      tk.decode(ids, /*skip_special=*/true);
      tk.encode_with_special(text);
    }
  } catch (const tandem::InputError&) {
  }
  return 0;
}
