// The fixture comparison behind `tandem verify` and the oracle tests: full-sequence logits, every
// MoE block's output, and the greedy continuation (tokens and the logits they were chosen from),
// each compared as max|a − b| / max|b| against a reference dump (expected.safetensors).
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"

namespace tandem {

struct VerifyCheck {
  std::string name;      // "logits", "moe_out.3", "gen_logits", "gen_tokens"
  double max_rel_err = 0;  // for gen_tokens: number of mismatching tokens
  double tolerance = 0;
  bool pass = false;
};

struct VerifyOptions {
  double tolerance = 1e-4;  // f32 compute against an f32 reference
};

// Runs the model on expected's input_ids (one sequence per row) through `engine` and compares.
// Missing or malformed reference tensors are an InputError naming the file.
std::vector<VerifyCheck> verify_against(Engine& engine, const std::string& expected_path,
                                        const VerifyOptions& options = {});

double max_rel_err(const float* a, const float* b, int64_t n);

}  // namespace tandem
