// The paged KV cache (see kv_cache.h): block allocation, block tables and row writes.
#include "engine/kv_cache.h"

#include <algorithm>
#include <limits>
#include <new>

#include "core/error.h"

namespace tandem {

namespace {
void check_options(int64_t block_tokens, DType dtype) {
  if (block_tokens < 1) fail("KV block size must be at least 1 token, got {}", block_tokens);
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    fail("KV cache dtype must be F32 or BF16, got {}", dtype_name(dtype));
}
}  // namespace

KvCacheShape kv_cache_shape(const ModelConfig& c) {
  const int64_t kw = c.mla ? c.kv_lora_rank : c.n_head_kv * c.head_dim;
  const int64_t vw = c.mla ? c.qk_rope_head_dim : c.n_head_kv * c.head_dim;
  return {c.n_layer, kw, vw};
}

size_t kv_block_bytes(const KvCacheShape& shape, int64_t block_tokens, DType dtype) {
  TANDEM_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16, "KV dtype {}", dtype_name(dtype));
  return size_t(shape.n_layer) * size_t(block_tokens) * size_t(shape.k_width + shape.v_width) * dtype_size(dtype);
}

int64_t kv_tokens_in_bytes(const ModelConfig& cfg, DType dtype, int64_t block_tokens, uint64_t bytes) {
  check_options(block_tokens, dtype);
  const size_t block = kv_block_bytes(kv_cache_shape(cfg), block_tokens, dtype);
  TANDEM_ASSERT(block > 0, "model with no KV rows ({} layers)", cfg.n_layer);
  return int64_t(bytes / block) * block_tokens;
}

KvCache::KvCache(KvCacheShape shape, int64_t block_tokens, int64_t pool_tokens, DType dtype, int64_t max_seqs)
    : shape_(shape), block_tokens_(block_tokens), dtype_(dtype), fixed_(pool_tokens > 0) {
  check_options(block_tokens, dtype);
  if (pool_tokens < 0) fail("KV pool size must be >= 0 tokens (0: grown on demand), got {}", pool_tokens);
  TANDEM_ASSERT(shape.n_layer > 0 && shape.k_width > 0 && shape.v_width > 0 && max_seqs > 0,
                "KV cache shape {} layers, widths {} / {}, {} sequences", shape.n_layer, shape.k_width,
                shape.v_width, max_seqs);
  elt_ = dtype_size(dtype);
  k_bytes_ = size_t(block_tokens) * size_t(shape.k_width) * elt_;
  v_bytes_ = size_t(block_tokens) * size_t(shape.v_width) * elt_;
  block_bytes_ = (k_bytes_ + v_bytes_) * size_t(shape.n_layer);
  TANDEM_ASSERT(block_bytes_ == kv_block_bytes(shape, block_tokens, dtype), "KV block layout");
  tables_.resize(size_t(max_seqs));
  if (fixed_) {
    const int64_t n = blocks_for(pool_tokens);
    if (n > std::numeric_limits<int32_t>::max()) fail("KV pool of {} blocks is too large", n);
    grow(n);
  }
}

void KvCache::grow(int64_t n_blocks) {
  if (n_blocks <= 0) return;
  const size_t bytes = size_t(n_blocks) * block_bytes_;
  std::unique_ptr<std::byte[]> chunk;
  try {
    chunk.reset(new std::byte[bytes]);  // uninitialized: pages are committed as blocks are written
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(fmt::format("KV cache: cannot allocate {} blocks of {} tokens ({} bytes); {} blocks held",
                                       n_blocks, block_tokens_, bytes, blocks_total()));
  }
  const int64_t first = blocks_total();
  const size_t layer_stride = size_t(n_blocks) * (k_bytes_ + v_bytes_);
  std::byte* v0 = chunk.get() + size_t(n_blocks) * k_bytes_;
  for (int64_t i = 0; i < n_blocks; ++i)
    blocks_.push_back({chunk.get() + size_t(i) * k_bytes_, v0 + size_t(i) * v_bytes_, layer_stride});
  // Lowest ids on top of the free stack: a fresh pool hands out blocks 0, 1, 2, ...
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(int32_t(first + i));
  chunks_.push_back(std::move(chunk));
}

int64_t KvCache::blocks_free() const {
  return fixed_ ? int64_t(free_.size()) : std::numeric_limits<int64_t>::max();
}

int64_t KvCache::blocks_needed(int seq, int64_t tokens) const {
  return std::max<int64_t>(0, blocks_for(tokens) - int64_t(tables_[size_t(seq)].size()));
}

int32_t KvCache::take_block() {
  TANDEM_ASSERT(!free_.empty(), "KV pool: no free block");
  const int32_t b = free_.back();
  free_.pop_back();
  return b;
}

bool KvCache::reserve(int seq, int64_t tokens) {
  const int64_t need = blocks_needed(seq, tokens);
  if (need == 0) return true;
  if (int64_t(free_.size()) < need) {
    if (fixed_) return false;
    // Grow geometrically, and by at least 256 tokens, so that a long prompt or many sequences cost
    // few chunks; never by less than the step needs.
    const int64_t at_least = std::max(blocks_total(), blocks_for(256));
    grow(std::max(need - int64_t(free_.size()), at_least));
  }
  auto& t = tables_[size_t(seq)];
  for (int64_t i = 0; i < need; ++i) t.push_back(take_block());
  return true;
}

void KvCache::trim(int seq, int64_t tokens) {
  auto& t = tables_[size_t(seq)];
  const size_t keep = size_t(std::min<int64_t>(blocks_for(tokens), int64_t(t.size())));
  while (t.size() > keep) {
    free_.push_back(t.back());
    t.pop_back();
  }
}

void KvCache::write(int seq, int64_t layer, int64_t pos, const float* k, const float* v) {
  const auto& t = tables_[size_t(seq)];
  TANDEM_ASSERT(pos >= 0 && pos / block_tokens_ < int64_t(t.size()), "KV write at {} past sequence {}'s {} blocks",
                pos, seq, t.size());
  const Block& b = blocks_[size_t(t[size_t(pos / block_tokens_)])];
  std::byte* kb = b.k + size_t(layer) * b.layer_stride;
  std::byte* vb = b.v + size_t(layer) * b.layer_stride;
  const int64_t row = pos % block_tokens_;
  const int64_t kw = shape_.k_width, vw = shape_.v_width;
  if (dtype_ == DType::kF32) {
    std::copy(k, k + kw, reinterpret_cast<float*>(kb) + row * kw);
    std::copy(v, v + vw, reinterpret_cast<float*>(vb) + row * vw);
  } else {
    uint16_t* kd = reinterpret_cast<uint16_t*>(kb) + row * kw;
    uint16_t* vd = reinterpret_cast<uint16_t*>(vb) + row * vw;
    for (int64_t i = 0; i < kw; ++i) kd[i] = f32_to_bf16(k[i]);
    for (int64_t i = 0; i < vw; ++i) vd[i] = f32_to_bf16(v[i]);
  }
}

}  // namespace tandem
