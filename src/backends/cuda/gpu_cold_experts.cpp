// The GPU peer's compute (see gpu_cold_experts.h). Per request: the ids and gate weights are rewritten
// into pinned staging (an empty slot becomes the stand-in expert n_expert with weight 0), x and the
// staging go to the device, group → gate_up → down → combine run on one stream, the rows come back and
// the stream is synchronized before compute() returns.
#include "backends/cuda/gpu_cold_experts.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_engine.h"
#include "core/error.h"

namespace tandem::cuda {

namespace {
// The peer runs the product's kernel choices (the engine's defaults); no diagnostics reach it.
constexpr KernelPolicy kPolicy{};
}  // namespace

GpuColdExperts::GpuColdExperts(const Model& model, const Rowmap& rowmap, int device, int64_t max_rows,
                               int64_t split_begin)
    : device_(device),
      hidden_(model.cfg.hidden_size),
      n_expert_(model.cfg.n_expert),
      max_rows_(max_rows),
      max_k_(model.cfg.n_expert_used) {
  const auto& c = model.cfg;
  const int n_dev = cuda_device_count();
  if (device_ < 0 || device_ >= n_dev) fail("cuda:{}: no such device ({} CUDA device(s) found)", device_, n_dev);
  TANDEM_CUDA_CHECK(cudaSetDevice(device_));
  const int64_t slots = max_rows_ * max_k_;
  if (max_rows_ < 1) fail("the GPU peer needs at least 1 row per request, not {}", max_rows_);
  if (n_expert_ + 1 > kMaxGroupExperts)
    fail("{} experts per layer exceed the GPU peer's limit of {}", n_expert_, kMaxGroupExperts - 1);
  if (slots > kMaxGroupSlots)
    fail("{} rows x {} experts per request exceed the GPU grouping's limit of {} slots (lower --max-rows)", max_rows_,
         max_k_, kMaxGroupSlots);

  cold_.assign(size_t(c.n_layer), std::vector<uint8_t>(size_t(n_expert_), 0));
  tables_.assign(size_t(c.n_layer), ExpertTable{});
  int64_t max_held = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::vector<ExpertPart> parts(size_t(n_expert_) + 1);  // the last: the empty slot's stand-in, never placed
    const ExpertWeights* first = nullptr;
    int64_t inter = 0;
    for (int64_t e = 0; e < n_expert_; ++e) {
      if (!c.layer_is_moe[size_t(l)] || !rowmap.is_cold(l, int32_t(e))) continue;
      const ExpertWeights& src = model.layers[size_t(l)].experts[size_t(e)];
      TANDEM_ASSERT(src.present(), "cold expert {}/{} not bound", l, e);
      if (first && src.gate.rows() != inter)
        fail("layer {}: cold experts differ in width ({} and {} features)", l, inter, src.gate.rows());
      inter = src.gate.rows();
      if (split_begin > 0 && split_begin >= inter)
        fail("split column {} is past the {} features of expert {}/{}", split_begin, inter, l, e);
      if (!first) first = &src;
      parts[size_t(e)] = {&src, false, split_begin, 0};
      cold_[size_t(l)][size_t(e)] = 1;
      ++n_cold_;
    }
    // Every layer gets a table (all null where nothing is cold), so a request of empty slots on any
    // layer the server accepts runs like any other.
    const PackedExperts packed = pack_experts(mem_, parts, l);
    ExpertTable& t = tables_[size_t(l)];
    t.gate = packed.gate;
    t.up = packed.up;
    t.down = packed.down;
    t.wt = first ? wtype_of(first->gate.dtype, "cold expert weights") : WType::kF32;
    t.hidden = int(hidden_);
    t.n_routed = int(n_expert_);  // ids below: `inter` features; the stand-in (id n_expert): shared_inter = 0
    t.inter = first ? int(inter - split_begin) : 0;
    t.shared_inter = 0;
    bytes_ += packed.device_bytes;
    max_held = std::max<int64_t>(max_held, t.inter);
  }
  h_stride_ = int(std::max<int64_t>(4, (max_held + 3) / 4 * 4));  // rows 16-byte aligned: the vector path

  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const size_t H = size_t(hidden_), R = size_t(max_rows_), S = size_t(slots);
  x_ = static_cast<float*>(mem_.device(R * H * 4, "peer request rows"));
  meta_ = static_cast<int32_t*>(mem_.device(2 * S * 4, "peer request ids and weights"));
  h_ = static_cast<float*>(mem_.device(S * size_t(h_stride_) * 4, "peer expert activations"));
  slot_out_ = static_cast<float*>(mem_.device(S * H * 4, "peer slot outputs"));
  out_ = static_cast<float*>(mem_.device(R * H * 4, "peer answers"));
  h_meta_ = mem_.host_mapped(2 * S * 4, "peer request staging");
  const size_t n_tot = size_t(n_expert_) + 1;
  work_.n_active = static_cast<int32_t*>(mem_.device(4, "expert grouping"));
  work_.act_expert = static_cast<int32_t*>(mem_.device(n_tot * 4, "expert grouping"));
  work_.act_offset = static_cast<int32_t*>(mem_.device(n_tot * 4, "expert grouping"));
  work_.act_count = static_cast<int32_t*>(mem_.device(n_tot * 4, "expert grouping"));
  work_.slot_list = static_cast<int32_t*>(mem_.device(S * 4, "expert grouping"));
  work_.n_cold = static_cast<int32_t*>(mem_.device(4, "expert grouping"));
  work_.cold_slots = static_cast<int32_t*>(mem_.device(S * 4, "expert grouping"));

  // Warm-up: one row through a cold expert with weight 0, so the kernels are loaded (and a broken
  // device fails) before the lane is served rather than in the first request.
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto it = std::find(cold_[size_t(l)].begin(), cold_[size_t(l)].end(), 1);
    if (it == cold_[size_t(l)].end()) continue;
    std::vector<float> x(H, 0.0f), out(H), w(size_t(max_k_), 0.0f);
    std::vector<int32_t> ids(size_t(max_k_), -1);
    ids[0] = int32_t(it - cold_[size_t(l)].begin());
    compute(int(l), x.data(), 1, ids.data(), w.data(), max_k_, out.data());
    break;
  }
}

GpuColdExperts::~GpuColdExperts() {
  cudaSetDevice(device_);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void GpuColdExperts::compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights,
                             int64_t k, float* out) {
  if (n_rows < 0 || n_rows > max_rows_ || k < 1 || k > max_k_)
    fail("a request of {} rows x {} slots exceeds the {} x {} this GPU peer reserved", n_rows, k, max_rows_, max_k_);
  const int64_t n_slots = n_rows * k;
  const std::vector<uint8_t>& cold = cold_[size_t(layer)];
  auto* h_ids = static_cast<int32_t*>(h_meta_);
  auto* h_w = reinterpret_cast<float*>(static_cast<char*>(h_meta_) + size_t(n_slots) * 4);
  bool any = false;
  for (int64_t i = 0; i < n_slots; ++i) {
    const int32_t e = ids[i];
    TANDEM_ASSERT(e >= -1 && e < n_expert_ && (e < 0 || cold[size_t(e)]), "expert {} of layer {} is not held here", e,
                  layer);
    any |= e >= 0;
    h_ids[i] = e < 0 ? int32_t(n_expert_) : e;
    h_w[i] = e < 0 ? 0.0f : weights[i];  // an empty slot's weight is not validated: never used
  }
  const size_t row_bytes = size_t(n_rows) * size_t(hidden_) * sizeof(float);
  if (!any) {  // nothing cold in the request: zero rows, no launch
    std::memset(out, 0, row_bytes);
    return;
  }
  TANDEM_CUDA_CHECK(cudaSetDevice(device_));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(x_, x, row_bytes, cudaMemcpyHostToDevice, stream_));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(meta_, h_meta_, size_t(n_slots) * 8, cudaMemcpyHostToDevice, stream_));
  const int32_t* d_ids = meta_;                                     // [n_slots]
  const auto* d_w = reinterpret_cast<const float*>(meta_ + n_slots);  // [n_slots]
  launch_group(d_ids, int(n_slots), int(n_expert_) + 1, nullptr, work_, stream_);
  ExpertRun r;
  r.x = x_;
  r.n = int(n_rows);
  r.slots_per_row = int(k);
  r.slot_weight = d_w;
  r.h = h_;
  r.h_stride = h_stride_;
  r.out = slot_out_;
  r.max_active = int(std::min<int64_t>(n_expert_ + 1, n_slots));
  const ExpertTable& t = tables_[size_t(layer)];
  launch_expert_gate_up(t, work_, r, kPolicy, stream_);
  launch_expert_down(t, work_, r, kPolicy, stream_);
  // out_[r] = Σ_j slot_out[r, j]; the combine also adds it into its residual argument: x_, spent by now.
  launch_moe_combine(slot_out_, int(n_rows), int(k), int(hidden_), out_, x_, stream_);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(out, out_, row_bytes, cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

PinnedRange::PinnedRange(void* base, size_t bytes) {
  const cudaError_t err = cudaHostRegister(base, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    spdlog::warn("cannot page-lock the {} bytes of the lane's segment for DMA ({}); copies go through the driver's "
                 "staging instead",
                 bytes, cudaGetErrorString(err));
    return;
  }
  base_ = base;
}

PinnedRange::~PinnedRange() {
  if (base_) cudaHostUnregister(base_);
}

}  // namespace tandem::cuda
