// `tandem generate`: prompt(s) in, text out, streamed as tokens are chosen. Several --prompt flags
// decode together as one batch.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/generate.h"
#include "io/tokenizer.h"

namespace tandem::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--prompt-ids: '{}' is not an integer", item);
    }
  }
  if (ids.empty()) fail("--prompt-ids is empty");
  return ids;
}

// Special tokens are hidden from the text unless --show-special; a model that emits mostly those (a
// random one does) would otherwise print nothing and leave the user guessing. Says how many on stderr.
void note_hidden_special(const std::optional<Tokenizer>& tok, const std::vector<GenerateResult>& results,
                         bool show_special) {
  if (!tok || show_special) return;
  size_t special = 0, total = 0;
  for (const auto& r : results)
    for (int32_t t : r.tokens) {
      ++total;
      special += tok->is_special(t);
    }
  if (special > 0)
    fmt::print(stderr, "generate: {} of {} generated tokens are special tokens, hidden from the text; "
               "--show-special prints them\n", special, total);
}

RunFn setup(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::vector<std::string> prompts;
    std::string prompt_ids;
    int64_t max_tokens = 64;
    float temperature = 0, top_p = 1;
    int64_t top_k = 0;
    uint64_t seed = 0;
    bool json = false, ignore_eos = false, show_special = false;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(app, o->model);
  app.add_option("--prompt", o->prompts, "Prompt text (repeat for a batch)");
  app.add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: 1,2,3");
  app.add_option("--max-tokens", o->max_tokens, "Tokens to generate per prompt (default 64)");
  app.add_option("--temperature", o->temperature, "0 = greedy (default)");
  app.add_option("--top-k", o->top_k, "Sample among the k most likely (0 = all)");
  app.add_option("--top-p", o->top_p, "Nucleus sampling mass (1 = all)");
  app.add_option("--seed", o->seed, "Sampling seed");
  app.add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  app.add_flag("--show-special", o->show_special, "Print special tokens (e.g. <|im_end|>) in the text");
  app.add_flag("--json", o->json, "Print one JSON object with tokens, text and timings instead of streaming");
  return [o] {
    if (o->prompts.empty() == o->prompt_ids.empty()) fail("give --prompt TEXT or --prompt-ids 1,2,3");
    if (o->max_tokens < 0) fail("--max-tokens {}: give 0 or more", o->max_tokens);
    Runtime rt = Runtime::open(runtime_options(o->model, int64_t(std::max<size_t>(1, o->prompts.size()))));
    std::optional<Tokenizer> tok;
    const std::string tok_path = o->model.model_dir + "/tokenizer.json";
    if (access(tok_path.c_str(), R_OK) == 0) tok = Tokenizer::load(tok_path);
    std::vector<GenerateRequest> reqs;
    SamplerParams sp{o->temperature, o->top_k, o->top_p, o->seed};
    auto add = [&](std::vector<int32_t> ids) {
      GenerateRequest r;
      r.prompt = std::move(ids);
      r.max_tokens = o->max_tokens;
      r.sampling = sp;
      if (!o->ignore_eos)
        for (int64_t e : rt.model->cfg.eos_token_ids) r.stop_ids.push_back(int32_t(e));
      reqs.push_back(std::move(r));
    };
    if (!o->prompt_ids.empty()) {
      add(parse_ids(o->prompt_ids));
    } else {
      if (!tok) fail("{} has no tokenizer.json: use --prompt-ids", o->model.model_dir);
      for (const auto& p : o->prompts) add(tok->encode(p));
    }
    // Limits before work: a prompt that cannot fit is refused by generate() before any step; a budget
    // past the context is said now, and generation then ends there with finish_reason "length".
    const int64_t ctx = rt.engine->max_ctx();
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int64_t prompt = int64_t(reqs[i].prompt.size());
      if (prompt < ctx && prompt + reqs[i].max_tokens > ctx)
        spdlog::warn("prompt {}: {} tokens + --max-tokens {} exceed the context limit of {} (--ctx): generation "
                     "stops after {} tokens (finish_reason \"length\")",
                     i, prompt, reqs[i].max_tokens, ctx, ctx - prompt);
    }
    const bool stream = !o->json && reqs.size() == 1 && tok;
    std::string printed;
    std::vector<int32_t> so_far;
    GenerateOptions go;
    if (stream) {
      go.on_token = [&](size_t, int32_t t) {
        so_far.push_back(t);
        std::string text = tok->decode(so_far, !o->show_special);
        // Print only complete UTF-8: hold back a trailing partial character.
        size_t end = text.size();
        size_t i = end;
        while (i > 0 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i;
        if (i > 0) {
          unsigned char lead = static_cast<unsigned char>(text[i - 1]);
          size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
          if (end - (i - 1) < need) end = i - 1;
        }
        if (end > printed.size() && text.compare(0, printed.size(), printed) == 0) {
          fmt::print("{}", text.substr(printed.size(), end - printed.size()));
          std::fflush(stdout);
          printed = text.substr(0, end);
        }
      };
    }
    GenerateStats st;
    auto results = generate(*rt.engine, reqs, go, &st);
    // Decode steps produce every token after each sequence's first (which prefill yields).
    const int64_t decoded = std::max<int64_t>(0, st.generated_tokens - int64_t(reqs.size()));
    const double tps = st.decode_seconds > 0 && decoded > 0 ? double(decoded) / st.decode_seconds : 0;
    if (o->json) {
      nlohmann::json j;
      j["results"] = nlohmann::json::array();
      for (size_t i = 0; i < results.size(); ++i) {
        nlohmann::json r = {{"prompt_tokens", reqs[i].prompt.size()}, {"tokens", results[i].tokens},
                            {"finish_reason", results[i].finish_reason}};
        if (tok) r["text"] = tok->decode(results[i].tokens, !o->show_special);
        j["results"].push_back(r);
      }
      j["prefill_seconds"] = st.prefill_seconds;
      j["decode_seconds"] = st.decode_seconds;
      j["decode_tokens_per_second"] = tps;
      fmt::print("{}\n", j.dump());
      note_hidden_special(tok, results, o->show_special);
      if (std::string lane = rt.lane_summary(); !lane.empty()) fmt::print(stderr, "{}\n", lane);
      return 0;
    }
    if (stream) {
      std::string text = tok->decode(results[0].tokens, !o->show_special);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0)
        fmt::print("{}", text.substr(printed.size()));
      fmt::print("\n");
      std::fflush(stdout);
    } else {
      for (size_t i = 0; i < results.size(); ++i) {
        if (tok)
          fmt::print("[{}] {}\n", i, tok->decode(results[i].tokens, !o->show_special));
        else
          fmt::print("[{}] {}\n", i, fmt::join(results[i].tokens, ","));
      }
    }
    fmt::print(stderr, "generate: {} prompt tokens, {} generated; prefill {:.3f} s, decode {:.2f} tokens/s\n",
               st.prompt_tokens, st.generated_tokens, st.prefill_seconds, tps);
    note_hidden_special(tok, results, o->show_special);
    if (std::string lane = rt.lane_summary(); !lane.empty()) fmt::print(stderr, "{}\n", lane);
    return 0;
  };
}

}  // namespace
TANDEM_COMMAND(generate, "generate", "Generate text from a prompt", setup);
}  // namespace tandem::cli
