// The CUDA forward pass (sm_90): the same function as CpuEngine, with weights resident in HBM in
// their checkpoint dtype (f32/bf16/f16, f32 activations and accumulation), an f32 KV cache on the
// GPU, MoE routing and expert grouping on the GPU, and decode steps replayed as CUDA graphs (one per
// batch size). Lanes: `local` keeps every expert in HBM; `host` keeps the listed cold experts in
// pinned host memory that the same expert kernels read over PCIe (zero-copy, one launch per step);
// `peer` leaves the cold experts to a `tandem peer` process: the GPU hands their rows over through the
// lane's shared memory from inside the stream and waits on the answer there (docs/gpu.md, Lanes);
// `split` does both at once: each cold expert's first intermediate features stream over PCIe as in
// `host` while a `tandem peer --split-share` computes the rest from its DRAM, and the two parts are summed.
// Plain C++ header: usable from code built without nvcc (only when TANDEM_HAVE_CUDA is defined).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "moe/peer_lane.h"

namespace tandem {

enum class CudaLane { kLocal, kHost, kPeer, kSplit };

// How the host thread waits for a step's end: spinning (the CUDA runtime's default: the lowest
// latency, one core busy for the whole step) or sleeping on an event created with
// cudaEventBlockingSync (the driver wakes it when the step ends, a little later, and the core is
// free meanwhile: for a CPU peer on the same host in the peer and split lanes). Which is faster
// behind a CPU peer is not settled (docs/gpu.md, Host wait).
enum class CudaHostWait { kSpin, kSleep };

struct CudaOptions {
  int device = 0;
  CudaLane lane = CudaLane::kLocal;
  // Host, peer and split lanes: per layer ([n_layer] lists, or empty = none), the routed experts kept
  // in pinned host memory (host), computed by the peer (peer; never uploaded) or split between the two
  // (split). Ids must be in range, unique, and only on MoE layers. Ignored by the local lane.
  std::vector<std::vector<int32_t>> cold;
  // Split lane: intermediate features [0, split_begin) of each cold expert are read over PCIe by the
  // GPU, [split_begin, inter) computed by the peer (split_column() in moe/experts.h).
  int64_t split_begin = 0;
  // Peer and split lanes: the lane name, the fingerprint both sides expect (lane_fingerprint(rowmap,
  // split_begin)), the spin
  // limit of the GPU's wait (µs; past it the wait naps and counts an overrun, never gives up), and the
  // check gate: every Nth step (0 = off) runs eagerly and recomputes each handoff's rows on the CPU; a
  // row below check_min trips the lane (the step throws LaneTripped).
  std::string peer;
  uint64_t peer_fingerprint = 0;
  uint64_t peer_spin_limit_us = 50;
  int64_t peer_check = 0;
  double check_min = 0.999;
  double peer_attach_timeout_s = 30;
  bool graphs = true;  // replay decode steps (one token per sequence) as CUDA graphs
  // Programmatic dependent launch for every kernel of a step (eager and in graphs): each kernel is
  // scheduled while its predecessor finishes and waits for it on the device (docs/gpu.md). Same
  // results bitwise; the environment variable TANDEM_PDL=0 turns it off, as do devices before sm_90.
  bool pdl = true;
  CudaHostWait host_wait = CudaHostWait::kSpin;
};

// "cuda" -> 0, "cuda:N" -> N; nullopt for anything else ("cpu", "cuda:x", ...).
std::optional<int> parse_cuda_device(std::string_view device);
// Number of usable CUDA devices (0 without a driver or a device).
int cuda_device_count();
// The device's read bandwidth in GB/s (1e9 bytes), measured: a kernel streaming `bytes` of its memory
// once (16-byte loads over 4 blocks a multiprocessor), the best of five timed passes after a warm-up.
double cuda_read_bandwidth_gbps(int device, size_t bytes = size_t(2) << 30);
// The link's: the same kernel reading `bytes` of mapped pinned host memory, as the host lane's expert
// kernels read its cold experts (zero-copy over PCIe).
double cuda_host_read_bandwidth_gbps(int device, size_t bytes = size_t(512) << 20);
// Destroys this process's context on `device` (cudaDeviceReset): a process that only measured with it
// (a CPU peer's --split-share auto) gives its GPU memory back. Nothing of this process on that device
// may be used afterwards.
void cuda_release_device(int device);
// Per MoE layer, the round(fraction · n_expert) highest expert ids (a stand-in placement until a
// planned rowmap is given). fraction in [0, 1], else InputError.
std::vector<std::vector<int32_t>> cold_tail(const ModelConfig& cfg, double fraction);

// Counters of a CUDA engine's peer lane (nullopt for other engines and lanes). Syncs the device.
struct CudaPeerStats {
  peer::ClientStats client;  // handoffs, overruns, wait total / max / histogram (from the lane header)
  uint64_t rows_sent = 0, cold_slots = 0, routed_slots = 0;
  std::vector<LayerCheck> checks;  // [n_layer] check gate
};
std::optional<CudaPeerStats> cuda_peer_stats(const Engine& engine);

// Turns programmatic dependent launch on or off for the engine's later steps (drops its captured
// graphs), so a benchmark can compare both on one engine. Returns whether PDL is now on: never under
// TANDEM_PDL=0, before sm_90, or for an engine that is not a CUDA engine.
bool cuda_set_pdl(Engine& engine, bool on);

// Drops the engine's captured graphs (the next decode steps of each size run eagerly, then are
// captured again): for benchmarks that change a launch-time setting (KernelRepeat, the expert rows).
void cuda_drop_graphs(Engine& engine);
// The kernels' launch-time choices, process-wide (tuning knobs for benchmarks; the defaults are the
// measured best): the expert kernels' activation rows per pass (ExpertRowsPolicy in moe.cuh: at most
// expert_max_rows of 1, 2, 4 or 8; expert_by_count: sized by each expert's own rows; the same bits
// under every setting), the steps that take the tensor-core projection kernel (LinearPolicy in
// linear.cuh: at least linear_mma_min_rows rows, 0 never; results within f32 rounding of the other
// kernel's), the CUDA-core projection's warps per feature at one row (linear_row_split: 1, 2, 4, or
// 0 by the grid) and where its fused RMSNorm takes the scale from (linear_norm_prepass: a pass of
// its own, else the dot's pass; f32 rounding apart) and the blocks per multiprocessor its choice by
// the grid aims for (linear_split_target), the fewest positions a split block of MLA attention
// takes (mla_min_chunk, attention.cuh; f32 rounding apart), and whether small MLA decode steps build
// each row's new cache entry inside attention instead of in an mla_prep launch (mla_fresh_rows;
// f32 rounding apart), and the MLA decode steps of at most mla_fused_rows rows (0: none) that run
// q_b, the absorption, attention and the expansion as one cluster launch (mla_decode.cuh; f32
// rounding apart), and whether the expert blocks of one-row steps without a peer route the row
// themselves instead of after a routing launch (moe_route_in_gate_up, moe.cuh; the same bits), and
// whether the fused MLA decode asks L2 for its layer's o_proj, router and shared expert weights
// while HBM idles (mla_prefetch_moe, mla_decode.cuh), and whether the expert kernels' weight loads
// are marked evict-first in L2 (expert_evict_first, moe.cuh) (both hints: the same bits).
// cuda_set_kernel_policy checks the values and drops the engine's graphs.
struct CudaKernelPolicy {
  int expert_max_rows = 0;
  bool expert_by_count = false;
  int linear_mma_min_rows = 0;
  int linear_row_split = 0;
  bool linear_norm_prepass = false;
  int linear_split_target = 2;
  int mla_min_chunk = 16;
  bool mla_fresh_rows = true;
  int mla_fused_rows = 1;
  bool moe_route_in_gate_up = true;
  bool mla_prefetch_moe = true;
  bool expert_evict_first = true;
  int smem_carveout = -1;  // every kernel's shared-memory split, percent (-1: the driver's choice; launch.cuh)
  int mla_cluster = 4;     // blocks per (row, head) of the fused MLA decode: 4, 8 or 16 (mla_decode.cuh)
};
CudaKernelPolicy cuda_kernel_policy();
void cuda_set_kernel_policy(Engine& engine, const CudaKernelPolicy& p);

// GPU time per kernel of the calling thread's launches while the profile is alive: each launch
// through the backend's launch_kernel() is bracketed by two events (a diagnostic: eager steps only,
// since graph replays launch nothing on the host; run with graphs and PDL off so that kernels neither
// hide in a graph nor overlap). begin_step() queues a short device-side delay before the next launch,
// so the host can queue the whole step ahead of the GPU and host launch gaps do not count; end_step()
// (after the step synchronised) adds the step's times to the totals.
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
// with the grid: "linear_kernel<__nv_bfloat16, 1, true> [168x1x1]") contains name_part are issued
// twice in a row (never the peer lane's handoff kernels). A diagnostic for benchmarks: the results
// are wrong (an in-place norm runs twice, an accumulation adds twice), the time is right: a step with
// a kernel twice, less the step with it once, is that kernel's share of the step's critical path
// inside a graph with PDL, where the kernels' own times (KernelProfile) overlap. Graphs captured
// meanwhile keep the repeats: drop them (cuda_drop_graphs) before and after.
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

// Builds the engine on device `cuda.device`: uploads the model (the Model must outlive the engine).
// InputError for bad options (device index, cold lists, a context the GPU can't hold, weight dtypes,
// a peer lane that can't be attached or serves another fingerprint). The peer lane's forward() throws
// peer::LaneTripped / peer::LaneError when a handoff failed; that step's logits are never returned.
// KV capacity per sequence: options.max_ctx, or min(max_position_embeddings, 4096) when 0.
std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options, const CudaOptions& cuda);

}  // namespace tandem
