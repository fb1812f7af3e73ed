// The forward pass over a batch of sequences with a KV cache, on the CPU. One step takes, for any
// number of live sequences, a run of new tokens each (a prompt for prefill, one token for decode),
// appends them to the sequences' caches and returns logits. The MoE step (route, run experts,
// combine) is delegated to an ExpertExecutor, which is where lanes split the work between devices.
// Allocation happens only when buffers or caches grow; a steady decode step allocates nothing.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "core/thread_pool.h"
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
};

// The KV cache's block pool, for a scheduler's admission (all zero where the engine's cache is not pooled).
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
  // overflow: InputError (nothing is appended then). The reference is valid until the next call.
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
  const std::vector<float>& forward(std::span<const Item> items, bool all_logits = false) override;

 private:
  struct LayerCache {
    std::vector<float> k;  // GQA: [cap, n_head_kv * head_dim];  MLA: latent [cap, kv_lora]
    std::vector<float> v;  // GQA: [cap, n_head_kv * head_dim];  MLA: rotary key [cap, qk_rope]
  };
  struct Sequence {
    bool live = false;
    int64_t len = 0;
    int64_t cap = 0;
    std::vector<LayerCache> layers;
  };

  void reserve(Sequence& s, int64_t len);
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

  // Per-step row metadata and scratch (grown, never shrunk).
  int64_t n_rows_ = 0;
  std::vector<int32_t> row_seq_;  // [n_rows]
  std::vector<int64_t> row_pos_;  // [n_rows]
  std::vector<float> x_, h_, tmp_, q_, kv_, att_, ffn_, gate_logits_, logits_;
  std::vector<float> scratch_;  // per-thread attention scratch
  Routing routing_;
};

}  // namespace tandem
