// The CUDA backend's kernel lab: what benchmarks (bench/) and backend tests use to change a CUDA
// engine's kernel choices, switch PDL, drop its graphs, time each kernel and repeat kernels on the
// step's critical path. Ordinary callers (src/cli, src/runtime, a server) never include it; without a
// KernelProfile or KernelRepeat alive, a launch pays one call and a null check for these hooks.
// Plain C++ header (only when TANDEM_HAVE_CUDA is defined).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/kernel_policy.h"
#include "engine/engine.h"

namespace tandem {

// The engine's kernel choices (kernel_policy.h: each field, its values and the A/B behind its
// default). `engine` must be a CUDA engine (make_cuda_engine); anything else is a bug.
using CudaKernelPolicy = cuda::KernelPolicy;
CudaKernelPolicy cuda_kernel_policy(Engine& engine);
// Checks every field (InputError naming the first bad one, the engine left as it was), then gives the
// engine `p` and drops its captured graphs (the next decode steps of each size are captured again).
void cuda_set_kernel_policy(Engine& engine, const CudaKernelPolicy& p);

// Turns programmatic dependent launch on or off for the engine's later steps (drops its captured
// graphs), so a benchmark can compare both on one engine. Returns whether PDL is now on: never under
// TANDEM_PDL=0, before sm_90, or for an engine that is not a CUDA engine.
bool cuda_set_pdl(Engine& engine, bool on);

// Drops the engine's captured graphs (the next decode steps of each size run eagerly, then are
// captured again): for benchmarks that change a launch-time setting (KernelRepeat).
void cuda_drop_graphs(Engine& engine);

// GPU time per kernel of the calling thread's launches while the profile is alive: each launch
// through the backend's launch_kernel() is bracketed by two events (eager steps only, since graph
// replays launch nothing on the host; run with graphs and PDL off so that kernels neither hide in a
// graph nor overlap). begin_step() queues a short device-side delay before the next launch, so the
// host can queue the whole step ahead of the GPU and host launch gaps do not count; end_step() (after
// the step synchronised) adds the step's times to the totals.
struct KernelTime {
  std::string name;  // demangled, without namespaces and parameters, then the grid: "linear_kernel<float> [8x1x1]"
  int64_t calls = 0;
  double total_us = 0;
};
class KernelProfile {
 public:
  KernelProfile();
  ~KernelProfile();
  KernelProfile(const KernelProfile&) = delete;
  KernelProfile& operator=(const KernelProfile&) = delete;
  void begin_step();
  void end_step();
  std::vector<KernelTime> totals() const;  // largest total first
  int64_t steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// While alive, the calling thread's launches of every kernel whose label (as KernelTime names it,
// with the grid: "linear_kernel<__nv_bfloat16, 1, 2, 1> [168x1x1]") contains name_part are issued
// twice in a row (never the peer lane's handoff kernels). The results are wrong (an in-place norm
// runs twice, an accumulation adds twice), the time is right: a step with a kernel twice, less the
// step with it once, is that kernel's share of the step's critical path inside a graph with PDL, where
// the kernels' own times (KernelProfile) overlap. Graphs captured meanwhile keep the repeats: drop
// them (cuda_drop_graphs) before and after. InputError for an empty name_part.
class KernelRepeat {
 public:
  explicit KernelRepeat(std::string name_part);
  ~KernelRepeat();
  KernelRepeat(const KernelRepeat&) = delete;
  KernelRepeat& operator=(const KernelRepeat&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
