// Synthetic checkpoints (see synth.h). The tensor list follows each architecture's hub names (the
// same names models/<arch>.cpp binds), so a synthetic folder loads through the ordinary path.
#include "models/synth.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <filesystem>
#include <fstream>

#include "core/thread_pool.h"
#include "io/config.h"
#include "io/fp8_weights.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

namespace tandem {

namespace {

using json = nlohmann::json;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Approximately normal: the sum of four uniforms, rescaled to unit variance (Irwin–Hall).
inline float normalish(uint64_t& s) {
  uint64_t a = splitmix(s), b = splitmix(s);
  float u = float(a & 0xffffffffu) + float(a >> 32) + float(b & 0xffffffffu) + float(b >> 32);
  return (u * (1.0f / 4294967296.0f) - 2.0f) * 1.7320508f;
}

enum class Init { kNormal, kNorm, kBias };

struct Planned {
  std::string name;
  Shape shape;
  Init init;
  float scale;  // std of the normal part
  bool fp8 = false;  // stored as F8_E4M3 + block scales when the config asks for FP8
};

// A projection of attention, a dense MLP or an expert: FP8 in an FP8 model (as in DeepSeek's and Qwen's
// releases, where lm_head and the router stay bf16: those go through add_dense).
void add_linear(std::vector<Planned>& out, const std::string& name, int64_t rows, int64_t cols) {
  out.push_back({name, Shape{rows, cols}, Init::kNormal, float(1.0 / std::sqrt(double(cols))), true});
}
void add_dense(std::vector<Planned>& out, const std::string& name, int64_t rows, int64_t cols) {
  out.push_back({name, Shape{rows, cols}, Init::kNormal, float(1.0 / std::sqrt(double(cols))), false});
}
void add_norm(std::vector<Planned>& out, const std::string& name, int64_t n) {
  out.push_back({name, Shape{n}, Init::kNorm, 0.01f});
}
void add_mlp(std::vector<Planned>& out, const std::string& p, const char* gate, const char* up, const char* down,
             int64_t hidden, int64_t inter) {
  add_linear(out, p + gate + ".weight", inter, hidden);
  add_linear(out, p + up + ".weight", inter, hidden);
  add_linear(out, p + down + ".weight", hidden, inter);
}

std::vector<Planned> plan_tensors(const ModelConfig& c, double router_skew) {
  std::vector<Planned> t;
  const int64_t H = c.hidden_size;
  t.push_back({"model.embed_tokens.weight", Shape{c.vocab_size, H}, Init::kNormal, 1.0f});
  add_norm(t, "model.norm.weight", H);
  if (!c.tie_word_embeddings) add_dense(t, "lm_head.weight", c.vocab_size, H);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add_norm(t, p + "input_layernorm.weight", H);
    add_norm(t, p + "post_attention_layernorm.weight", H);
    const std::string s = p + "self_attn.";
    if (c.mla) {
      const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (c.q_lora_rank > 0) {
        add_linear(t, s + "q_a_proj.weight", c.q_lora_rank, H);
        add_norm(t, s + "q_a_layernorm.weight", c.q_lora_rank);
        add_linear(t, s + "q_b_proj.weight", c.n_head * qk, c.q_lora_rank);
      } else {
        add_linear(t, s + "q_proj.weight", c.n_head * qk, H);
      }
      add_linear(t, s + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, H);
      add_norm(t, s + "kv_a_layernorm.weight", c.kv_lora_rank);
      add_linear(t, s + "kv_b_proj.weight", c.n_head * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
      add_linear(t, s + "o_proj.weight", H, c.n_head * c.v_head_dim);
    } else {
      add_linear(t, s + "q_proj.weight", c.n_head * c.head_dim, H);
      add_linear(t, s + "k_proj.weight", c.n_head_kv * c.head_dim, H);
      add_linear(t, s + "v_proj.weight", c.n_head_kv * c.head_dim, H);
      add_linear(t, s + "o_proj.weight", H, c.n_head * c.head_dim);
      switch (c.qk_norm) {
        case QkNorm::kNone: break;
        case QkNorm::kPerHead:
          add_norm(t, s + "q_norm.weight", c.head_dim);
          add_norm(t, s + "k_norm.weight", c.head_dim);
          break;
        case QkNorm::kWhole:
          add_norm(t, s + "q_norm.weight", c.n_head * c.head_dim);
          add_norm(t, s + "k_norm.weight", c.n_head_kv * c.head_dim);
          break;
      }
    }
    if (!c.layer_is_moe[size_t(l)]) {
      add_mlp(t, p + "mlp.", "gate_proj", "up_proj", "down_proj", H, c.intermediate_size);
      continue;
    }
    const bool mixtral = c.arch == Arch::kMixtral;
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    add_dense(t, moe + "gate.weight", c.n_expert, H);
    if (c.router == RouterKind::kSigmoidGroupTopK)
      t.push_back({moe + "gate.e_score_correction_bias", Shape{c.n_expert}, Init::kBias,
                   router_skew > 0 ? float(router_skew) : 0.01f});
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const std::string ep = fmt::format("{}experts.{}.", moe, e);
      if (mixtral)
        add_mlp(t, ep, "w1", "w3", "w2", H, c.moe_intermediate_size);
      else
        add_mlp(t, ep, "gate_proj", "up_proj", "down_proj", H, c.moe_intermediate_size);
    }
    if (c.n_shared_expert > 0)
      add_mlp(t, p + "mlp.shared_experts.", "gate_proj", "up_proj", "down_proj", H, c.shared_intermediate_size());
  }
  return t;
}

json preset(const std::string& name);

}  // namespace

json with_fp8_weights(json config) {
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {128, 128}}};
  return config;
}

namespace {

json preset(const std::string& name) {
  auto base_ds = [](json extra) {
    json j = {{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"hidden_act", "silu"},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"rope_interleave", true},
              {"tie_word_embeddings", false},
              {"norm_topk_prob", true},
              {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", "bfloat16"}};
    j.update(extra);
    return j;
  };
  if (name == "tiny")
    return base_ds({{"vocab_size", 512}, {"hidden_size", 64}, {"num_hidden_layers", 4}, {"first_k_dense_replace", 1},
                    {"intermediate_size", 128}, {"n_routed_experts", 32}, {"n_shared_experts", 1},
                    {"num_experts_per_tok", 4}, {"moe_intermediate_size", 32}, {"n_group", 4}, {"topk_group", 2},
                    {"routed_scaling_factor", 2.5}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                    {"q_lora_rank", 48}, {"kv_lora_rank", 32}, {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8},
                    {"v_head_dim", 16}, {"max_position_embeddings", 2048}});
  if (name == "flash-mini-fp8") return with_fp8_weights(preset("flash-mini"));
  if (name == "flash-mini")
    return base_ds({{"vocab_size", 16384}, {"hidden_size", 2048}, {"num_hidden_layers", 16},
                    {"first_k_dense_replace", 1}, {"intermediate_size", 5632}, {"n_routed_experts", 384},
                    {"n_shared_experts", 1}, {"num_experts_per_tok", 6}, {"moe_intermediate_size", 512},
                    {"n_group", 8}, {"topk_group", 4}, {"routed_scaling_factor", 2.5}, {"num_attention_heads", 16},
                    {"num_key_value_heads", 16}, {"q_lora_rank", 768}, {"kv_lora_rank", 512},
                    {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
                    {"max_position_embeddings", 8192}});
  if (name == "mid")
    return {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", 16384},
            {"hidden_size", 1024}, {"num_hidden_layers", 12}, {"num_attention_heads", 16},
            {"num_key_value_heads", 4}, {"head_dim", 64}, {"intermediate_size", 2816},
            {"moe_intermediate_size", 384}, {"num_experts", 64}, {"num_experts_per_tok", 6},
            {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()},
            {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"max_position_embeddings", 8192},
            {"tie_word_embeddings", false}, {"eos_token_id", 2}, {"torch_dtype", "bfloat16"}};
  if (name == "tiny-qwen3")
    return {{"model_type", "qwen3_moe"}, {"vocab_size", 512}, {"hidden_size", 64}, {"num_hidden_layers", 3},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 96},
            {"moe_intermediate_size", 32}, {"num_experts", 16}, {"num_experts_per_tok", 4},
            {"norm_topk_prob", true}, {"mlp_only_layers", {1}}, {"rope_theta", 1000000.0},
            {"max_position_embeddings", 2048}, {"eos_token_id", 2}};
  if (name == "tiny-mixtral")
    return {{"model_type", "mixtral"}, {"vocab_size", 512}, {"hidden_size", 64}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
            {"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"rope_theta", 1000000.0},
            {"max_position_embeddings", 2048}, {"eos_token_id", 2}, {"tie_word_embeddings", true}};
  if (name == "tiny-olmoe")
    return {{"model_type", "olmoe"}, {"vocab_size", 512}, {"hidden_size", 64}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 4}, {"intermediate_size", 32},
            {"num_experts", 16}, {"num_experts_per_tok", 4}, {"norm_topk_prob", false}, {"rope_theta", 10000.0},
            {"max_position_embeddings", 2048}, {"eos_token_id", 2}};
  std::string names;
  for (const auto& [n, d] : synth_presets()) names += (names.empty() ? "" : ", ") + n;
  fail("unknown preset '{}' (known: {})", name, names);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> synth_presets() {
  return {{"tiny", "deepseek_v3, hidden 64, 4 layers (1 dense), 32 experts top-4 + 1 shared: tests and the demo"},
          {"tiny-qwen3", "qwen3_moe, hidden 64, 3 layers (layer 1 dense), 16 experts top-4"},
          {"tiny-mixtral", "mixtral, hidden 64, 2 layers, 8 experts top-2, tied embeddings"},
          {"tiny-olmoe", "olmoe, hidden 64, 2 layers, 16 experts top-4"},
          {"mid", "qwen3_moe, hidden 1024, 12 layers, 64 experts top-6 (about 1.0 B parameters): CPU benchmarks"},
          {"flash-mini", "deepseek_v3, hidden 2048, 16 layers (1 dense), 384 experts top-6 + 1 shared "
                         "(about 19 B parameters, 36 GB of experts): the GPU benchmark model"},
          {"flash-mini-fp8", "flash-mini with its attention, MLP and expert weights in block-scaled FP8 "
                             "(18 GB of experts): the FP8 benchmark model"}};
}

json synth_preset_config(const std::string& name) { return preset(name); }

uint64_t write_synthetic_model(const json& config, const std::string& dir, const SynthOptions& options) {
  ModelConfig c = parse_config(config, "synthetic config");
  if (options.router_skew < 0) fail("--router-skew must be >= 0");
  if (options.router_skew > 0 && c.router != RouterKind::kSigmoidGroupTopK)
    fail("--router-skew needs a router with a correction bias (deepseek_v3); {} has none", c.model_type);
  std::filesystem::create_directories(dir);
  // Tokenizer: the given one, or byte-level; ids past it up to the model's vocab are reserved specials.
  json tok;
  if (!options.tokenizer_path.empty()) {
    Tokenizer loaded = Tokenizer::load(options.tokenizer_path);  // validates it
    if (loaded.vocab_size() > c.vocab_size)
      fail("tokenizer {} has {} tokens, more than the model's vocab_size {}", options.tokenizer_path,
           loaded.vocab_size(), c.vocab_size);
    std::ifstream in(std::filesystem::is_directory(options.tokenizer_path) ? options.tokenizer_path + "/tokenizer.json"
                                                                           : options.tokenizer_path);
    tok = json::parse(in);
  } else {
    tok = make_byte_level_tokenizer({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  }
  int64_t have = Tokenizer::from_json(tok, "synthetic tokenizer").vocab_size();
  if (have > c.vocab_size) fail("the byte-level tokenizer needs vocab_size >= {}", have);
  for (int64_t id = have; id < c.vocab_size; ++id)
    tok["added_tokens"].push_back({{"id", id}, {"content", fmt::format("<|reserved_{}|>", id)}, {"single_word", false},
                                   {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});

  const auto planned = plan_tensors(c, options.router_skew);
  const QuantConfig& q = c.quant;  // FP8 model: its linears quantized from the bf16 values of this seed
  auto is_fp8 = [&](const Planned& p) { return q.fp8 && p.fp8; };
  auto grid = [&](const Planned& p) {
    return Shape{(p.shape[0] + q.block_rows - 1) / q.block_rows, (p.shape[1] + q.block_cols - 1) / q.block_cols};
  };
  uint64_t total = 0;
  for (const auto& p : planned)
    total += is_fp8(p) ? uint64_t(p.shape.numel()) + uint64_t(grid(p).numel()) * 4 : uint64_t(p.shape.numel()) * 2;
  std::vector<TensorSpec> specs;
  ThreadPool& pool = global_pool();
  uint64_t written = 0;
  auto progress = [&](size_t nbytes) {
    uint64_t before = written;
    written += nbytes;
    if (options.progress && (written / 1000000000u != before / 1000000000u || written == total))
      spdlog::info("synth: {:.1f} / {:.1f} GB", double(written) / 1e9, double(total) / 1e9);
  };
  // The bf16 values of tensor p (n elements), the same for a BF16 and an FP8 model of one seed.
  auto values = [&](const Planned& p, uint16_t* out, int64_t n) {
    const uint64_t base = hash_name(options.seed, p.name);
    constexpr int64_t kChunk = 1 << 16;
    pool.parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        uint64_t st = base ^ (uint64_t(ch) * 0xd1b54a32d192ed03ull);
        for (int64_t i = ch * kChunk; i < std::min(n, (ch + 1) * kChunk); ++i) {
          float v = normalish(st) * p.scale;
          if (p.init == Init::kNorm) v += 1.0f;
          out[i] = f32_to_bf16(v);
        }
      }
    });
  };
  // Scales computed with their weight, written by the next tensor's fill (the writer fills in order).
  auto pending_scales = std::make_shared<std::vector<float>>();
  for (const auto& p : planned) {
    TensorSpec s;
    s.name = p.name;
    s.shape = p.shape;
    if (!is_fp8(p)) {
      s.dtype = DType::kBF16;
      s.fill = [&, p](uint8_t* dst, size_t nbytes) {
        values(p, reinterpret_cast<uint16_t*>(dst), int64_t(nbytes / 2));
        progress(nbytes);
      };
      specs.push_back(std::move(s));
      continue;
    }
    const Shape g = grid(p);
    s.dtype = DType::kF8E4M3;
    s.fill = [&, p, g, pending_scales](uint8_t* dst, size_t nbytes) {
      const int64_t rows = p.shape[0], cols = p.shape[1];
      std::vector<uint16_t> bf(nbytes);
      values(p, bf.data(), int64_t(nbytes));
      std::vector<float> w(nbytes);
      for (size_t i = 0; i < nbytes; ++i) w[i] = bf16_to_f32(bf[i]);
      pending_scales->assign(size_t(g.numel()), 0.0f);
      pool.parallel_for(g[0], 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t r0 = b * q.block_rows, r1 = std::min(rows, r0 + q.block_rows);
          quantize_fp8_blocks(w.data() + r0 * cols, r1 - r0, cols, q.block_rows, q.block_cols, dst + r0 * cols,
                              pending_scales->data() + b * g[1]);
        }
      });
      progress(nbytes);
    };
    specs.push_back(std::move(s));
    TensorSpec scale;
    scale.name = p.name + std::string(kFp8ScaleSuffix);
    scale.dtype = DType::kF32;
    scale.shape = g;
    scale.fill = [&, pending_scales, name = scale.name](uint8_t* dst, size_t nbytes) {
      TANDEM_ASSERT(pending_scales->size() * 4 == nbytes, "scales of {} not computed before they are written", name);
      std::memcpy(dst, pending_scales->data(), nbytes);
      progress(nbytes);
    };
    specs.push_back(std::move(scale));
  }
  write_safetensors(dir + "/model.safetensors", specs);
  // The small files last: a folder with a config.json holds finished weights (a write that fails,
  // e.g. for want of disk, leaves an earlier model there whole, or no model).
  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream f(dir + "/" + name);
    if (!(f << text << "\n")) fail("cannot write {}/{}", dir, name);
  };
  write_text("tokenizer.json", tok.dump());
  write_text("config.json", config.dump(2));
  return total;
}

}  // namespace tandem
