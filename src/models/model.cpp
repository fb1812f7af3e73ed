// Model loading and the binding blocks shared by the architectures (see model.h).
#include "models/model.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/fp8_weights.h"

namespace tandem {

std::unique_ptr<Model> Model::load(const std::string& dir, const ExpertFilter& filter) {
  ModelConfig cfg = load_config(dir);
  TensorStore store = TensorStore::open_dir(dir);
  return bind(std::move(cfg), std::move(store), dir, filter);
}

namespace {

// What the config implies, checked against the checkpoint's headers before anything is sized from it:
// a config whose num_hidden_layers or expert count describes a far larger model than the safetensors
// files hold fails here, at once, instead of allocating per-layer tables for it first. A lower bound:
// every layer has two norms, an attention and an MLP or router (4 tensors at least), every routed
// expert of a MoE layer 3, plus the embedding and the final norm.
void check_config_fits_store(const ModelConfig& c, const TensorStore& store, const std::string& dir) {
  const int64_t listed = int64_t(store.names().size());
  const int64_t implied = 2 + 4 * c.n_layer + 3 * c.n_expert * c.n_moe_layers();  // each factor <= 2^24
  if (implied > listed)
    fail("{}: config.json describes at least {} tensors (num_hidden_layers {}, {} routed experts in each of {} MoE "
         "layers), but the checkpoint's safetensors headers list {}: the config does not belong to these weights",
         dir, implied, c.n_layer, c.n_expert, c.n_moe_layers(), listed);
}

}  // namespace

std::unique_ptr<Model> Model::bind(ModelConfig cfg, TensorStore store, const std::string& dir,
                                   const ExpertFilter& filter) {
  check_config_fits_store(cfg, store, dir);
  auto m = std::make_unique<Model>();
  m->dir = dir;
  m->cfg = std::move(cfg);
  m->store = std::move(store);
  m->layers.resize(size_t(m->cfg.n_layer));
  bind_common(*m);
  switch (m->cfg.arch) {
    case Arch::kQwen3Moe: bind_qwen3_moe(*m, filter); break;
    case Arch::kMixtral: bind_mixtral(*m, filter); break;
    case Arch::kOlmoe: bind_olmoe(*m, filter); break;
    case Arch::kDeepseekV3: bind_deepseek_v3(*m, filter); break;
  }
  if (m->cfg.quant.at_load) quantize_experts_at_load(*m);
  return m;
}

void quantize_experts_at_load(Model& m) {
  const QuantConfig& q = m.cfg.quant;
  std::vector<TensorView*> todo;
  for (auto& L : m.layers)
    for (auto& e : L.experts)
      for (TensorView* v : {&e.gate, &e.up, &e.down})
        if (!v->empty() && dtype_is_float_weight(v->dtype)) todo.push_back(v);
  // One buffer per weight: codes, then the scale grid (4-byte aligned after the codes).
  std::vector<std::unique_ptr<uint8_t[]>> bufs(todo.size());
  global_pool().parallel_for(int64_t(todo.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      TensorView& v = *todo[size_t(i)];
      const int64_t rows = v.rows(), cols = v.cols();
      const int64_t grid_cols = (cols + q.block_cols - 1) / q.block_cols;
      const size_t codes = (size_t(rows * cols) + 63) / 64 * 64;
      const size_t scales = size_t((rows + q.block_rows - 1) / q.block_rows * grid_cols);
      bufs[size_t(i)].reset(new uint8_t[codes + scales * sizeof(float)]);
      uint8_t* p = bufs[size_t(i)].get();
      const std::vector<float> w = to_f32(v);
      float* s = reinterpret_cast<float*>(p + codes);
      quantize_fp8_blocks(w.data(), rows, cols, q.block_rows, q.block_cols, p, s);
      v.data = p;
      v.dtype = DType::kF8E4M3;
      v.scale = BlockScales{s, grid_cols, q.block_rows, q.block_cols, 0};
    }
  });
  for (auto& b : bufs) m.owned.push_back(std::move(b));
}

void bind_common(Model& m) {
  const auto& c = m.cfg;
  m.embed = m.store.require("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  m.final_norm = m.store.require("model.norm.weight", {c.hidden_size});
  if (c.tie_word_embeddings && !m.store.has("lm_head.weight"))
    m.lm_head = m.embed;
  else
    m.lm_head = m.store.require("lm_head.weight", {c.vocab_size, c.hidden_size});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto& L = m.layers[size_t(l)];
    std::string p = fmt::format("model.layers.{}.", l);
    L.attn_norm = m.store.require(p + "input_layernorm.weight", {c.hidden_size});
    L.ffn_norm = m.store.require(p + "post_attention_layernorm.weight", {c.hidden_size});
    L.moe = c.layer_is_moe[size_t(l)];
  }
}

TensorView bind_linear(const Model& m, const std::string& name, std::initializer_list<int64_t> shape) {
  return require_linear(m.store, m.cfg.quant, name, shape);
}

void bind_gqa_attention(Model& m, int64_t layer, const std::string& prefix) {
  const auto& c = m.cfg;
  auto& a = m.layers[size_t(layer)].attn;
  a.q = bind_linear(m, prefix + "q_proj.weight", {c.n_head * c.head_dim, c.hidden_size});
  a.k = bind_linear(m, prefix + "k_proj.weight", {c.n_head_kv * c.head_dim, c.hidden_size});
  a.v = bind_linear(m, prefix + "v_proj.weight", {c.n_head_kv * c.head_dim, c.hidden_size});
  a.o = bind_linear(m, prefix + "o_proj.weight", {c.hidden_size, c.n_head * c.head_dim});
}

ExpertWeights bind_mlp(const Model& m, const std::string& prefix, const char* gate, const char* up,
                       const char* down, int64_t inter) {
  const int64_t h = m.cfg.hidden_size;
  ExpertWeights e;
  e.gate = bind_linear(m, prefix + gate + ".weight", {inter, h});
  e.up = bind_linear(m, prefix + up + ".weight", {inter, h});
  e.down = bind_linear(m, prefix + down + ".weight", {h, inter});
  return e;
}

void bind_routed_experts(Model& m, int64_t layer, const std::string& prefix, const char* gate, const char* up,
                         const char* down, const ExpertFilter& filter) {
  auto& experts = m.layers[size_t(layer)].experts;
  experts.resize(size_t(m.cfg.n_expert));
  for (int64_t e = 0; e < m.cfg.n_expert; ++e)
    if (!filter || filter(layer, e))
      experts[size_t(e)] = bind_mlp(m, fmt::format("{}{}.", prefix, e), gate, up, down, m.cfg.moe_intermediate_size);
}

}  // namespace tandem
