// MoE routers: from router logits to (expert ids, gate weights) per token row, exactly as the
// reference implementation computes them (softmax top-k with optional renormalisation; DeepSeek-V3
// sigmoid scores with a selection-only correction bias, group-limited top-k and routed scaling).
#pragma once

#include "io/config.h"
#include "moe/experts.h"

namespace tandem {

// logits: [n_rows, n_expert] (f32). bias: [n_expert] (deepseek_v3) or empty.
// Fills routing (resized to n_rows × n_expert_used). Ties go to the lower expert id.
void route(const ModelConfig& cfg, const float* logits, int64_t n_rows, const TensorView& bias, Routing& routing);

}  // namespace tandem
