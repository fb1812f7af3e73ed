// The paged KV cache of the CPU engine: one pool of fixed-size blocks (block_tokens tokens of every
// layer's K and V rows) shared by all sequences through per-sequence block tables. Invariant between
// engine steps: a sequence of len tokens owns exactly blocks_for(len) blocks; every block is either in
// exactly one table or on the free list. Rows are stored in f32 or bf16 (converted on write). Storage
// is per layer, as vLLM's: blocks with consecutive ids hold a layer's K rows contiguously.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "io/config.h"

namespace tandem {

struct KvCacheShape {
  int64_t n_layer = 0;
  int64_t k_width = 0;  // floats per K row (GQA: n_head_kv * head_dim; MLA: kv_lora_rank)
  int64_t v_width = 0;  // floats per V row (GQA: n_head_kv * head_dim; MLA: qk_rope_head_dim)
};

// The rows a model caches per token and layer: GQA K and V [n_head_kv * head_dim]; MLA the latent
// [kv_lora_rank] as K and the rotary key [qk_rope_head_dim] as V.
KvCacheShape kv_cache_shape(const ModelConfig& cfg);

// Bytes of one block of block_tokens tokens, all layers, at dtype (kF32 or kBF16; asserted).
size_t kv_block_bytes(const KvCacheShape& shape, int64_t block_tokens, DType dtype);

// How many tokens a pool of `bytes` holds for the model: whole blocks of block_tokens tokens at dtype,
// so a multiple of block_tokens (0 when not one block fits). Passing the result as kv_tokens makes a
// pool of at most `bytes`. block_tokens < 1 or a dtype other than kF32 / kBF16: InputError.
int64_t kv_tokens_in_bytes(const ModelConfig& cfg, DType dtype, int64_t block_tokens, uint64_t bytes);

class KvCache {
 public:
  // pool_tokens > 0: a fixed pool of ceil(pool_tokens / block_tokens) blocks, allocated (not touched)
  // now; 0: the pool grows on demand and never refuses. dtype: kF32 or kBF16. Bad sizes or another
  // dtype: InputError. Sequence slots are 0 .. max_seqs-1.
  KvCache(KvCacheShape shape, int64_t block_tokens, int64_t pool_tokens, DType dtype, int64_t max_seqs);

  int64_t block_tokens() const { return block_tokens_; }
  DType dtype() const { return dtype_; }
  bool fixed() const { return fixed_; }
  int64_t blocks_total() const { return int64_t(blocks_.size()); }  // allocated so far
  int64_t blocks_used() const { return blocks_total() - int64_t(free_.size()); }
  // Blocks that can still be handed out: the free list of a fixed pool; unbounded when growing.
  int64_t blocks_free() const;
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }
  // Bytes of one block, all layers: block_tokens × placement's kv_bytes_per_token(cfg, dtype).
  size_t block_bytes() const { return block_bytes_; }

  // Blocks `seq` must still get to hold `tokens` tokens (0 when its table already covers them).
  int64_t blocks_needed(int seq, int64_t tokens) const;
  // Grows seq's table to cover `tokens` tokens. Returns false, changing nothing, when a fixed pool
  // has fewer free blocks than that needs.
  bool reserve(int seq, int64_t tokens);
  // Returns seq's blocks past the first blocks_for(tokens) to the pool (0: all of them).
  void trim(int seq, int64_t tokens);
  const std::vector<int32_t>& table(int seq) const { return tables_[size_t(seq)]; }

  // Stores the K row [k_width] and V row [v_width] of token `pos` of `seq` in `layer` (converted to
  // the storage dtype). pos must lie inside seq's table.
  void write(int seq, int64_t layer, int64_t pos, const float* k, const float* v);
  // The K rows [block_tokens, k_width] / V rows [block_tokens, v_width] of the `index`-th block of
  // seq's table in `layer`, as T = float (kF32) or uint16_t (kBF16 bit patterns). Rows past the
  // sequence's length are garbage. No checks: the attention inner loops call these once per block.
  template <class T>
  const T* k_block(int seq, int64_t layer, int64_t index) const {
    const Block& b = blocks_[size_t(tables_[size_t(seq)][size_t(index)])];
    return reinterpret_cast<const T*>(b.k + size_t(layer) * b.layer_stride);
  }
  template <class T>
  const T* v_block(int seq, int64_t layer, int64_t index) const {
    const Block& b = blocks_[size_t(tables_[size_t(seq)][size_t(index)])];
    return reinterpret_cast<const T*>(b.v + size_t(layer) * b.layer_stride);
  }

 private:
  int32_t take_block();  // a free block; grows a growing pool when none is free
  void grow(int64_t n_blocks);

  KvCacheShape shape_;
  int64_t block_tokens_;
  DType dtype_;
  bool fixed_;
  size_t elt_;          // bytes per stored value
  // Where a block's rows live: layer l's K rows [block_tokens, k_width] at k + l·layer_stride, its V
  // rows [block_tokens, v_width] at v + l·layer_stride.
  struct Block {
    std::byte* k;
    std::byte* v;
    size_t layer_stride;
  };

  size_t k_bytes_;      // one block's K rows of one layer
  size_t v_bytes_;      // one block's V rows of one layer
  size_t block_bytes_;  // one block, all layers
  // Storage, one chunk per grow() of n blocks: [n_layer][K: n × k_bytes | V: n × v_bytes]. A chunk is
  // never moved or freed while the cache lives.
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
  std::vector<Block> blocks_;  // [blocks_total] block id → where its rows are
  std::vector<int32_t> free_;                         // free block ids (LIFO: the last freed is reused first)
  std::vector<std::vector<int32_t>> tables_;          // [max_seqs] block ids of each sequence, in order
};

}  // namespace tandem
