// The CPU forward pass (see engine.h). Shapes: n = rows in this step (all sequences' new tokens),
// H = hidden size. Activations are f32; weights are read in their checkpoint dtype.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"
#include "moe/router.h"

namespace tandem {

namespace {

template <class Load>
inline float dot_typed(const float* x, int64_t n, Load load) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * load(i);
  return acc;
}

// Σ x[i] · w[offset + i] for a weight view of any linear-weight dtype (F8_E4M3: within one row).
float dot_w(const float* x, const TensorView& w, int64_t offset, int64_t n) {
  switch (w.dtype) {
    case DType::kF32: {
      const float* p = w.as<float>() + offset;
      return dot_typed(x, n, [p](int64_t i) { return p[i]; });
    }
    case DType::kBF16: {
      const uint16_t* p = w.as<uint16_t>() + offset;
      return dot_typed(x, n, [p](int64_t i) { return bf16_to_f32(p[i]); });
    }
    case DType::kF16: {
      const uint16_t* p = w.as<uint16_t>() + offset;
      return dot_typed(x, n, [p](int64_t i) { return f16_to_f32(p[i]); });
    }
    case DType::kF8E4M3: {  // dequantized per element, as the matmul reference does
      const uint8_t* p = w.as<uint8_t>() + offset;
      const int64_t row = offset / w.cols(), col = offset % w.cols();
      return dot_typed(x, n, [&](int64_t i) { return fp8_e4m3_to_f32(p[i]) * w.scale.at(row, col + i); });
    }
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32: case DType::kI64:
    case DType::kBool:
      break;
  }
  TANDEM_ASSERT(false, "weight dtype {}", dtype_name(w.dtype));
}

// y[i] += a · w[offset + i] (within one row of w when it is F8_E4M3).
void axpy_w(float a, const TensorView& w, int64_t offset, int64_t n, float* y) {
  switch (w.dtype) {
    case DType::kF32: {
      const float* p = w.as<float>() + offset;
      for (int64_t i = 0; i < n; ++i) y[i] += a * p[i];
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = w.as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) y[i] += a * bf16_to_f32(p[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = w.as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) y[i] += a * f16_to_f32(p[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = w.as<uint8_t>() + offset;
      const int64_t row = offset / w.cols(), col = offset % w.cols();
      for (int64_t i = 0; i < n; ++i) y[i] += a * (fp8_e4m3_to_f32(p[i]) * w.scale.at(row, col + i));
      return;
    }
    case DType::kF64: case DType::kI8: case DType::kU8: case DType::kI16: case DType::kI32: case DType::kI64:
    case DType::kBool:
      break;
  }
  TANDEM_ASSERT(false, "weight dtype {}", dtype_name(w.dtype));
}

void softmax(float* s, int64_t n) {
  float mx = *std::max_element(s, s + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - mx));
  float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) s[i] *= inv;
}

// KV rows as stored: f32, or bf16 bit patterns widened on read (exact).
inline float kv_at(const float* p, int64_t i) { return p[i]; }
inline float kv_at(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }

// Σ q[i] · k[i] in index order (for f32 storage, the arithmetic of the unpaged cache it replaced).
template <class S>
inline float dot_kv(const float* q, const S* k, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += q[i] * kv_at(k, i);
  return acc;
}

// o[i] += a · v[i].
template <class S>
inline void axpy_kv(float a, const S* v, int64_t n, float* o) {
  for (int64_t i = 0; i < n; ++i) o[i] += a * kv_at(v, i);
}

thread_local std::vector<float> t_scratch;
float* scratch(size_t n) {
  if (t_scratch.size() < n) t_scratch.resize(n);
  return t_scratch.data();
}

}  // namespace

KvCacheFull::KvCacheFull(int64_t needed, int64_t free, int64_t total, int64_t block_tokens)
    : InputError(fmt::format("KV cache full: this step needs {} more blocks of {} tokens, {} of the pool's {} are free",
                             needed, block_tokens, free, total)),
      blocks_needed(needed),
      blocks_free(free) {}

CpuEngine::CpuEngine(const Model& model, EngineOptions options, ExpertExecutor* experts, ThreadPool* pool)
    : model_(model),
      options_(options),
      local_experts_(model, pool ? *pool : global_pool()),
      experts_(experts ? experts : &local_experts_),
      pool_(pool ? *pool : global_pool()),
      kv_(kv_cache_shape(model.cfg), options.kv_block, options.kv_tokens, options.kv_dtype, std::max<int64_t>(1, options.max_seqs)) {
  const auto& c = model_.cfg;
  if (options_.max_seqs < 1) fail("max sequences must be at least 1, got {}", options_.max_seqs);
  if (options_.max_ctx <= 0) options_.max_ctx = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  rope_ = Rope(c, c.mla ? c.qk_rope_head_dim : c.head_dim);
  seqs_.resize(size_t(options_.max_seqs));
}

int CpuEngine::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i].live) continue;
    seqs_[i].live = true;
    seqs_[i].len = 0;
    return int(i);
  }
  fail("all {} sequence slots are in use", seqs_.size());
}

void CpuEngine::remove_sequence(int seq) {
  TANDEM_ASSERT(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].live, "bad sequence {}", seq);
  seqs_[size_t(seq)].live = false;
  seqs_[size_t(seq)].len = 0;
  kv_.trim(seq, 0);
}

int64_t CpuEngine::seq_len(int seq) const { return seqs_[size_t(seq)].len; }

KvUsage CpuEngine::kv_usage() const {
  return {kv_.block_tokens(), kv_.fixed() ? kv_.blocks_total() : 0, kv_.blocks_used()};
}

const std::vector<float>& CpuEngine::forward(std::span<const Item> items, bool all_logits) {
  const auto& c = model_.cfg;
  // Validate everything before touching any state.
  std::vector<bool> seen(seqs_.size(), false);
  for (const auto& it : items) {
    if (it.seq < 0 || size_t(it.seq) >= seqs_.size() || !seqs_[size_t(it.seq)].live)
      fail("sequence {} is not live", it.seq);
    if (seen[size_t(it.seq)]) fail("sequence {} appears twice in one batch", it.seq);
    seen[size_t(it.seq)] = true;
    if (it.tokens.empty()) fail("sequence {}: empty token run", it.seq);
    for (int32_t t : it.tokens)
      if (t < 0 || t >= c.vocab_size) fail("token id {} out of range [0, {})", t, c.vocab_size);
    const auto& s = seqs_[size_t(it.seq)];
    if (s.len + int64_t(it.tokens.size()) > options_.max_ctx)
      fail("sequence {}: {} tokens exceed the context limit of {}", it.seq, s.len + int64_t(it.tokens.size()),
           options_.max_ctx);
  }
  int64_t blocks_needed = 0;
  for (const auto& it : items)
    blocks_needed += kv_.blocks_needed(it.seq, seqs_[size_t(it.seq)].len + int64_t(it.tokens.size()));
  if (blocks_needed > kv_.blocks_free())
    throw KvCacheFull(blocks_needed, kv_.blocks_free(), kv_.blocks_total(), kv_.block_tokens());
  // From here on a failure (an expert lane, an allocation) returns the blocks this step took.
  try {
    for (const auto& it : items) {
      const bool ok = kv_.reserve(it.seq, seqs_[size_t(it.seq)].len + int64_t(it.tokens.size()));
      TANDEM_ASSERT(ok, "KV reserve failed after the free-block check");
    }
    run_layers(items);
  } catch (...) {
    for (const auto& it : items) kv_.trim(it.seq, seqs_[size_t(it.seq)].len);
    throw;
  }
  for (const auto& it : items) seqs_[size_t(it.seq)].len += int64_t(it.tokens.size());
  return compute_logits(items, all_logits);
}

void CpuEngine::run_layers(std::span<const Item> items) {
  const auto& c = model_.cfg;
  const int64_t H = c.hidden_size;
  int64_t n = 0;
  for (const auto& it : items) n += int64_t(it.tokens.size());
  n_rows_ = n;
  row_seq_.resize(size_t(n));
  row_pos_.resize(size_t(n));
  x_.resize(size_t(n * H));
  {
    int64_t r = 0;
    for (const auto& it : items) {
      const auto& s = seqs_[size_t(it.seq)];
      for (size_t i = 0; i < it.tokens.size(); ++i, ++r) {
        row_seq_[size_t(r)] = it.seq;
        row_pos_[size_t(r)] = s.len + int64_t(i);
        cpu::embedding_row(model_.embed, it.tokens[i], x_.data() + r * H);
      }
    }
  }
  h_.resize(size_t(n * H));
  tmp_.resize(size_t(n * H));
  ffn_.resize(size_t(n * H));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto& L = model_.layers[size_t(l)];
    cpu::rms_norm(x_.data(), n, H, L.attn_norm, c.rms_norm_eps, h_.data());
    if (c.mla)
      attention_mla(l, h_.data(), tmp_.data());
    else
      attention_gqa(l, h_.data(), tmp_.data());
    for (int64_t i = 0; i < n * H; ++i) x_[size_t(i)] += tmp_[size_t(i)];
    cpu::rms_norm(x_.data(), n, H, L.ffn_norm, c.rms_norm_eps, h_.data());
    if (L.moe)
      moe_block(l, h_.data(), ffn_.data());
    else
      run_mlp_cpu(L.dense, h_.data(), n, H, ffn_.data(), pool_);
    for (int64_t i = 0; i < n * H; ++i) x_[size_t(i)] += ffn_[size_t(i)];
  }
}

const std::vector<float>& CpuEngine::compute_logits(std::span<const Item> items, bool all_logits) {
  const auto& c = model_.cfg;
  const int64_t H = c.hidden_size, n = n_rows_;
  // Logits for the wanted rows.
  std::vector<int64_t> want;
  if (all_logits) {
    for (int64_t r = 0; r < n; ++r) want.push_back(r);
  } else {
    int64_t r = 0;
    for (const auto& it : items) {
      r += int64_t(it.tokens.size());
      want.push_back(r - 1);
    }
  }
  const int64_t nw = int64_t(want.size());
  for (int64_t i = 0; i < nw; ++i)
    cpu::rms_norm(x_.data() + want[size_t(i)] * H, 1, H, model_.final_norm, c.rms_norm_eps, h_.data() + i * H);
  logits_.resize(size_t(nw * c.vocab_size));
  cpu::matmul(h_.data(), nw, model_.lm_head, logits_.data(), pool_);
  return logits_;
}

// The attention of each (row, head) over its sequence's cached rows 0..pos, block by block: the block
// table is read once per block of block_tokens rows, the rows inside a block are contiguous.
template <class S>
void CpuEngine::attend_gqa(int64_t layer) {
  const auto& c = model_.cfg;
  const int64_t n = n_rows_, nh = c.n_head, nkv = c.n_head_kv, hd = c.head_dim;
  const int64_t qw = nh * hd, kvw = nkv * hd, group = nh / nkv, B = kv_.block_tokens();
  const float scale = float(c.attn_scale());
  pool_.parallel_for(n * nh, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / nh, head = i % nh, g = head / group;
      const int seq = row_seq_[size_t(r)];
      const int64_t T = row_pos_[size_t(r)] + 1;
      float* s = scratch(size_t(T));
      const float* qh = q_.data() + r * qw + head * hd;
      for (int64_t b = 0, t0 = 0; t0 < T; ++b, t0 += B) {
        const S* kb = kv_.k_block<S>(seq, layer, b) + g * hd;  // [B, kvw], this group's columns
        const int64_t m = std::min(B, T - t0);
        for (int64_t j = 0; j < m; ++j) s[t0 + j] = dot_kv(qh, kb + j * kvw, hd) * scale;
      }
      softmax(s, T);
      float* o = att_.data() + r * qw + head * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t b = 0, t0 = 0; t0 < T; ++b, t0 += B) {
        const S* vb = kv_.v_block<S>(seq, layer, b) + g * hd;  // [B, kvw]
        const int64_t m = std::min(B, T - t0);
        for (int64_t j = 0; j < m; ++j) axpy_kv(s[t0 + j], vb + j * kvw, hd, o);
      }
    }
  });
}

void CpuEngine::attention_gqa(int64_t layer, const float* h, float* out) {
  const auto& c = model_.cfg;
  const auto& a = model_.layers[size_t(layer)].attn;
  const int64_t n = n_rows_, nh = c.n_head, nkv = c.n_head_kv, hd = c.head_dim;
  const int64_t qw = nh * hd, kvw = nkv * hd;
  q_.resize(size_t(n * qw));
  kv_rows_.resize(size_t(n * 2 * kvw));
  float* k = kv_rows_.data();            // [n, kvw]
  float* v = kv_rows_.data() + n * kvw;  // [n, kvw]
  cpu::matmul(h, n, a.q, q_.data(), pool_);
  cpu::matmul(h, n, a.k, k, pool_);
  cpu::matmul(h, n, a.v, v, pool_);
  if (c.clip_qkv > 0) {
    const float lim = float(c.clip_qkv);
    for (auto* p : {&q_}) std::transform(p->begin(), p->end(), p->begin(), [lim](float f) { return std::clamp(f, -lim, lim); });
    std::transform(kv_rows_.begin(), kv_rows_.end(), kv_rows_.begin(), [lim](float f) { return std::clamp(f, -lim, lim); });
  }
  switch (c.qk_norm) {
    case QkNorm::kNone: break;
    case QkNorm::kPerHead:
      cpu::rms_norm(q_.data(), n * nh, hd, a.q_norm, c.rms_norm_eps, q_.data());
      cpu::rms_norm(k, n * nkv, hd, a.k_norm, c.rms_norm_eps, k);
      break;
    case QkNorm::kWhole:
      cpu::rms_norm(q_.data(), n, qw, a.q_norm, c.rms_norm_eps, q_.data());
      cpu::rms_norm(k, n, kvw, a.k_norm, c.rms_norm_eps, k);
      break;
  }
  for (int64_t r = 0; r < n; ++r) {
    rope_.apply(q_.data() + r * qw, nh, row_pos_[size_t(r)], false);
    rope_.apply(k + r * kvw, nkv, row_pos_[size_t(r)], false);
    kv_.write(row_seq_[size_t(r)], layer, row_pos_[size_t(r)], k + r * kvw, v + r * kvw);
  }
  att_.resize(size_t(n * qw));
  if (kv_.dtype() == DType::kBF16)
    attend_gqa<uint16_t>(layer);
  else
    attend_gqa<float>(layer);
  cpu::matmul(att_.data(), n, a.o, out, pool_);
}

// Absorbed attention: k_nope_t = W_uk c_t and v_t = W_uv c_t are never formed; q is pulled into the
// latent space instead (q_lat = W_ukᵀ q_nope), and the latent output is expanded by W_uv once.
template <class S>
void CpuEngine::attend_mla(int64_t layer) {
  const auto& c = model_.cfg;
  const auto& a = model_.layers[size_t(layer)].attn;
  const int64_t n = n_rows_, nh = c.n_head, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim, lora = c.kv_lora_rank, qk = nope + rope, B = kv_.block_tokens();
  const float scale = float(c.attn_scale());
  pool_.parallel_for(n * nh, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / nh, head = i % nh;
      const int seq = row_seq_[size_t(r)];
      const int64_t T = row_pos_[size_t(r)] + 1;
      float* buf = scratch(size_t(T + 2 * lora));
      float* s = buf;
      float* q_lat = buf + T;
      float* o_lat = q_lat + lora;
      const float* qh = q_.data() + (r * nh + head) * qk;
      const int64_t wrow = head * (nope + vd);  // first kv_b row of this head
      std::fill(q_lat, q_lat + lora, 0.0f);
      for (int64_t d = 0; d < nope; ++d) axpy_w(qh[d], a.kv_b, (wrow + d) * lora, lora, q_lat);
      for (int64_t b = 0, t0 = 0; t0 < T; ++b, t0 += B) {
        const S* cb = kv_.k_block<S>(seq, layer, b);  // latent [B, lora]
        const S* rb = kv_.v_block<S>(seq, layer, b);  // rotary key [B, rope]
        const int64_t m = std::min(B, T - t0);
        for (int64_t j = 0; j < m; ++j)
          s[t0 + j] = (dot_kv(q_lat, cb + j * lora, lora) + dot_kv(qh + nope, rb + j * rope, rope)) * scale;
      }
      softmax(s, T);
      std::fill(o_lat, o_lat + lora, 0.0f);
      for (int64_t b = 0, t0 = 0; t0 < T; ++b, t0 += B) {
        const S* cb = kv_.k_block<S>(seq, layer, b);
        const int64_t m = std::min(B, T - t0);
        for (int64_t j = 0; j < m; ++j) axpy_kv(s[t0 + j], cb + j * lora, lora, o_lat);
      }
      float* o = att_.data() + (r * nh + head) * vd;
      for (int64_t d = 0; d < vd; ++d) o[d] = dot_w(o_lat, a.kv_b, (wrow + nope + d) * lora, lora);
    }
  });
}

void CpuEngine::attention_mla(int64_t layer, const float* h, float* out) {
  const auto& c = model_.cfg;
  const auto& a = model_.layers[size_t(layer)].attn;
  const int64_t n = n_rows_, nh = c.n_head, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim, lora = c.kv_lora_rank, qk = nope + rope;
  const int64_t kvw = lora + rope;
  q_.resize(size_t(n * nh * qk));
  if (c.q_lora_rank > 0) {
    // Not tmp_: `out` points into it (a resize would leave it dangling where q_lora > hidden).
    std::vector<float>& qa = ffn_;  // free until the FFN runs
    qa.resize(std::max(qa.size(), size_t(n * c.q_lora_rank)));
    cpu::matmul(h, n, a.q_a, qa.data(), pool_);
    cpu::rms_norm(qa.data(), n, c.q_lora_rank, a.q_a_norm, c.rms_norm_eps, qa.data());
    cpu::matmul(qa.data(), n, a.q_b, q_.data(), pool_);
  } else {
    cpu::matmul(h, n, a.q, q_.data(), pool_);
  }
  kv_rows_.resize(size_t(n * kvw));  // [n, lora + rope]
  cpu::matmul(h, n, a.kv_a, kv_rows_.data(), pool_);
  for (int64_t r = 0; r < n; ++r) {
    float* row = kv_rows_.data() + r * kvw;
    cpu::rms_norm(row, 1, lora, a.kv_a_norm, c.rms_norm_eps, row);
    rope_.apply(row + lora, 1, row_pos_[size_t(r)], c.rope_interleave);
    for (int64_t head = 0; head < nh; ++head)
      rope_.apply(q_.data() + (r * nh + head) * qk + nope, 1, row_pos_[size_t(r)], c.rope_interleave);
    kv_.write(row_seq_[size_t(r)], layer, row_pos_[size_t(r)], row, row + lora);
  }
  att_.resize(size_t(n * nh * vd));
  if (kv_.dtype() == DType::kBF16)
    attend_mla<uint16_t>(layer);
  else
    attend_mla<float>(layer);
  cpu::matmul(att_.data(), n, a.o, out, pool_);
}

void CpuEngine::moe_block(int64_t layer, const float* h, float* out) {
  const auto& c = model_.cfg;
  const auto& L = model_.layers[size_t(layer)];
  const int64_t n = n_rows_, H = c.hidden_size;
  gate_logits_.resize(size_t(n * c.n_expert));
  cpu::matmul(h, n, L.router, gate_logits_.data(), pool_);
  route(c, gate_logits_.data(), n, L.router_bias, routing_);
  if (hooks.on_routing) hooks.on_routing(layer, routing_);
  experts_->run(layer, h, n, routing_, out);
  if (L.shared.present()) {
    std::vector<float>& shared = tmp_;  // attention output is already added into x
    shared.resize(std::max(shared.size(), size_t(n * H)));
    run_mlp_cpu(L.shared, h, n, H, shared.data(), pool_);
    for (int64_t i = 0; i < n * H; ++i) out[i] += shared[size_t(i)];
  }
  if (hooks.on_moe) hooks.on_moe(layer, h, out, n);
}

}  // namespace tandem
