// The forward pass over a batch of sequences with a KV cache, on the CPU. One step takes, for any
// number of live sequences, a run of new tokens each (a prompt for prefill, one token for decode),
// appends them to the sequences' caches and returns logits. The MoE step (route, run experts,
// combine) is delegated to an ExpertExecutor, which is where lanes split the work between devices.
// The KV cache is paged (engine/kv_cache.h): a pool of fixed-size blocks shared by all sequences.
// Allocation happens only when buffers or caches grow; a steady decode step allocates nothing.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/rope.h"
#include "models/model.h"
#include "moe/executor.h"

namespace tandem {

struct ForwardHooks {
  // After routing of MoE layer `layer` (rows in batch order).
  std::function<void(int64_t layer, const Routing& routing)> on_routing;
  // The MoE block's input and output ([n_rows, hidden]; output includes shared experts and scaling).
  std::function<void(int64_t layer, const float* moe_in, const float* moe_out, int64_t n_rows)> on_moe;
};

struct EngineOptions {
  int64_t max_seqs = 64;
  int64_t max_ctx = 0;  // 0: the model's max_position_embeddings
  int64_t kv_block = 16;  // tokens per KV-cache block (engines with a paged cache)
  int64_t kv_tokens = 0;  // the KV pool's size in tokens, rounded up to blocks; 0: grown on demand
  // KV rows as stored: kF32 (the default: the oracle fixtures are f32 references, met at 1e-4) or
  // kBF16 (half the bytes, as a bf16 deployment stores them; logits move by ~2e-3 relative).
  DType kv_dtype = DType::kF32;
};

// forward() needed more KV blocks than a fixed pool has free; nothing was appended. The sequences
// are intact: the caller may wait for others to finish (or remove some) and retry.
class KvCacheFull : public InputError {
 public:
  KvCacheFull(int64_t blocks_needed, int64_t blocks_free, int64_t blocks_total, int64_t block_tokens);
  int64_t blocks_needed, blocks_free;
};

// The KV cache's block pool, for a scheduler's admission (all zero where the engine's cache is not pooled).
// The CUDA engine's cache is a pool of max_seqs blocks of the whole context each (one per sequence).
struct KvUsage {
  int64_t block_tokens = 0;  // tokens per block
  int64_t blocks_total = 0;  // 0: no fixed pool (grown on demand)
  int64_t blocks_used = 0;
};

// What every device's forward pass offers (CpuEngine here, CudaEngine in backends/cuda).
class Engine {
 public:
  virtual ~Engine() = default;
  virtual const Model& model() const = 0;
  int64_t vocab_size() const { return model().cfg.vocab_size; }

  // A new empty sequence; InputError when max_seqs are live.
  virtual int add_sequence() = 0;
  virtual void remove_sequence(int seq) = 0;
  virtual int64_t seq_len(int seq) const = 0;
  // The context limit per sequence: forward() refuses to grow a sequence past it.
  virtual int64_t max_ctx() const = 0;

  struct Item {
    int seq;
    std::span<const int32_t> tokens;  // appended at positions seq_len(seq)...
  };
  // Runs the items as one batch. Returns logits [n_items, vocab] for each item's last token, or
  // [total tokens, vocab] when all_logits. Token ids out of range, a sequence twice or context
  // overflow: InputError; more KV blocks than a fixed pool has free: KvCacheFull (nothing is appended
  // then, and no block is taken). The reference is valid until the next call.
  virtual const std::vector<float>& forward(std::span<const Item> items, bool all_logits = false) = 0;

  virtual KvUsage kv_usage() const { return {}; }

  // Observers (may slow a device engine down: it copies what they see to the host).
  ForwardHooks hooks;
};

class CpuEngine final : public Engine {
 public:
  // `experts` null: all experts local (the local lane). `pool` null: the global pool.
  CpuEngine(const Model& model, EngineOptions options = {}, ExpertExecutor* experts = nullptr,
            ThreadPool* pool = nullptr);

  const Model& model() const override { return model_; }
  int add_sequence() override;
  void remove_sequence(int seq) override;
  int64_t seq_len(int seq) const override;
  int64_t max_ctx() const override { return options_.max_ctx; }
  // Bad kv_block / kv_tokens / kv_dtype: InputError from the constructor.
  const std::vector<float>& forward(std::span<const Item> items, bool all_logits = false) override;
  // remove_sequence returns the sequence's blocks at once.
  KvUsage kv_usage() const override;
  const KvCache& kv_cache() const { return kv_; }

 private:
  struct Sequence {
    bool live = false;
    int64_t len = 0;  // tokens in the cache; kv_ holds exactly blocks_for(len) blocks for it
  };

  void run_layers(std::span<const Item> items);  // x_ ← the residual stream after every layer
  const std::vector<float>& compute_logits(std::span<const Item> items, bool all_logits);
  template <class T>
  void attend_gqa(int64_t layer);
  template <class T>
  void attend_mla(int64_t layer);
  void attention_gqa(int64_t layer, const float* h, float* out);
  void attention_mla(int64_t layer, const float* h, float* out);
  void moe_block(int64_t layer, const float* h, float* out);

  const Model& model_;
  EngineOptions options_;
  LocalExperts local_experts_;
  ExpertExecutor* experts_;
  ThreadPool& pool_;
  Rope rope_;
  std::vector<Sequence> seqs_;
  // Per layer, GQA: K and V rows [n_head_kv * head_dim]; MLA: latent [kv_lora] as K, rotary key
  // [qk_rope] as V.
  KvCache kv_;

  // Per-step row metadata and scratch (grown, never shrunk).
  int64_t n_rows_ = 0;
  std::vector<int32_t> row_seq_;  // [n_rows]
  std::vector<int64_t> row_pos_;  // [n_rows]
  std::vector<float> x_, h_, tmp_, q_, kv_rows_, att_, ffn_, gate_logits_, logits_;
  std::vector<float> scratch_;  // per-thread attention scratch
  Routing routing_;
};

}  // namespace tandem
