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
  // (split). Ids in range, unique, and only on MoE layers (a rowmap validated against the model
  // guarantees it). Ignored by the local lane.
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

// Counters of a CUDA engine's peer lane (nullopt for other engines and lanes). Syncs the device.
struct CudaPeerStats {
  peer::ClientStats client;  // handoffs, overruns, wait total / max / histogram (from the lane header)
  uint64_t rows_sent = 0, cold_slots = 0, routed_slots = 0;
  std::vector<uint64_t> routed_slots_by_layer, cold_slots_by_layer;  // [n_layer]
  std::vector<LayerCheck> checks;  // [n_layer] check gate
};
std::optional<CudaPeerStats> cuda_peer_stats(const Engine& engine);

// Builds the engine on device `cuda.device`: uploads the model (the Model must outlive the engine).
// InputError for bad options (device index, weight dtypes, a peer lane that can't be attached or
// serves another fingerprint); OutOfMemoryError where the weights, the KV cache or the step buffers do
// not fit (the device's or the host's pinned memory). Cold lists must be valid for the model (as
// placement/rowmap validates them): one that is not is a bug (TANDEM_ASSERT). The kernels run the
// product's choices; cuda_diagnostics.h (benchmarks, tests) changes them. The peer lane's forward()
// throws peer::LaneTripped / peer::LaneError when a handoff failed; that step's logits are never
// returned. KV capacity per sequence: options.max_ctx, or min(max_position_embeddings, 4096) when 0.
std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options, const CudaOptions& cuda);

}  // namespace tandem
