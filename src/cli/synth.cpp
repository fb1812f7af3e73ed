// `tandem synth`: write a synthetic checkpoint (random bf16 weights, or FP8 ones) of a preset or a config.json.
#include <fmt/format.h>

#include <fstream>

#include "cli/command.h"
#include "placement/memory_model.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "models/synth.h"

namespace tandem::cli {
namespace {

// With the built-in byte-level tokenizer (<|endoftext|>, <|im_start|>, <|im_end|> = ids 0, 1, 2; the
// presets' eos_token_id is 2): a tokenizer_config.json with a ChatML template and <|im_end|> as the eos
// token, so that `tandem serve` and `tandem template` have a chat template on a synthetic model.
void write_chat_config(const std::string& dir) {
  nlohmann::ordered_json j;
  j["bos_token"] = nullptr;
  j["eos_token"] = "<|im_end|>";
  j["pad_token"] = "<|endoftext|>";
  j["chat_template"] =
      "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + "
      "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  std::ofstream f(dir + "/tokenizer_config.json");
  if (!(f << j.dump(2) << "\n")) fail("cannot write {}/tokenizer_config.json", dir);
}

RunFn setup(CLI::App& app) {
  struct Opts {
    std::string preset, config, out, tokenizer, weights = "bf16";
    uint64_t seed = 0;
    double skew = 0;
    int threads = 0;
    bool list = false;
  };
  auto o = std::make_shared<Opts>();
  std::string presets;
  for (const auto& [name, desc] : synth_presets()) presets += fmt::format("\n  {:<13} {}", name, desc);
  app.add_option("--preset", o->preset, "Built-in model shape:" + presets);
  app.add_option("--config", o->config, "A config.json to use instead of a preset");
  app.add_option("--out", o->out, "Output folder (config.json, model.safetensors, tokenizer.json, and with the "
                 "built-in tokenizer a tokenizer_config.json with a ChatML chat template)");
  app.add_option("--seed", o->seed, "Random seed (default 0)");
  app.add_option("--router-skew", o->skew,
                 "deepseek_v3: correction bias = SKEW * N(0,1) per expert, skewing expert popularity (default 0)");
  app.add_option("--tokenizer", o->tokenizer, "tokenizer.json to ship with the model (default: a byte-level one)");
  app.add_option("--threads", o->threads, "Threads for weight generation (default: all)");
  app.add_option("--weights", o->weights,
                 "bf16 (default), or fp8: attention, MLP and expert weights as F8_E4M3 with 128x128 block scales "
                 "(DeepSeek's format), quantized from the bf16 weights of the same seed");
  app.add_flag("--list", o->list, "List the presets and exit");
  return [o] {
    if (o->list) {
      for (const auto& [name, desc] : synth_presets()) fmt::print("{:<13} {}\n", name, desc);
      return 0;
    }
    if (o->out.empty()) fail("--out is required");
    if (o->preset.empty() == o->config.empty()) fail("give exactly one of --preset and --config");
    nlohmann::json cfg;
    if (!o->preset.empty()) {
      cfg = synth_preset_config(o->preset);
    } else {
      std::ifstream in(o->config);
      if (!in) fail("cannot open {}", o->config);
      cfg = nlohmann::json::parse(in, nullptr, false);
      if (cfg.is_discarded()) fail("{}: malformed JSON", o->config);
    }
    if (o->weights == "fp8")
      cfg = with_fp8_weights(std::move(cfg));
    else if (o->weights != "bf16")
      fail("--weights must be bf16 or fp8, got '{}'", o->weights);
    set_global_threads(o->threads);
    SynthOptions so;
    so.seed = o->seed;
    so.router_skew = o->skew;
    so.tokenizer_path = o->tokenizer;
    so.progress = true;
    uint64_t bytes = write_synthetic_model(cfg, o->out, so);
    if (o->tokenizer.empty()) write_chat_config(o->out);
    fmt::print("synth: wrote {} ({} of random weights: its text is gibberish by design)\n", o->out,
               format_bytes(bytes));
    fmt::print(stderr, "next: tandem info --model {}\n", o->out);
    return 0;
  };
}

}  // namespace
TANDEM_COMMAND(synth, "synth", "Write a synthetic checkpoint with random bf16 weights", setup);
}  // namespace tandem::cli
