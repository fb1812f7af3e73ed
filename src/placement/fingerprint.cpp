// Model fingerprint (see fingerprint.h and docs/placement.md "Fingerprints").
#include "placement/fingerprint.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "core/error.h"
#include "io/safetensors.h"

namespace tandem {

void Fnv1a64::add(std::string_view bytes) {
  for (unsigned char c : bytes) {
    h_ ^= c;
    h_ *= 0x100000001b3ull;
  }
}

std::string Fnv1a64::fingerprint() const { return fmt::format("fp1:{:016x}", h_); }

std::vector<TensorMeta> tensor_metas(const TensorStore& store) {
  std::vector<TensorMeta> out;
  for (const std::string& name : store.names()) {
    const TensorView* v = store.find(name);
    TANDEM_ASSERT(v != nullptr, "tensor {} listed but not found", name);
    out.push_back({name, v->dtype, v->shape});
  }
  return out;
}

std::vector<TensorMeta> tensor_metas(const ModelConfig& cfg, const TensorStore& store) {
  std::vector<TensorMeta> out = tensor_metas(store);
  if (!cfg.quant.at_load) return out;
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    TensorMeta& t = out[i];
    if (t.name.find(".experts.") == std::string::npos || !t.name.ends_with(".weight") || t.shape.ndim != 2 ||
        !dtype_is_float_weight(t.dtype))
      continue;
    t.dtype = DType::kF8E4M3;
    const Shape grid{(t.shape[0] + cfg.quant.block_rows - 1) / cfg.quant.block_rows,
                     (t.shape[1] + cfg.quant.block_cols - 1) / cfg.quant.block_cols};
    out.push_back({t.name + "_scale_inv", DType::kF32, grid});  // t may move: it is not used after this
  }
  return out;
}

static std::string_view router_name(RouterKind r) {
  switch (r) {
    case RouterKind::kSoftmaxTopK:
      return "softmax_topk";
    case RouterKind::kSigmoidGroupTopK:
      return "sigmoid_group_topk";
  }
  TANDEM_ASSERT(false, "unknown router kind {}", int(r));
}

std::string fingerprint_text(const ModelConfig& cfg, std::vector<TensorMeta> tensors) {
  std::string s;
  auto line = [&](std::string_view key, const std::string& value) {
    s += key;
    s += '=';
    s += value;
    s += '\n';
  };
  auto num = [&](std::string_view key, int64_t v) { line(key, std::to_string(v)); };
  line("model_type", cfg.model_type);
  num("hidden_size", cfg.hidden_size);
  num("n_layer", cfg.n_layer);
  num("n_head", cfg.n_head);
  num("n_head_kv", cfg.n_head_kv);
  num("head_dim", cfg.head_dim);
  num("vocab_size", cfg.vocab_size);
  num("intermediate_size", cfg.intermediate_size);
  num("moe_intermediate_size", cfg.moe_intermediate_size);
  num("n_expert", cfg.n_expert);
  num("n_expert_used", cfg.n_expert_used);
  num("n_shared_expert", cfg.n_shared_expert);
  num("mla", cfg.mla ? 1 : 0);
  num("q_lora_rank", cfg.q_lora_rank);
  num("kv_lora_rank", cfg.kv_lora_rank);
  num("qk_nope_head_dim", cfg.qk_nope_head_dim);
  num("qk_rope_head_dim", cfg.qk_rope_head_dim);
  num("v_head_dim", cfg.v_head_dim);
  std::string moe;
  for (bool b : cfg.layer_is_moe) moe += b ? '1' : '0';
  line("layer_is_moe", moe);
  line("router", std::string(router_name(cfg.router)));
  // Only for FP8 models, so the fingerprints of float models stay what they were: the block size
  // decides what the scale grids mean, and the tensors' dtypes and shapes alone do not always show it.
  if (cfg.quant.fp8) line("fp8_block", fmt::format("{}x{}", cfg.quant.block_rows, cfg.quant.block_cols));
  if (cfg.quant.at_load) line("fp8_at_load", fmt::format("{}x{}", cfg.quant.block_rows, cfg.quant.block_cols));
  std::sort(tensors.begin(), tensors.end(), [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  for (size_t i = 0; i + 1 < tensors.size(); ++i)
    TANDEM_ASSERT(tensors[i].name != tensors[i + 1].name, "tensor {} listed twice", tensors[i].name);
  for (const TensorMeta& t : tensors) {
    std::vector<int64_t> dims(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.ndim);
    line("tensor", fmt::format("{} {} [{}]", t.name, dtype_name(t.dtype), fmt::join(dims, ",")));
  }
  return s;
}

std::string model_fingerprint(const ModelConfig& cfg, std::vector<TensorMeta> tensors) {
  Fnv1a64 h;
  h.add(fingerprint_text(cfg, std::move(tensors)));
  return h.fingerprint();
}

std::string model_fingerprint(const ModelConfig& cfg, const TensorStore& store) {
  return model_fingerprint(cfg, tensor_metas(cfg, store));
}

}  // namespace tandem
