// `tandem tokenize`: text on stdin → a JSON list of token ids on stdout, or with --decode a JSON list
// of ids on stdin → the decoded text on stdout, written as is (no newline added).
#include <climits>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "io/tokenizer.h"

namespace tandem::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool decode = false;
  bool skip_special = false;
  bool add_special = false;
};

int run_tokenize(const TokenizeOptions& o) {
  Tokenizer tk = Tokenizer::load(o.tokenizer);
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (!o.decode) {
    auto ids = o.add_special ? tk.encode_with_special(input) : tk.encode(input);
    std::string out = nlohmann::json(ids).dump() + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  nlohmann::json j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) fail("stdin: --decode expects a JSON list of token ids, e.g. [1, 2, 3]");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
      fail("stdin: --decode expects integer token ids, got {}", v.dump());
    }
    ids.push_back(v.get<int32_t>());
  }
  std::string text = tk.decode(ids, o.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

RunFn setup_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json, or a model folder holding one")->required();
  app.add_flag("--decode", o->decode, "read a JSON list of ids from stdin and print their text");
  app.add_flag("--skip-special", o->skip_special, "with --decode: leave special tokens out");
  app.add_flag("--add-special", o->add_special, "when encoding: apply the post-processor (BOS/EOS)");
  return [o] { return run_tokenize(*o); };
}

}  // namespace
}  // namespace tandem::cli

TANDEM_COMMAND(tokenize, "tokenize", "Encode stdin to token ids, or decode ids to text", tandem::cli::setup_tokenize);
