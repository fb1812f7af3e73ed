// The model's weights on the GPU: matrices uploaded in their checkpoint dtype (fused where one launch
// can serve several: [q; k; v], [q_a; kv_a]), norm vectors and router biases widened to f32, routed
// and shared experts packed per layer with device-readable pointer tables. Cold experts of the host
// lane go to mapped pinned host memory instead of HBM. Owns every allocation it makes.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/moe.cuh"
#include "models/model.h"

namespace tandem::cuda {

struct DMat {
  const void* p = nullptr;  // [rows, cols] in wt
  WType wt = WType::kF32;
  int rows = 0, cols = 0;
  size_t bytes() const { return size_t(rows) * size_t(cols) * wtype_size(wt); }
};

struct DLayer {
  const float* attn_norm = nullptr;  // [H]
  const float* ffn_norm = nullptr;   // [H]
  DMat in_proj;                      // GQA [q; k; v]; MLA [q_a (or q); kv_a]
  DMat q_b;                          // MLA with q_lora
  DMat kv_b;                         // MLA [n_head * (nope + v), kv_lora]
  DMat uk_t;                         // MLA W_uk per head transposed: [n_head * kv_lora, nope] (query absorption)
  DMat o;                            // [H, n_head * v_width]
  const float* q_norm = nullptr;     // GQA q/k norms, f32
  const float* k_norm = nullptr;
  const float* q_a_norm = nullptr;   // MLA
  const float* kv_a_norm = nullptr;
  bool moe = false;
  DMat router;                       // [E, H]
  const float* router_bias = nullptr;  // [E] or null
  ExpertTable experts;               // routed [0, E) + shared at E (when present); dense: the MLP at 0
  bool has_shared = false;
  const void* shared_expert = nullptr;  // the shared expert's gate, up and down, one after the other in HBM
  size_t shared_expert_bytes = 0;
  size_t hot_bytes = 0, cold_bytes = 0;  // routed expert bytes in HBM / cold (pinned host memory or the peer)
};

// Owner of device allocations and mapped pinned host allocations, freed on destruction (with the
// device current at that time set by the caller). Lack of memory is an OutOfMemoryError naming `what`,
// the size and, for HBM, the free memory (device_alloc / host_alloc in cuda_common.cuh).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* device(size_t bytes, std::string_view what);       // at least 16 bytes, cudaMalloc-aligned
  void* host_mapped(size_t bytes, std::string_view what);  // pinned, mapped into the device's address space

 private:
  std::vector<void*> dev_;
  std::vector<void*> host_;
};

// One expert of a packed table: intermediate features [begin, end) of *w (end 0: up to its last), in
// HBM or in mapped pinned host memory. w null: nothing placed (a null table entry).
struct ExpertPart {
  const ExpertWeights* w = nullptr;
  bool host = false;
  int64_t begin = 0, end = 0;
};

// A packed layer: device-readable pointer tables [n] and the bytes placed on each side.
struct PackedExperts {
  const void* const* gate = nullptr;  // [n] -> [features, H]
  const void* const* up = nullptr;    // [n] -> [features, H]
  const void* const* down = nullptr;  // [n] -> [H, features]
  size_t device_bytes = 0, host_bytes = 0;
  const void* last_gate = nullptr;    // where the last part's gate went (its up and down follow it)
  bool last_host = false;             // ... in mapped pinned host memory
};

// Packs parts (indexed by expert id) into one HBM buffer and one mapped pinned host buffer owned by
// `mem`, each slice 16-byte aligned (the kernels' vector loads), and uploads the pointer tables.
// Every placed part must be loaded and share one dtype (InputError naming the layer otherwise).
PackedExperts pack_experts(DeviceMemory& mem, std::span<const ExpertPart> parts, int64_t layer);

// Where the cold experts go: all of each in mapped pinned host memory (the host lane), nowhere (the
// peer lane: their table entries are null), or their first `split_begin` intermediate features in
// mapped pinned host memory and the rest nowhere (the split lane: the peer computes the rest).
enum class ColdPlacement { kHost, kNone, kSplit };

class DeviceWeights {
 public:
  // cold: per layer, the cold experts (validated by the caller), placed as `placement` says.
  DeviceWeights(const Model& model, const std::vector<std::vector<int32_t>>& cold,
                ColdPlacement placement = ColdPlacement::kHost, int64_t split_begin = 0);
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  DMat embed, lm_head;
  const float* final_norm = nullptr;
  std::vector<DLayer> layers;

  // f32 device buffer of n floats (owned here).
  float* alloc_f32(size_t n);

 private:
  DMat upload(std::initializer_list<const TensorView*> parts, const char* what);
  const float* upload_f32(const TensorView& v);
  DMat upload_uk_t(const TensorView& kv_b, int n_head, int nope, int v_dim);
  ExpertTable upload_experts(const std::vector<const ExpertWeights*>& experts, const std::vector<bool>& cold,
                             int n_routed, DLayer& L, int64_t layer);

  ColdPlacement placement_ = ColdPlacement::kHost;
  int64_t split_begin_ = 0;
  DeviceMemory mem_;
};

}  // namespace tandem::cuda
