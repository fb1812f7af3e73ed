// The CUDA forward pass (sm_90): the same function as CpuEngine, with weights resident in HBM in
// their checkpoint dtype (f32/bf16/f16, f32 activations and accumulation), an f32 KV cache on the
// GPU, MoE routing and expert grouping on the GPU, and decode steps replayed as CUDA graphs (one per
// batch size). Lanes: `local` keeps every expert in HBM; `host` keeps the listed cold experts in
// pinned host memory that the same expert kernels read over PCIe (zero-copy, one launch per step).
// Plain C++ header: usable from code built without nvcc (only when TANDEM_HAVE_CUDA is defined).
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace tandem {

enum class CudaLane { kLocal, kHost };

struct CudaOptions {
  int device = 0;
  CudaLane lane = CudaLane::kLocal;
  // Host lane: per layer ([n_layer] lists, or empty = none), the routed experts kept in pinned host
  // memory. Ids must be in range, unique, and only on MoE layers. Ignored by the local lane.
  std::vector<std::vector<int32_t>> cold;
  bool graphs = true;  // replay decode steps (one token per sequence) as CUDA graphs
};

// "cuda" -> 0, "cuda:N" -> N; nullopt for anything else ("cpu", "cuda:x", ...).
std::optional<int> parse_cuda_device(std::string_view device);
// Number of usable CUDA devices (0 without a driver or a device).
int cuda_device_count();
// Per MoE layer, the round(fraction · n_expert) highest expert ids (a stand-in placement until a
// planned rowmap is given). fraction in [0, 1], else InputError.
std::vector<std::vector<int32_t>> cold_tail(const ModelConfig& cfg, double fraction);

// Builds the engine on device `cuda.device`: uploads the model (the Model must outlive the engine).
// InputError for bad options (device index, cold lists, a context the GPU can't hold, weight dtypes).
// KV capacity per sequence: options.max_ctx, or min(max_position_embeddings, 4096) when 0.
std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options, const CudaOptions& cuda);

}  // namespace tandem
