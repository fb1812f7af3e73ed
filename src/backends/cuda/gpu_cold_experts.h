// The GPU peer's compute (`tandem peer --device cuda`): a rowmap's cold experts resident in one GPU's
// HBM in their checkpoint dtype, run with the CUDA backend's expert kernels (moe.cuh: group,
// expert_gate_up, expert_down, combine) — the function ColdExperts computes on the CPU, up to float
// summation order. Each compute() copies the rows in, runs on one stream and synchronizes before it
// writes `out`, so nothing it launched outlives the call.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_weights.h"
#include "backends/cuda/moe.cuh"
#include "models/model.h"
#include "peer/compute.h"
#include "placement/rowmap.h"

namespace tandem::cuda {

class GpuColdExperts final : public peer::PeerCompute {
 public:
  // Uploads the cold experts of `rowmap` (validated against `model`, which may have bound only them)
  // to GPU `device` and reserves device buffers for requests of up to max_rows rows × cfg.n_expert_used
  // slots. split_begin > 0 (the split lane): holds and computes only intermediate features
  // [split_begin, inter) of each cold expert. InputError: no such device, not enough memory, a weight
  // dtype the kernels lack, a split column outside the experts, a request size the kernels can't group.
  GpuColdExperts(const Model& model, const Rowmap& rowmap, int device, int64_t max_rows, int64_t split_begin = 0);
  ~GpuColdExperts() override;
  GpuColdExperts(const GpuColdExperts&) = delete;
  GpuColdExperts& operator=(const GpuColdExperts&) = delete;

  int n_layers() const override { return int(cold_.size()); }
  int n_experts() const override { return int(n_expert_); }
  bool is_cold(int layer, int expert) const override { return cold_[size_t(layer)][size_t(expert)] != 0; }
  // See PeerCompute. Throws InputError for more rows or slots than reserved (the server's geometry
  // check makes that a bug in the caller).
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights, int64_t k,
               float* out) override;

  size_t bytes_held() const { return bytes_; }
  int64_t n_cold() const { return n_cold_; }

 private:
  int device_ = 0;
  int64_t hidden_ = 0, n_expert_ = 0, n_cold_ = 0, max_rows_ = 0, max_k_ = 0;
  int h_stride_ = 0;
  size_t bytes_ = 0;
  std::vector<std::vector<uint8_t>> cold_;  // [n_layer][n_expert] 1 = held here
  // Per layer: n_expert + 1 entries; the last is the empty slot's stand-in (no weights, 0 features),
  // so a request's -1 slots go through the same kernels and come out as zero rows.
  std::vector<ExpertTable> tables_;
  DeviceMemory mem_;
  cudaStream_t stream_ = nullptr;
  // Device buffers for max_rows × max_k slots.
  float* x_ = nullptr;         // [max_rows, H]
  int32_t* meta_ = nullptr;    // [2, slots]: ids (empty -> n_expert), then weights (f32 bits; 0 when empty)
  float* h_ = nullptr;         // [slots, h_stride] silu(gate)·up
  float* slot_out_ = nullptr;  // [slots, H] weighted expert outputs
  float* out_ = nullptr;       // [max_rows, H]
  MoeWork work_;
  void* h_meta_ = nullptr;     // pinned staging of meta_
};

// Page-locks a host range (the lane's segment) while it lives, so copies to and from it are plain DMA.
// Best effort: when the driver refuses (e.g. the range is already registered in this process) it logs a
// warning and the copies go through the driver's staging instead — slower, the same bytes. Must be
// destroyed before the range is unmapped.
class PinnedRange {
 public:
  PinnedRange(void* base, size_t bytes);
  ~PinnedRange();
  PinnedRange(const PinnedRange&) = delete;
  PinnedRange& operator=(const PinnedRange&) = delete;

 private:
  void* base_ = nullptr;
};

}  // namespace tandem::cuda
