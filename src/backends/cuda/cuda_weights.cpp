// Weight upload (see cuda_weights.cuh).
#include <algorithm>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_weights.h"

#include "core/error.h"
#include "moe/experts.h"

namespace tandem::cuda {

namespace {
// Expert slices start 16-byte aligned, so the kernels' 16-byte loads stay aligned.
size_t round16(size_t n) { return (n + 15) & ~size_t(15); }
}  // namespace

DeviceWeights::DeviceWeights(const Model& model, const std::vector<std::vector<int32_t>>& cold,
                             ColdPlacement placement, int64_t split_begin)
    : placement_(placement), split_begin_(split_begin) {
  const auto& c = model.cfg;
  embed = upload({&model.embed}, "model.embed_tokens.weight");
  lm_head = model.lm_head.data == model.embed.data ? embed : upload({&model.lm_head}, "lm_head.weight");
  final_norm = upload_f32(model.final_norm);
  layers.resize(size_t(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto& W = model.layers[size_t(l)];
    const auto& a = W.attn;
    auto& L = layers[size_t(l)];
    L.attn_norm = upload_f32(W.attn_norm);
    L.ffn_norm = upload_f32(W.ffn_norm);
    if (c.mla) {
      L.in_proj = c.q_lora_rank > 0 ? upload({&a.q_a, &a.kv_a}, "q_a_proj/kv_a_proj_with_mqa")
                                    : upload({&a.q, &a.kv_a}, "q_proj/kv_a_proj_with_mqa");
      if (c.q_lora_rank > 0) {
        L.q_b = upload({&a.q_b}, "q_b_proj");
        L.q_a_norm = upload_f32(a.q_a_norm);
      }
      L.kv_a_norm = upload_f32(a.kv_a_norm);
      L.kv_b = upload({&a.kv_b}, "kv_b_proj");
      L.uk_t = upload_uk_t(a.kv_b, int(c.n_head), int(c.qk_nope_head_dim), int(c.v_head_dim));
    } else {
      L.in_proj = upload({&a.q, &a.k, &a.v}, "q_proj/k_proj/v_proj");
      if (!a.q_norm.empty()) L.q_norm = upload_f32(a.q_norm);
      if (!a.k_norm.empty()) L.k_norm = upload_f32(a.k_norm);
    }
    L.o = upload({&a.o}, "o_proj");
    L.moe = W.moe;
    if (!W.moe) {
      L.experts = upload_experts({&W.dense}, {false}, 1, L, l);
      continue;
    }
    L.router = upload({&W.router}, "mlp.gate");
    if (!W.router_bias.empty()) L.router_bias = upload_f32(W.router_bias);
    std::vector<const ExpertWeights*> ex;
    std::vector<bool> is_cold(size_t(c.n_expert), false);
    for (int32_t e : l < int64_t(cold.size()) ? cold[size_t(l)] : std::vector<int32_t>{}) is_cold[size_t(e)] = true;
    for (const auto& e : W.experts) ex.push_back(&e);
    L.has_shared = W.shared.present();
    if (L.has_shared) {
      ex.push_back(&W.shared);
      is_cold.push_back(false);
    }
    L.experts = upload_experts(ex, is_cold, int(c.n_expert), L, l);
  }
}

DeviceMemory::~DeviceMemory() {
  for (void* p : dev_) cudaFree(p);
  for (void* p : host_) cudaFreeHost(p);
}

void* DeviceMemory::device(size_t bytes, std::string_view what) {
  dev_.reserve(dev_.size() + 1);  // the push below cannot throw once the memory is held
  void* p = device_alloc(bytes, std::string(what).c_str());
  dev_.push_back(p);
  return p;
}

void* DeviceMemory::host_mapped(size_t bytes, std::string_view what) {
  host_.reserve(host_.size() + 1);
  void* p = host_alloc(bytes, cudaHostAllocMapped, std::string(what).c_str());
  host_.push_back(p);
  return p;
}

PackedExperts pack_experts(DeviceMemory& mem, std::span<const ExpertPart> parts, int64_t layer) {
  PackedExperts out;
  const ExpertWeights* first = nullptr;
  for (const ExpertPart& part : parts)
    if (part.w && !first) first = part.w;
  auto end_of = [](const ExpertPart& part) { return part.end ? part.end : part.w->gate.rows(); };
  for (size_t i = 0; i < parts.size(); ++i) {
    const ExpertPart& part = parts[i];
    if (!part.w) continue;
    const ExpertWeights& e = *part.w;
    TANDEM_ASSERT(e.present(), "layer {} expert {} is not loaded", layer, i);
    const int64_t inter = e.gate.rows(), end = end_of(part);
    TANDEM_ASSERT(part.begin >= 0 && part.begin < end && end <= inter, "layer {} expert {}: bad features [{}, {}) of {}",
                  layer, i, part.begin, end, inter);
    for (const TensorView* v : {&e.gate, &e.up, &e.down}) {
      if (v->dtype != first->gate.dtype)
        fail("layer {} expert {}: dtype {} differs from the layer's {}", layer, i, dtype_name(v->dtype),
             dtype_name(first->gate.dtype));
      (part.host ? out.host_bytes : out.device_bytes) += round16(v->nbytes() / size_t(inter) * size_t(end - part.begin));
    }
  }
  char* dev_buf = static_cast<char*>(mem.device(out.device_bytes, "experts"));
  char* host_buf = nullptr;
  if (out.host_bytes > 0)
    host_buf = static_cast<char*>(mem.host_mapped(out.host_bytes, fmt::format("the cold experts of layer {}", layer)));
  std::vector<const void*> ptrs(3 * parts.size(), nullptr);
  std::vector<uint8_t> staging;
  for (size_t i = 0; i < parts.size(); ++i) {
    const ExpertPart& part = parts[i];
    if (!part.w) continue;
    ExpertWeights e = *part.w;
    const int64_t end = end_of(part);
    if (part.begin > 0 || end < e.gate.rows()) {  // a share of the features: gather it contiguous first
      staging.resize(sliced_bytes(*part.w, part.begin, end) + 64);
      uint8_t* p = staging.data() + (64 - reinterpret_cast<uintptr_t>(staging.data()) % 64) % 64;
      e = slice_expert(*part.w, part.begin, end, p);
    }
    const TensorView* views[3] = {&e.gate, &e.up, &e.down};
    for (size_t j = 0; j < 3; ++j) {
      const TensorView& v = *views[j];
      if (part.host) {
        std::memcpy(host_buf, v.data, v.nbytes());
        void* dp = nullptr;
        TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dp, host_buf, 0));
        ptrs[j * parts.size() + i] = dp;
        host_buf += round16(v.nbytes());
      } else {
        TANDEM_CUDA_CHECK(cudaMemcpy(dev_buf, v.data, v.nbytes(), cudaMemcpyHostToDevice));
        ptrs[j * parts.size() + i] = dev_buf;
        dev_buf += round16(v.nbytes());
      }
    }
  }
  if (!parts.empty() && parts.back().w) out.last_gate = ptrs[parts.size() - 1], out.last_host = parts.back().host;
  auto* table = static_cast<const void**>(mem.device(ptrs.size() * sizeof(void*), "expert table"));
  TANDEM_CUDA_CHECK(cudaMemcpy(table, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  out.gate = table;
  out.up = table + parts.size();
  out.down = table + 2 * parts.size();
  return out;
}

float* DeviceWeights::alloc_f32(size_t n) { return static_cast<float*>(mem_.device(n * 4, "scratch")); }

DMat DeviceWeights::upload(std::initializer_list<const TensorView*> parts, const char* what) {
  DMat m;
  const TensorView* first = *parts.begin();
  m.wt = wtype_of(first->dtype, what);
  m.cols = int(first->cols());
  size_t bytes = 0;
  for (const TensorView* p : parts) {
    if (p->dtype != first->dtype)
      fail("{}: the fused tensors differ in dtype ({} vs {})", what, dtype_name(p->dtype), dtype_name(first->dtype));
    TANDEM_ASSERT(p->cols() == m.cols, "{}: fused tensors differ in width", what);
    m.rows += int(p->rows());
    bytes += p->nbytes();
  }
  char* d = static_cast<char*>(mem_.device(bytes, what));
  m.p = d;
  for (const TensorView* p : parts) {
    TANDEM_CUDA_CHECK(cudaMemcpy(d, p->data, p->nbytes(), cudaMemcpyHostToDevice));
    d += p->nbytes();
  }
  return m;
}

DMat DeviceWeights::upload_uk_t(const TensorView& kv_b, int n_head, int nope, int v_dim) {
  DMat m;
  m.wt = wtype_of(kv_b.dtype, "kv_b_proj");
  const int lora = int(kv_b.cols());
  TANDEM_ASSERT(kv_b.rows() == int64_t(n_head) * (nope + v_dim), "kv_b_proj: {} rows for {} heads", kv_b.rows(), n_head);
  const size_t es = wtype_size(m.wt);
  m.rows = n_head * lora;
  m.cols = nope;
  // Head h's W_uk is rows [h·(nope + v), h·(nope + v) + nope) of kv_b: [nope, lora]; stored [lora, nope].
  std::vector<char> t(size_t(m.rows) * size_t(nope) * es);
  const char* src = static_cast<const char*>(kv_b.data);
  for (int h = 0; h < n_head; ++h)
    for (int d = 0; d < nope; ++d) {
      const char* row = src + (size_t(h) * size_t(nope + v_dim) + size_t(d)) * size_t(lora) * es;
      for (int c = 0; c < lora; ++c)
        std::memcpy(&t[((size_t(h) * size_t(lora) + size_t(c)) * size_t(nope) + size_t(d)) * es], row + size_t(c) * es, es);
    }
  void* d = mem_.device(t.size(), "kv_b_proj (W_uk transposed)");
  TANDEM_CUDA_CHECK(cudaMemcpy(d, t.data(), t.size(), cudaMemcpyHostToDevice));
  m.p = d;
  return m;
}

const float* DeviceWeights::upload_f32(const TensorView& v) {
  std::vector<float> f = to_f32(v);
  float* d = alloc_f32(f.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

ExpertTable DeviceWeights::upload_experts(const std::vector<const ExpertWeights*>& experts,
                                          const std::vector<bool>& cold, int n_routed, DLayer& L, int64_t layer) {
  ExpertTable t;
  const ExpertWeights& e0 = *experts[0];
  t.wt = wtype_of(e0.gate.dtype, "expert weights");
  t.hidden = int(e0.gate.cols());
  t.n_routed = n_routed;
  t.inter = int(e0.gate.rows());
  t.shared_inter = int(experts.back()->gate.rows());
  const bool split = placement_ == ColdPlacement::kSplit;
  if (split && !(split_begin_ > 0 && split_begin_ < t.inter))
    fail("layer {}: split column {} is outside the experts' {} features", layer, split_begin_, t.inter);
  std::vector<ExpertPart> parts(experts.size());
  std::vector<int32_t> inter_of(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    parts[i].w = experts[i];
    inter_of[i] = int32_t(experts[i]->gate.rows());
    if (!cold[i]) continue;
    switch (placement_) {
      case ColdPlacement::kHost: parts[i].host = true; break;
      case ColdPlacement::kNone: parts[i].w = nullptr; break;  // the peer computes it
      case ColdPlacement::kSplit:  // the GPU's share: features [0, split_begin)
        parts[i].host = true;
        parts[i].end = split_begin_;
        inter_of[i] = int32_t(split_begin_);
        break;
    }
  }
  const PackedExperts packed = pack_experts(mem_, parts, layer);
  t.gate = packed.gate;
  t.up = packed.up;
  t.down = packed.down;
  if (split) {
    auto* d_inter = static_cast<int32_t*>(mem_.device(inter_of.size() * sizeof(int32_t), "expert sizes"));
    TANDEM_CUDA_CHECK(cudaMemcpy(d_inter, inter_of.data(), inter_of.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    t.inter_of = d_inter;
  }
  size_t shared_bytes = 0;
  if (L.has_shared)
    for (const TensorView* v : {&experts.back()->gate, &experts.back()->up, &experts.back()->down})
      shared_bytes += round16(v->nbytes());
  if (L.has_shared && !packed.last_host) L.shared_expert = packed.last_gate, L.shared_expert_bytes = shared_bytes;
  L.hot_bytes = packed.device_bytes - shared_bytes;
  L.cold_bytes = packed.host_bytes;
  return t;
}

}  // namespace tandem::cuda
