// config.json → ModelConfig (see config.h). Field names and defaults follow transformers' config
// classes for each model_type; hub checkpoints and transformers 5 spell a few fields differently
// (rope_theta vs rope_parameters, num_experts vs num_local_experts), and both spellings load.
#include "io/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tandem {

namespace {

using json = nlohmann::json;

// The largest size a config may give (layers, widths, experts, vocabulary). Checked as each field is
// read, before anything is sized from it: a lying num_hidden_layers must not reach an allocation.
constexpr int64_t kDimensionLimit = int64_t(1) << 24;

// Reads config fields with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string_view source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("{}: required field '{}' is missing", source_, key);
    return integer_of(j_[key], key);
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer_of(j_[key], key) : fallback; }
  // A size: positive and at most kDimensionLimit.
  int64_t positive(const char* key) const {
    int64_t v = integer(key);
    if (v <= 0) fail("{}: field '{}' must be positive, got {}", source_, key, v);
    if (v > kDimensionLimit)
      fail("{}: field '{}' ({}) exceeds the supported limit {}", source_, key, v, kDimensionLimit);
    return v;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", source_, key, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_boolean()) fail("{}: field '{}' must be true or false, got {}", source_, key, v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    if (!has(key)) fail("{}: required field '{}' is missing", source_, key);
    if (!j_[key].is_string()) fail("{}: field '{}' must be a string, got {}", source_, key, j_[key].dump());
    return j_[key].get<std::string>();
  }
  const json& raw(const char* key) const { return j_[key]; }

 private:
  int64_t integer_of(const json& v, const char* key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
    }
    fail("{}: field '{}' must be an integer, got {}", source_, key, v.dump());
  }
  const json& j_;
  std::string_view source_;
};

void parse_rope(const json& j, const Fields& f, ModelConfig& c, std::string_view source) {
  // transformers 5: rope_parameters {rope_theta, rope_type, ...}; hub: rope_theta + rope_scaling.
  const json* params = nullptr;
  if (f.has("rope_parameters")) {
    params = &j["rope_parameters"];
    if (!params->is_object()) fail("{}: field 'rope_parameters' must be an object", source);
  }
  const json* scaling = nullptr;
  if (f.has("rope_scaling")) {
    scaling = &j["rope_scaling"];
    if (!scaling->is_object()) fail("{}: field 'rope_scaling' must be an object or null", source);
  }
  c.rope.theta = f.number("rope_theta", 10000.0);
  if (params && params->contains("rope_theta")) {
    if (!(*params)["rope_theta"].is_number()) fail("{}: rope_parameters.rope_theta must be a number", source);
    c.rope.theta = (*params)["rope_theta"].get<double>();
  }
  if (!(c.rope.theta > 0)) fail("{}: rope_theta must be positive", source);
  const json* s = scaling ? scaling : params;
  if (!s) return;
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (s->contains(key) && (*s)[key].is_string()) type = (*s)[key].get<std::string>();
  Fields sf(*s, source);
  auto num = [&](const char* key, double fallback) { return sf.number(key, fallback); };
  if (type == "default") {
    c.rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    c.rope.type = RopeType::kLinear;
    c.rope.factor = num("factor", 1.0);
  } else if (type == "yarn") {
    c.rope.type = RopeType::kYarn;
    c.rope.factor = num("factor", 1.0);
    c.rope.original_max_position_embeddings =
        sf.integer("original_max_position_embeddings", c.max_position_embeddings);
    c.rope.beta_fast = num("beta_fast", 32.0);
    c.rope.beta_slow = num("beta_slow", 1.0);
    c.rope.mscale = num("mscale", 1.0);
    c.rope.mscale_all_dim = num("mscale_all_dim", 0.0);
    c.rope.attention_factor = num("attention_factor", 0.0);
    c.rope.truncate = sf.boolean("truncate", true);
  } else {
    fail("{}: rope type '{}' is not supported (supported: default, linear, yarn)", source, type);
  }
  if (!(c.rope.factor > 0)) fail("{}: rope scaling factor must be positive", source);
}

std::vector<int64_t> int_list(const json& v, std::string_view source, const char* key) {
  std::vector<int64_t> out;
  if (v.is_null()) return out;
  if (v.is_number_integer()) return {v.get<int64_t>()};
  if (!v.is_array()) fail("{}: field '{}' must be an integer or a list of integers", source, key);
  for (const auto& e : v) {
    if (!e.is_number_integer()) fail("{}: field '{}' must hold integers, got {}", source, key, e.dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// quantization_config: only the block-scaled FP8 format is read; anything else is refused with what
// is supported, never ignored (weights read without their scales would be a wrong model).
QuantConfig parse_quantization(const json& q, std::string_view source) {
  if (!q.is_object()) fail("{}: field 'quantization_config' must be an object, got {}", source, q.dump());
  Fields f(q, source);
  const std::string method = f.has("quant_method") ? f.string("quant_method") : std::string();
  if (method != "fp8")
    fail("{}: quantization_config.quant_method '{}' is not supported (supported: \"fp8\", the block-scaled "
         "float8_e4m3fn format of DeepSeek-V3 and Qwen3 FP8 checkpoints)",
         source, method);
  if (f.has("fmt") && f.string("fmt") != "e4m3")
    fail("{}: quantization_config.fmt '{}' is not supported (supported: \"e4m3\")", source, f.string("fmt"));
  if (f.has("activation_scheme") && f.string("activation_scheme") != "dynamic")
    fail("{}: quantization_config.activation_scheme '{}' is not supported (supported: \"dynamic\"; static "
         "activation scales are not read)",
         source, f.string("activation_scheme"));
  if (!f.has("weight_block_size"))
    fail("{}: quantization_config has no weight_block_size: per-tensor and per-channel FP8 scales are not "
         "supported, only block scales (weight_block_size, e.g. [128, 128])",
         source);
  const json& bs = f.raw("weight_block_size");
  if (!bs.is_array() || bs.size() != 2)
    fail("{}: quantization_config.weight_block_size must be [rows, cols], got {}", source, bs.dump());
  QuantConfig out;
  out.fp8 = true;
  int64_t* dims[2] = {&out.block_rows, &out.block_cols};
  for (size_t i = 0; i < 2; ++i) {
    const json& v = bs[i];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > kDimensionLimit)
      fail("{}: quantization_config.weight_block_size must hold two positive integers (at most {}), got {}",
           source, kDimensionLimit, bs.dump());
    *dims[i] = v.get<int64_t>();
  }
  return out;
}

}  // namespace

std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen3Moe: return "qwen3_moe";
    case Arch::kMixtral: return "mixtral";
    case Arch::kOlmoe: return "olmoe";
    case Arch::kDeepseekV3: return "deepseek_v3";
  }
  return "?";
}

std::string supported_model_types() { return "qwen3_moe, mixtral, olmoe, deepseek_v3"; }

int64_t ModelConfig::n_moe_layers() const {
  int64_t n = 0;
  for (bool b : layer_is_moe) n += b;
  return n;
}

double ModelConfig::rope_attention_factor() const {
  if (rope.type != RopeType::kYarn) return 1.0;
  if (rope.attention_factor > 0) return rope.attention_factor;
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (rope.mscale != 0 && rope.mscale_all_dim != 0)
    return get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim);
  return get_mscale(rope.factor, 1.0);
}

double ModelConfig::attn_scale() const {
  double d = mla ? double(qk_nope_head_dim + qk_rope_head_dim) : double(head_dim);
  double scale = 1.0 / std::sqrt(d);
  if (mla && rope.type == RopeType::kYarn && rope.mscale_all_dim != 0 && rope.factor > 1) {
    double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

int64_t ModelConfig::kv_floats_per_token_layer() const {
  return mla ? kv_lora_rank + qk_rope_head_dim : 2 * n_head_kv * head_dim;
}

void apply_weights_option(ModelConfig& cfg, const std::string& weights) {
  if (weights == "checkpoint") return;
  if (weights != "fp8") fail("--weights must be checkpoint or fp8, got '{}'", weights);
  cfg.quant.at_load = true;
  if (!cfg.quant.fp8) cfg.quant.block_rows = cfg.quant.block_cols = 128;
}

ModelConfig parse_config(const json& j, std::string_view source) {
  if (!j.is_object()) fail("{}: config must be a JSON object", source);
  Fields f(j, source);
  ModelConfig c;
  c.model_type = f.string("model_type");
  if (c.model_type == "qwen3_moe") {
    c.arch = Arch::kQwen3Moe;
  } else if (c.model_type == "mixtral") {
    c.arch = Arch::kMixtral;
  } else if (c.model_type == "olmoe") {
    c.arch = Arch::kOlmoe;
  } else if (c.model_type == "deepseek_v3") {
    c.arch = Arch::kDeepseekV3;
  } else {
    fail("{}: model_type '{}' is not supported (supported: {})", source, c.model_type, supported_model_types());
  }

  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.n_layer = f.positive("num_hidden_layers");
  c.n_head = f.positive("num_attention_heads");
  c.n_head_kv = f.has("num_key_value_heads") ? f.positive("num_key_value_heads") : c.n_head;
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", source, c.n_head, c.n_head_kv);
  c.head_dim = f.has("head_dim") ? f.positive("head_dim") : c.hidden_size / c.n_head;
  c.rms_norm_eps = float(f.number("rms_norm_eps", 1e-6));
  c.max_position_embeddings = f.integer("max_position_embeddings", 4096);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  parse_rope(j, f, c, source);
  if (f.has("bos_token_id")) c.bos_token_id = f.integer("bos_token_id");
  if (f.has("eos_token_id")) c.eos_token_ids = int_list(j["eos_token_id"], source, "eos_token_id");
  c.layer_is_moe.assign(size_t(c.n_layer), true);

  switch (c.arch) {
    case Arch::kQwen3Moe: {
      c.qk_norm = QkNorm::kPerHead;
      c.intermediate_size = f.integer("intermediate_size", 0);
      c.moe_intermediate_size = f.positive("moe_intermediate_size");
      c.n_expert = f.has("num_experts") ? f.positive("num_experts") : f.positive("num_local_experts");
      c.n_expert_used = f.positive("num_experts_per_tok");
      c.norm_topk_prob = f.boolean("norm_topk_prob", false);
      int64_t step = f.integer("decoder_sparse_step", 1);
      if (step <= 0) fail("{}: decoder_sparse_step must be positive", source);
      std::vector<int64_t> mlp_only = f.has("mlp_only_layers") ? int_list(j["mlp_only_layers"], source, "mlp_only_layers")
                                                              : std::vector<int64_t>{};
      for (int64_t l = 0; l < c.n_layer; ++l) c.layer_is_moe[size_t(l)] = (l + 1) % step == 0;
      for (int64_t l : mlp_only)
        if (l >= 0 && l < c.n_layer) c.layer_is_moe[size_t(l)] = false;
      break;
    }
    case Arch::kMixtral:
      c.intermediate_size = 0;
      c.moe_intermediate_size = f.positive("intermediate_size");
      c.n_expert = f.positive("num_local_experts");
      c.n_expert_used = f.positive("num_experts_per_tok");
      c.norm_topk_prob = true;
      break;
    case Arch::kOlmoe:
      c.qk_norm = QkNorm::kWhole;
      c.intermediate_size = 0;
      c.moe_intermediate_size = f.positive("intermediate_size");
      c.n_expert = f.positive("num_experts");
      c.n_expert_used = f.positive("num_experts_per_tok");
      c.norm_topk_prob = f.boolean("norm_topk_prob", false);
      c.clip_qkv = f.number("clip_qkv", 0.0);
      break;
    case Arch::kDeepseekV3: {
      c.mla = true;
      c.q_lora_rank = f.integer("q_lora_rank", 0);
      if (c.q_lora_rank < 0) fail("{}: q_lora_rank must be >= 0", source);
      c.kv_lora_rank = f.positive("kv_lora_rank");
      c.qk_nope_head_dim = f.positive("qk_nope_head_dim");
      c.qk_rope_head_dim = f.positive("qk_rope_head_dim");
      if (c.qk_rope_head_dim % 2) fail("{}: qk_rope_head_dim must be even", source);
      c.v_head_dim = f.positive("v_head_dim");
      c.rope_interleave = f.boolean("rope_interleave", true);
      c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
      c.n_head_kv = c.n_head;
      c.intermediate_size = f.positive("intermediate_size");
      c.moe_intermediate_size = f.positive("moe_intermediate_size");
      c.n_expert = f.positive("n_routed_experts");
      c.n_expert_used = f.positive("num_experts_per_tok");
      c.n_shared_expert = f.integer("n_shared_experts", 0);
      if (c.n_shared_expert < 0) fail("{}: n_shared_experts must be >= 0", source);
      c.norm_topk_prob = f.boolean("norm_topk_prob", true);
      c.routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
      c.n_group = f.integer("n_group", 1);
      c.topk_group = f.integer("topk_group", 1);
      if (c.n_group <= 0 || c.n_expert % c.n_group != 0)
        fail("{}: n_routed_experts ({}) must be a multiple of n_group ({})", source, c.n_expert, c.n_group);
      if (c.topk_group <= 0 || c.topk_group > c.n_group)
        fail("{}: topk_group ({}) must be in 1..n_group ({})", source, c.topk_group, c.n_group);
      if (c.n_expert_used > (c.n_expert / c.n_group) * c.topk_group)
        fail("{}: num_experts_per_tok ({}) exceeds the experts in topk_group groups", source, c.n_expert_used);
      if (f.has("scoring_func") && f.string("scoring_func") != "sigmoid")
        fail("{}: scoring_func '{}' is not supported for deepseek_v3 (supported: sigmoid)", source,
             f.string("scoring_func"));
      if (f.has("topk_method") && f.string("topk_method") != "noaux_tc")
        fail("{}: topk_method '{}' is not supported for deepseek_v3 (supported: noaux_tc)", source,
             f.string("topk_method"));
      c.router = RouterKind::kSigmoidGroupTopK;
      int64_t first_dense = f.integer("first_k_dense_replace", 0);
      int64_t freq = f.integer("moe_layer_freq", 1);
      if (freq <= 0) fail("{}: moe_layer_freq must be positive", source);
      for (int64_t l = 0; l < c.n_layer; ++l) c.layer_is_moe[size_t(l)] = l >= first_dense && l % freq == 0;
      break;
    }
  }
  if (c.head_dim <= 0)
    fail("{}: hidden_size ({}) is smaller than num_attention_heads ({}) and head_dim is not given", source,
         c.hidden_size, c.n_head);
  if (c.n_expert_used > c.n_expert)
    fail("{}: num_experts_per_tok ({}) exceeds the number of experts ({})", source, c.n_expert_used, c.n_expert);
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (!c.layer_is_moe[size_t(l)] && c.intermediate_size <= 0)
      fail("{}: layer {} is dense but intermediate_size is missing", source, l);
  // Guard the arithmetic downstream (buffers are sized from these). Sizes read with positive() are
  // bounded already; these are read as plain integers (0 when absent) or derived (MLA's head_dim is
  // the sum of two).
  for (int64_t v : {c.head_dim, c.intermediate_size, c.q_lora_rank})
    if (v > kDimensionLimit)
      fail("{}: a dimension ({}) exceeds the supported limit {}", source, v, kDimensionLimit);
  if (f.has("quantization_config")) c.quant = parse_quantization(f.raw("quantization_config"), source);
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::string file = path;
  if (file.size() < 5 || file.substr(file.size() - 5) != ".json") file = path + "/config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot open {}", file);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) fail("{}: malformed JSON", file);
  return parse_config(j, file);
}

}  // namespace tandem
