// Where routed experts run. The engine routes, then hands the rows to an ExpertExecutor and adds
// what it returns; lanes (local, peer, and on the GPU host) are implementations of this one step.
// Contract: run() returns only when every slot of every row has been computed; it never returns a
// partial sum: a late or missing answer is waited for or fails the request, never counted as zero
// ("dark beats wrong", docs/protocol.md). On failure it throws.
#pragma once

#include "core/thread_pool.h"
#include "moe/experts.h"

namespace tandem {

struct Model;

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // out[r] = Σ_j routing.weights[r, j] · expert_{ids[r, j]}(x[r]); x, out: [n_rows, hidden].
  virtual void run(int64_t layer, const float* x, int64_t n_rows, const Routing& routing, float* out) = 0;
};

// Every expert on this CPU (the local lane).
class LocalExperts final : public ExpertExecutor {
 public:
  LocalExperts(const Model& model, ThreadPool& pool) : model_(model), pool_(pool) {}
  void run(int64_t layer, const float* x, int64_t n_rows, const Routing& routing, float* out) override;

 private:
  const Model& model_;
  ThreadPool& pool_;
};

}  // namespace tandem
