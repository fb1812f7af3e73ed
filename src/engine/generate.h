// Batched generation on an Engine: prefill every prompt (in chunks), then decode all live sequences
// one token per step in a single batch until each hits its token budget, a stop token or the engine's
// context (prompt + generated = max_ctx: finish_reason "length", the tokens so far are kept).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace tandem {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, vocab] when GenerateOptions::keep_logits
  std::string finish_reason;  // "length" or "stop"
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t decode_steps = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

struct GenerateOptions {
  bool keep_logits = false;
  int64_t prefill_chunk = 256;  // rows per prefill step
  // Called after each token is chosen (request index, token). Throwing aborts generation.
  std::function<void(size_t, int32_t)> on_token;
};

// A prompt longer than the context (or as long, when it asks for tokens) is refused before any work
// (InputError naming the numbers).
std::vector<GenerateResult> generate(Engine& engine, std::span<const GenerateRequest> requests,
                                     const GenerateOptions& options = {}, GenerateStats* stats = nullptr);

}  // namespace tandem
