// The MoE step on the GPU: route (exactly as moe/router.cpp), group the (row, slot) pairs by expert,
// run the selected experts (each touched expert's weights streamed once per step, whatever number of
// rows it got), combine the weighted slot outputs in slot order and add them to the residual.
// Everything data-dependent (which experts, how many rows each) stays in device memory, so one
// captured graph serves every decode step. Placements: an expert's weights may live in HBM or in
// mapped pinned host memory (the host lane: same kernels, reads over PCIe); experts flagged in a
// cold mask are left out of the GPU's work and listed for an outside executor (the peer lane),
// which must write their slot outputs before the combine.
#pragma once

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernel_policy.h"

namespace tandem::cuda {

enum class RouteKind : int { kSoftmaxTopK, kSigmoidGroupTopK };

struct RouteArgs {
  const float* logits = nullptr;  // [n, n_expert]
  int n = 0, n_expert = 0, k = 0;
  RouteKind kind = RouteKind::kSoftmaxTopK;
  bool norm_topk = false;
  double routed_scaling = 1.0;
  int n_group = 1, topk_group = 1;  // n_group <= 32
  const float* bias = nullptr;      // [n_expert] selection-only correction bias, or null
  bool shared_slot = false;         // append slot k: expert n_expert (the shared expert), weight 1
  int32_t* ids = nullptr;           // [n, k + shared_slot]
  float* weights = nullptr;         // [n, k + shared_slot]
};
// n_expert ≤ kMaxRouteExperts, k < 32.
constexpr int kMaxRouteExperts = 1024;
void launch_route(const RouteArgs& a, cudaStream_t stream);

// Grouping of slots by expert (device memory, sized for the largest step).
struct MoeWork {
  int32_t* n_active = nullptr;    // [1] experts with at least one hot slot
  int32_t* act_expert = nullptr;  // [max_active] their ids
  int32_t* act_offset = nullptr;  // [max_active] first position of their slots in slot_list
  int32_t* act_count = nullptr;   // [max_active]
  int32_t* slot_list = nullptr;   // [n_slots] hot slots grouped by expert (order within one expert free)
  int32_t* n_cold = nullptr;      // [1]
  int32_t* cold_slots = nullptr;  // [n_slots] slots routed to cold experts
};
constexpr int kMaxGroupExperts = 4096;
constexpr int kMaxGroupSlots = 40 * 1024;  // a slot's position takes 4 of the kernel's 160 KB of shared memory
// ids: [n_slots] expert id per slot, each in [0, n_experts). cold_mask: [n_experts] or null (none cold).
void launch_group(const int32_t* ids, int n_slots, int n_experts, const uint8_t* cold_mask, const MoeWork& w,
                  cudaStream_t stream);
// launch_route(a) then launch_group(a.ids, a.n · (a.k + a.shared_slot), n_experts, cold_mask, w): the
// same outputs, in one launch when the step has at most 32 rows (decode), else the two launches; at
// most 32 slots (a few rows) take a small one-warp grouping.
void launch_route_group(const RouteArgs& a, int n_experts, const uint8_t* cold_mask, const MoeWork& w,
                        cudaStream_t stream);

// Expert weights: per expert e, device-readable pointers (HBM or mapped host memory).
struct ExpertTable {
  const void* const* gate = nullptr;  // [n_experts] -> [inter_e, H]
  const void* const* up = nullptr;    // [n_experts] -> [inter_e, H]
  const void* const* down = nullptr;  // [n_experts] -> [H, inter_e]
  WType wt = WType::kF32;
  int n_routed = 0;       // experts below this id have `inter` rows; others `shared_inter`
  int inter = 0, shared_inter = 0;
  int hidden = 0;
  const int32_t* inter_of = nullptr;  // [n_experts] per-expert rows when set (split lane: cold experts
                                      // keep only their first features), overriding n_routed/inter/shared_inter
};

struct ExpertRun {
  const float* x = nullptr;            // [n, H] MoE input rows
  int n = 0;                           // rows (dense mode: all go to expert 0)
  int slots_per_row = 1;               // kS; slot s belongs to row s / kS
  const float* slot_weight = nullptr;  // [n * kS]
  float* h = nullptr;                  // [n_slots, h_stride] silu(gate)·up per listed slot
  int h_stride = 0;
  float* out = nullptr;                // MoE: slot_out [n * kS, H] (weighted); dense: residual y [n, H] (+=)
  int max_active = 0;                  // grid bound on active experts (device count read at run time)
  bool dense = false;                  // a plain MLP (expert 0) over rows 0..n-1, work unused
  bool evict_first = false;            // weight loads marked evict-first in L2 (streamed once; a hint)
};
// The expert kernels take the step's rows in passes of R = the smallest of 1, 2, 4, 8 that covers
// them, at most p.expert_max_rows (fewer than an expert's rows re-read each weight row from L1 once
// per pass; the same bits under every value). A captured graph keeps what it was captured with.
void launch_expert_gate_up(const ExpertTable& t, const MoeWork& w, const ExpertRun& r, const KernelPolicy& p,
                           cudaStream_t stream);
void launch_expert_down(const ExpertTable& t, const MoeWork& w, const ExpertRun& r, const KernelPolicy& p,
                        cudaStream_t stream);
// launch_route_group(a, n_experts, nullptr, w) then launch_expert_gate_up(t, w, r) in one launch, for
// steps of one row without a cold mask and at most 384 routed experts: every block routes the row
// itself. Same outputs, bitwise. Returns false, launching nothing, where it does not apply. Whether
// to try it is the caller's choice (KernelPolicy::moe_route_in_gate_up).
bool launch_expert_gate_up_routed(const RouteArgs& a, int n_experts, const ExpertTable& t, const MoeWork& w,
                                  const ExpertRun& r, cudaStream_t stream);

// moe_out[r] = Σ_j slot_out[r · kS + j] (j ascending); x[r] += moe_out[r]. Shapes [n, H].
void launch_moe_combine(const float* slot_out, int n, int kS, int H, float* moe_out, float* x,
                        cudaStream_t stream);

}  // namespace tandem::cuda
