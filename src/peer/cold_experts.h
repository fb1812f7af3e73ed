// The CPU peer's compute: the cold experts of a rowmap, copied out of the checkpoint into memory this
// process owns (so what it holds is exactly the cold experts' bytes), run with the CPU backend's
// expert kernels — the same function the primary's local lane computes. They sit in one arena asked
// to be backed by huge pages (core/host_buffer.h): a pass streams whole experts every step.
#pragma once

#include <vector>

#include "core/host_buffer.h"
#include "core/thread_pool.h"
#include "models/model.h"
#include "peer/compute.h"
#include "placement/rowmap.h"

namespace tandem {

class ColdExperts final : public peer::PeerCompute {
 public:
  // `model` may have bound only the cold experts (Model::load with a filter); the rowmap must be
  // validated against it. split_begin > 0 (the split lane): hold and compute only intermediate
  // features [split_begin, inter) of each cold expert; the GPU streams the rest (experts.h).
  ColdExperts(const Model& model, const Rowmap& rowmap, ThreadPool& pool, int64_t split_begin = 0);

  int n_layers() const override { return int(experts_.size()); }
  int n_experts() const override { return int(n_expert_); }
  bool is_cold(int layer, int expert) const override { return experts_[size_t(layer)][size_t(expert)].present(); }
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights, int64_t k,
               float* out) override;

  size_t bytes_held() const { return bytes_; }
  // Share of the experts' arena backed by huge pages, in [0, 1]; -1 when the kernel does not say.
  double huge_page_share() const;
  int64_t n_cold() const { return n_cold_; }

 private:
  int64_t hidden_ = 0, n_expert_ = 0, n_cold_ = 0;
  size_t bytes_ = 0;
  ThreadPool& pool_;
  std::vector<std::vector<ExpertWeights>> experts_;  // [n_layer][n_expert]; only cold ones present
  HostBuffer storage_;  // every held expert, back to back (64-byte aligned parts)
};

}  // namespace tandem
