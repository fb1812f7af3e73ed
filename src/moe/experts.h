// Routed-expert execution on the CPU: the one step that lanes split between devices.
// Routing says, per token row, which k experts it goes to and with which gate weight; this runs
// those experts (SwiGLU MLPs) and writes each row's weighted sum. Shared by the local lane and the
// CPU peer, so both compute exactly the same function.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem {

// One SwiGLU MLP: down(silu(gate x) * up x).
struct ExpertWeights {
  TensorView gate;  // [inter, hidden]
  TensorView up;    // [inter, hidden]
  TensorView down;  // [hidden, inter]
  bool present() const { return !gate.empty(); }
  // Weights plus FP8 block scales: what holding the expert costs.
  size_t nbytes() const {
    return gate.nbytes() + up.nbytes() + down.nbytes() + gate.scale_nbytes() + up.scale_nbytes() + down.scale_nbytes();
  }
};

// The routing of n_rows token rows to k experts each.
struct Routing {
  int64_t n_rows = 0;
  int64_t k = 0;
  std::vector<int32_t> ids;    // [n_rows, k] expert ids; -1 = no expert in this slot
  std::vector<float> weights;  // [n_rows, k] final gate weights (renormalised and scaled as the arch says)
};

// out[r] = Σ_j weights[r, j] · expert_{ids[r, j]}(x[r]) over slots with ids[r, j] >= 0.
// experts is indexed by expert id; every referenced expert must be present (asserted: the caller
// validated ids). x: [n_rows, hidden], out: [n_rows, hidden], overwritten (zero for rows with no slot).
void run_experts_cpu(std::span<const ExpertWeights> experts, const float* x, int64_t n_rows, int64_t hidden,
                     const int32_t* ids, const float* weights, int64_t k, float* out, ThreadPool& pool);

// Split lane: an expert's intermediate features [0, inter) are split at column `a`; the GPU streams
// [0, a) over the link, the peer computes [a, inter). A SwiGLU MLP is a sum over its intermediate
// features, so expert(x) = part[0, a)(x) + part[a, inter)(x) exactly (up to float summation order).
// Split column for `fraction` of the features on the GPU: a multiple of 8 (16-byte bf16 vectors) in
// [8, inter - 8]. InputError unless 0 < fraction < 1 and inter >= 16.
int64_t split_column(int64_t inter, double fraction);
// The share of each cold expert to read over the link when the link and the peer's DRAM stream their
// parts in parallel: link / (link + dram), where both paths finish together. InputError unless both
// bandwidths are positive and finite.
double split_share_for(double link_gbps, double dram_gbps);
// Bytes slice_expert writes for features [begin, end) of `e` (each part 64-byte aligned).
size_t sliced_bytes(const ExpertWeights& e, int64_t begin, int64_t end);
// Copies features [begin, end) of `e` into dst (sliced_bytes of room, 64-byte aligned): gate and up
// rows [begin, end), down columns [begin, end) as a contiguous [hidden, end - begin] matrix. Returns
// views into dst. FP8 experts are refused (InputError): the split lane does not slice block scales yet.
ExpertWeights slice_expert(const ExpertWeights& e, int64_t begin, int64_t end, uint8_t* dst);

// One dense SwiGLU MLP over n rows: out = mlp(x). out may not alias x.
void run_mlp_cpu(const ExpertWeights& mlp, const float* x, int64_t n_rows, int64_t hidden, float* out,
                 ThreadPool& pool);

}  // namespace tandem
