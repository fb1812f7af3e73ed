// Memory model of the primary (see memory_model.h and docs/placement.md "Memory model").
#include "placement/memory_model.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/safetensors.h"

namespace tandem {

uint64_t parse_size(std::string_view text, std::string_view what) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += char(std::tolower(static_cast<unsigned char>(c)));
  size_t split = 0;
  while (split < t.size() && (std::isdigit(static_cast<unsigned char>(t[split])) || t[split] == '.')) ++split;
  std::string number = t.substr(0, split), unit = t.substr(split);
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc() || end != number.data() + number.size())
    fail("{}: \"{}\" is not a size (examples: 80GiB, 12.5GB, 512MiB, 4096)", what, text);
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"b", 1},
                                    {"kb", 1e3},
                                    {"mb", 1e6},
                                    {"gb", 1e9},
                                    {"tb", 1e12},
                                    {"kib", 1024.0},
                                    {"mib", 1024.0 * 1024},
                                    {"gib", 1024.0 * 1024 * 1024},
                                    {"tib", 1024.0 * 1024 * 1024 * 1024}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    double bytes = std::floor(value * u.scale);
    if (!(bytes < 9.0e18)) fail("{}: \"{}\" is too large", what, text);
    return uint64_t(bytes);
  }
  fail("{}: unknown unit \"{}\" in \"{}\" (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", what, unit, text);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr std::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = double(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

int64_t kv_elements_per_token_layer(const ModelConfig& cfg) {
  if (cfg.mla) return cfg.kv_lora_rank + cfg.qk_rope_head_dim;
  return 2 * cfg.n_head_kv * cfg.head_dim;
}

uint64_t kv_bytes_per_token(const ModelConfig& cfg, DType kv_dtype) {
  return uint64_t(cfg.n_layer) * uint64_t(kv_elements_per_token_layer(cfg)) * dtype_size(kv_dtype);
}

static int64_t count_moe(const ModelConfig& cfg) {
  return std::count(cfg.layer_is_moe.begin(), cfg.layer_is_moe.end(), true);
}

ModelBytes model_bytes(const ModelConfig& cfg, DType weight_dtype) {
  const uint64_t b = dtype_size(weight_dtype);
  const int64_t h = cfg.hidden_size;
  ModelBytes m;
  m.n_moe_layer = count_moe(cfg);
  m.n_expert = cfg.n_expert;
  m.embeddings = uint64_t(cfg.vocab_size * h) * b;
  m.output_head = cfg.tie_word_embeddings ? 0 : m.embeddings;

  int64_t attn = 0, norms = 2 * h;  // per layer; norms: input + post-attention RMSNorm
  if (cfg.mla) {
    int64_t qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
    attn += cfg.q_lora_rank > 0 ? cfg.q_lora_rank * h + cfg.n_head * qk * cfg.q_lora_rank  // q_a, q_b
                                : cfg.n_head * qk * h;                                      // q_proj
    attn += (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * h;                       // kv_a_proj_with_mqa
    attn += cfg.n_head * (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank;  // kv_b_proj
    attn += h * cfg.n_head * cfg.v_head_dim;                                            // o_proj
    norms += cfg.q_lora_rank + cfg.kv_lora_rank;  // q_a_layernorm (when q_lora_rank > 0), kv_a_layernorm
  } else {
    attn += 2 * h * cfg.n_head * cfg.head_dim;       // q_proj, o_proj
    attn += 2 * h * cfg.n_head_kv * cfg.head_dim;    // k_proj, v_proj
    switch (cfg.qk_norm) {
      case QkNorm::kNone:
        break;
      case QkNorm::kPerHead:
        norms += 2 * cfg.head_dim;
        break;
      case QkNorm::kWhole:
        norms += (cfg.n_head + cfg.n_head_kv) * cfg.head_dim;
        break;
    }
  }
  m.attention = uint64_t(attn * cfg.n_layer) * b;
  m.norms = uint64_t(norms * cfg.n_layer + h) * b;  // + the final norm

  const int64_t n_dense = cfg.n_layer - m.n_moe_layer;
  m.dense_mlp = uint64_t(n_dense * 3 * h * cfg.intermediate_size) * b;
  int64_t router = cfg.n_expert * h;
  switch (cfg.router) {
    case RouterKind::kSoftmaxTopK:
      break;
    case RouterKind::kSigmoidGroupTopK:
      router += cfg.n_expert;  // e_score_correction_bias
      break;
  }
  m.routers = uint64_t(m.n_moe_layer * router) * b;
  m.shared_experts = uint64_t(m.n_moe_layer * 3 * h * cfg.shared_intermediate_size()) * b;
  m.expert_bytes = uint64_t(3 * h * cfg.moe_intermediate_size) * b;
  m.routed_experts = uint64_t(m.n_moe_layer * cfg.n_expert) * m.expert_bytes;
  return m;
}

// The layer index of "model.layers.<N>.…", or -1.
static int64_t layer_of(std::string_view name) {
  constexpr std::string_view kKey = "layers.";
  size_t p = name.find(kKey);
  if (p == std::string_view::npos) return -1;
  p += kKey.size();
  int64_t layer = -1;
  auto [end, ec] = std::from_chars(name.data() + p, name.data() + name.size(), layer);
  if (ec != std::errc() || end == name.data() + p || end == name.data() + name.size() || *end != '.') return -1;
  return layer;
}

ModelBytes model_bytes(const ModelConfig& cfg, const std::vector<TensorMeta>& tensors) {
  ModelBytes m;
  m.n_moe_layer = count_moe(cfg);
  m.n_expert = cfg.n_expert;
  auto has = [](std::string_view name, std::string_view part) { return name.find(part) != std::string_view::npos; };
  for (const TensorMeta& t : tensors) {
    const uint64_t n = uint64_t(t.shape.numel()) * dtype_size(t.dtype);
    const std::string_view name = t.name;
    const int64_t layer = layer_of(name);
    if (layer >= cfg.n_layer) {
      m.unused += n;
    } else if (has(name, ".experts.")) {  // routed: per expert or fused [n_expert, ...]
      m.routed_experts += n;
    } else if (has(name, "shared_expert")) {  // shared_experts.* (deepseek), shared_expert(_gate) (qwen2)
      m.shared_experts += n;
    } else if (has(name, ".mlp.gate.") || has(name, ".block_sparse_moe.gate.")) {
      m.routers += n;
    } else if (has(name, "norm")) {
      m.norms += n;
    } else if (has(name, ".self_attn.")) {
      m.attention += n;
    } else if (has(name, ".mlp.")) {
      m.dense_mlp += n;
    } else if (has(name, "embed_tokens")) {
      m.embeddings += n;
    } else if (has(name, "lm_head")) {
      m.output_head += n;
    } else {
      m.other += n;
    }
  }
  const uint64_t n_routed = uint64_t(m.n_moe_layer * m.n_expert);
  m.expert_bytes = n_routed ? (m.routed_experts + n_routed - 1) / n_routed : 0;
  return m;
}

ModelBytes model_bytes(const ModelConfig& cfg, const TensorStore& store) {
  return model_bytes(cfg, tensor_metas(cfg, store));
}

int64_t MemoryModel::free_bytes() const {
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  TANDEM_ASSERT(primary_bytes <= kMax && bytes.primary_fixed() <= kMax && reserve_bytes <= kMax,
                "byte counts out of range");
  return int64_t(primary_bytes) - int64_t(bytes.primary_fixed()) - int64_t(reserve_bytes);
}

int64_t MemoryModel::kv_tokens(int64_t n_hot) const {
  TANDEM_ASSERT(kv_bytes_per_token > 0, "kv_bytes_per_token is 0");
  __int128 left = __int128(free_bytes()) - __int128(n_hot) * bytes.expert_bytes;
  if (left < 0) return -1;
  return int64_t(left / kv_bytes_per_token);
}

int64_t MemoryModel::max_hot(int64_t kv_tokens) const {
  const int64_t all = bytes.n_moe_layer * bytes.n_expert;
  __int128 left = __int128(free_bytes()) - __int128(kv_tokens) * kv_bytes_per_token;
  if (left < 0) return -1;
  if (bytes.expert_bytes == 0) return all;
  return int64_t(std::min<__int128>(all, left / bytes.expert_bytes));
}

}  // namespace tandem
