// The CUDA kernels' launch-time choices as one value: the engine owns one (its defaults are the
// product's kernels) and passes it to the launchers; benchmarks and tests change an engine's copy
// through cuda_diagnostics.h. Plain C++ (no CUDA types), shared by nvcc and the C++ compiler.
// Why each default: bench/RESULTS.md, "Why the defaults are what they are" (row named per field).
#pragma once

namespace tandem::cuda {

struct KernelPolicy {
  // Expert kernels (moe.cuh): the most activation rows a pass takes (1, 2, 4 or 8; fewer than the
  // expert's rows re-read each weight row from L1 once per pass). The same bits under every value.
  // Row "Expert rows per pass".
  int expert_max_rows = 4;
  // Projections (linear.cuh): steps of at least this many rows take the tensor-core kernel where it
  // applies (bf16 weights, aligned shapes); 0: never. The kernels' sums differ in order (f32
  // rounding). Row "Projections on the tensor cores".
  int linear_mma_min_rows = 2;
  // The CUDA-core projection's warps per output feature at one row: 1, 2, 4, or 0 (the fewest that
  // give the launch linear_split_target blocks a multiprocessor, 1 to 64). Row "One-row steps".
  int linear_row_split = 0;
  int linear_split_target = 2;
  // MLA attention (attention.cuh): the fewest positions a split block takes (1 to 1024); decode steps
  // of at most kLinearNormRows rows build each row's new cache entry inside attention instead of in
  // an mla_prep launch (mla_fresh_rows). f32 rounding apart. Row "One-row steps".
  int mla_min_chunk = 16;
  bool mla_fresh_rows = true;
  // Fused MLA decode (mla_decode.cuh): decode steps of at most mla_fused_rows rows (0 to
  // kLinearNormRows; 0: never) run as one cluster launch of mla_cluster blocks per (row, head) (4 or
  // 8), and ask L2 for their layer's o_proj, router and shared expert weights (mla_prefetch_moe, a
  // hint: the same bits). Rows "Fused MLA decode", "Clusters of 4", "L2 cache hints".
  int mla_fused_rows = 1;
  int mla_cluster = 4;
  bool mla_prefetch_moe = true;
  // One-row steps without a peer route inside the expert gate_up blocks (moe.cuh; the same bits).
  // Row "Routing inside the expert blocks".
  bool moe_route_in_gate_up = true;
  // The expert kernels' weight loads marked evict-first in L2 (a hint: the same bits). Row "L2 cache
  // hints".
  bool expert_evict_first = true;
};

}  // namespace tandem::cuda
