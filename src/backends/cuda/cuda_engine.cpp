// The CUDA engine (see cuda_engine.h). One step = embed, per layer (norm, attention, norm, MoE or
// dense MLP), final norm of the wanted rows, lm_head; then the logits come back to the host.
// Per-step metadata (tokens, sequence slots, positions, logit rows) is copied to fixed device
// buffers first, so a decode step of n sequences is one graph launch for any positions and routing.
// Shapes: n = rows of the step, R = rows the scratch buffers hold, H = hidden, E = routed experts,
// kS = slots per row (top-k, plus one for the shared expert when the model has one).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_diagnostics.h"
#include "backends/cuda/cuda_engine.h"
#include "backends/cuda/cuda_weights.h"
#include "backends/cuda/gpu_peer.h"
#include "backends/cuda/kernel_policy.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/linear.cuh"
#include "backends/cuda/mla_decode.cuh"
#include "backends/cuda/moe.cuh"
#include "backends/cuda/norm.cuh"
#include "engine/rope.h"

namespace tandem {

using namespace cuda;

namespace {

constexpr int kMaxStepRows = 4096;

class CudaEngine final : public Engine {
 public:
  CudaEngine(const Model& model, const EngineOptions& options, const CudaOptions& cuda);
  ~CudaEngine() override;

  const Model& model() const override { return model_; }
  int add_sequence() override;
  void remove_sequence(int seq) override;
  int64_t seq_len(int seq) const override { return len_[size_t(seq)]; }
  int64_t max_ctx() const override { return ctx_; }
  // The cache is max_seqs slots of the whole context, allocated at start: a pool whose block is one
  // sequence's slot, so a scheduler admits against it and /metrics shows the slots in use.
  KvUsage kv_usage() const override {
    return {ctx_, int64_t(live_.size()), int64_t(std::count(live_.begin(), live_.end(), true))};
  }
  const std::vector<float>& forward(std::span<const Item> items, bool all_logits) override;
  std::optional<CudaPeerStats> peer_stats() const;
  bool set_pdl(bool on);
  void drop_graphs();
  const KernelPolicy& policy() const { return policy_; }
  void set_policy(const KernelPolicy& p);  // checked by the caller; drops the graphs captured under the old one

 private:
  void ensure_rows(int n);
  void sync();  // waits for the stream as CudaOptions::host_wait says
  // long_ctx: a row's position reaches kMlaFusedMaxPos (MLA decode then takes the unfused kernels).
  void enqueue_step(int n, int nw, bool single, bool long_ctx, bool hooked, bool checking);
  // fuse_norm: the first projection applies the layer's RMSNorm itself (no rms_norm launch before).
  void attention_gqa(int64_t l, const RowInfo& rows, bool fuse_norm);
  // fused: a decode step that may take launch_mla_decode (mla_decode.cuh) instead of four launches.
  void attention_mla(int64_t l, const RowInfo& rows, bool fuse_norm, bool single, bool fused);
  void moe(int64_t l, int n, bool hooked, bool checking, bool fuse_norm);
  void dense_mlp(int64_t l, int n);
  template <class T>
  T* scratch(size_t count);

  const Model& model_;
  const ModelConfig& c_;
  EngineOptions options_;
  CudaOptions cuda_;
  bool split_ = false;  // split lane: the GPU computes its share of the cold slots too; the peer's rows add in
  bool pdl_ok_ = false;  // neither TANDEM_PDL=0 nor a device before sm_90
  bool pdl_ = false;     // pdl_ok_ && cuda_.pdl (or set_pdl's choice)
  KernelPolicy policy_;  // the kernels' choices: the product's defaults unless a diagnostic set others
  int ctx_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;  // blocking-sync event the host sleeps on (host_wait sleep); null: spin
  std::unique_ptr<DeviceWeights> w_;
  std::vector<bool> live_;
  std::vector<int64_t> len_;

  // Model geometry.
  int H_ = 0, V_ = 0, E_ = 0, kS_ = 0, in_width_ = 0, att_width_ = 0, max_inter_ = 0;
  float scale_ = 1.0f;
  RopeTables rope_;
  std::vector<float*> k_cache_, v_cache_;  // per layer [slots, ctx, width]

  // Scratch for up to R rows (reallocated when a step needs more; graphs are then rebuilt).
  int R_ = 0;
  std::vector<void*> scratch_;
  int32_t* d_meta_ = nullptr;  // [4, R]: tokens | seq | pos | logit rows
  int32_t* h_meta_ = nullptr;  // pinned mirror
  float* h_logits_ = nullptr;  // pinned [R, V]
  float *x_ = nullptr, *h_ = nullptr, *hf_ = nullptr, *in_ = nullptr, *q_ = nullptr, *q_lat_ = nullptr,
        *o_lat_ = nullptr, *att_ = nullptr, *gate_logits_ = nullptr, *wts_ = nullptr,
        *hbuf_ = nullptr, *slot_out_ = nullptr, *moe_out_ = nullptr, *logits_d_ = nullptr;
  int32_t* ids_ = nullptr;
  MoeWork work_;
  MlaScratch mla_scratch_;  // split MLA attention's partials (allocated once: sized by the device)
  int max_active_ = 0;

  // Decode graphs per (batch size, long context): a step's key is 2 n + long_ctx.
  std::map<int, int> seen_;                   // decode steps run per key (capture on the second)
  std::map<int, cudaGraphExec_t> graphs_;     // per key
  std::vector<float> logits_;

  // Peer lane.
  std::unique_ptr<GpuPeerLane> peer_;
  int64_t peer_steps_ = 0;
  uint64_t routed_slots_ = 0;
};

CudaEngine::CudaEngine(const Model& model, const EngineOptions& options, const CudaOptions& cuda)
    : model_(model), c_(model.cfg), options_(options), cuda_(cuda), split_(cuda.lane == CudaLane::kSplit) {
  const int n_dev = cuda_device_count();
  if (cuda_.device < 0 || cuda_.device >= n_dev)
    fail("cuda:{}: no such device ({} CUDA device(s) found)", cuda_.device, n_dev);
  TANDEM_CUDA_CHECK(cudaSetDevice(cuda_.device));
  int cc_major = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, cuda_.device));
  const char* pdl_env = std::getenv("TANDEM_PDL");
  pdl_ok_ = cc_major >= 9 && !(pdl_env && std::strcmp(pdl_env, "0") == 0);
  pdl_ = pdl_ok_ && cuda_.pdl;
  if (options_.max_seqs < 1) fail("max_seqs must be at least 1");
  ctx_ = int(options_.max_ctx > 0 ? options_.max_ctx
                                  : std::min<int64_t>(c_.max_position_embeddings > 0 ? c_.max_position_embeddings : 4096,
                                                      4096));
  options_.max_ctx = ctx_;
  if (!c_.mla && ctx_ > max_gqa_ctx())
    fail("context {} exceeds the CUDA engine's limit of {} positions for GQA attention", ctx_, max_gqa_ctx());
  if (c_.mla && (c_.kv_lora_rank % 2 != 0 || c_.qk_rope_head_dim % 2 != 0 ||
                 c_.kv_lora_rank + c_.qk_rope_head_dim > kMlaMaxWidth))
    fail("MLA with kv_lora_rank {} and qk_rope_head_dim {}: the CUDA engine needs both even and their sum at most {}",
         c_.kv_lora_rank, c_.qk_rope_head_dim, kMlaMaxWidth);
  if (c_.n_group > 32) fail("n_group {} exceeds the GPU router's limit of 32", c_.n_group);
  if (c_.n_expert > kMaxRouteExperts)
    fail("{} routed experts exceed the GPU router's limit of {}", c_.n_expert, kMaxRouteExperts);
  std::vector<std::vector<int32_t>> cold;
  const bool uses_peer = cuda_.lane == CudaLane::kPeer || cuda_.lane == CudaLane::kSplit;
  if (cuda_.lane != CudaLane::kLocal) {
    // The lists come from a rowmap that placement/rowmap validated (or a stand-in made for this
    // model): a list outside the model is a caller's bug, and would index past the expert tables.
    TANDEM_ASSERT(cuda_.cold.empty() || int64_t(cuda_.cold.size()) == c_.n_layer, "{} cold lists for {} layers",
                  cuda_.cold.size(), c_.n_layer);
    for (size_t l = 0; l < cuda_.cold.size(); ++l) {
      std::vector<bool> seen(size_t(c_.n_expert), false);
      for (int32_t e : cuda_.cold[l]) {
        TANDEM_ASSERT(c_.layer_is_moe[l] && e >= 0 && e < c_.n_expert && !seen[size_t(e)],
                      "cold expert {} on layer {}: not a unique routed expert of a MoE layer", e, l);
        seen[size_t(e)] = true;
      }
    }
    cold = cuda_.cold;
  }
  if (uses_peer) {
    if (cuda_.peer.empty()) fail("the {} lane needs a lane name (--peer NAME)", split_ ? "split" : "peer");
    if (cuda_.peer_check < 0) fail("--peer-check {} is negative", cuda_.peer_check);
  }
  if (split_ && !(cuda_.split_begin > 0 && cuda_.split_begin < c_.moe_intermediate_size))
    fail("split column {} is outside the experts' {} intermediate features", cuda_.split_begin,
         c_.moe_intermediate_size);
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (cuda_.host_wait == CudaHostWait::kSleep)
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventBlockingSync | cudaEventDisableTiming));
  const ColdPlacement placement = cuda_.lane == CudaLane::kPeer    ? ColdPlacement::kNone
                                  : cuda_.lane == CudaLane::kSplit ? ColdPlacement::kSplit
                                                                   : ColdPlacement::kHost;
  w_ = std::make_unique<DeviceWeights>(model_, cold, placement, cuda_.split_begin);
  if (uses_peer) {
    GpuPeerOptions po;
    po.split_begin = split_ ? cuda_.split_begin : 0;
    po.lane = cuda_.peer;
    po.fingerprint = cuda_.peer_fingerprint;
    po.spin_limit_us = cuda_.peer_spin_limit_us;
    po.attach_timeout_s = cuda_.peer_attach_timeout_s;
    po.check_min = cuda_.check_min;
    peer_ = std::make_unique<GpuPeerLane>(model_, cold, po);
  }

  H_ = int(c_.hidden_size);
  V_ = int(c_.vocab_size);
  E_ = int(c_.n_expert);
  const bool shared = c_.n_shared_expert > 0;
  kS_ = int(c_.n_expert_used) + (shared ? 1 : 0);
  scale_ = float(c_.attn_scale());
  int64_t kv_width = 0;
  if (c_.mla) {
    const int q_width = int(c_.q_lora_rank > 0 ? c_.q_lora_rank : c_.n_head * (c_.qk_nope_head_dim + c_.qk_rope_head_dim));
    in_width_ = q_width + int(c_.kv_lora_rank + c_.qk_rope_head_dim);
    att_width_ = int(c_.n_head * c_.v_head_dim);
    kv_width = c_.kv_lora_rank + c_.qk_rope_head_dim;
  } else {
    in_width_ = int((c_.n_head + 2 * c_.n_head_kv) * c_.head_dim);
    att_width_ = int(c_.n_head * c_.head_dim);
    kv_width = c_.n_head_kv * c_.head_dim;
  }
  max_inter_ = int(std::max({c_.moe_intermediate_size, c_.shared_intermediate_size()}));
  int64_t dense_inter = 0;
  for (const auto& L : model_.layers)
    if (!L.moe) dense_inter = std::max(dense_inter, L.dense.gate.rows());
  max_inter_ = std::max<int>(max_inter_, int(dense_inter));

  // KV cache: every slot holds ctx positions of every layer.
  const size_t per_layer = size_t(options_.max_seqs) * size_t(ctx_) * size_t(kv_width) * (c_.mla ? 1 : 2);
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = per_layer * 4 * size_t(c_.n_layer);
  if (need + (size_t(1) << 30) > free_b)
    fail_out_of_memory("the KV cache for {} sequences of {} positions needs {:.2f} GiB; {:.2f} GiB of GPU memory are "
                       "free (lower --ctx or the number of sequences)",
                       options_.max_seqs, ctx_, double(need) / (1 << 30), double(free_b) / (1 << 30));
  for (int64_t l = 0; l < c_.n_layer; ++l) {
    if (c_.mla) {
      k_cache_.push_back(w_->alloc_f32(per_layer));
      v_cache_.push_back(nullptr);
    } else {
      k_cache_.push_back(w_->alloc_f32(per_layer / 2));
      v_cache_.push_back(w_->alloc_f32(per_layer / 2));
    }
  }

  // Rotary tables, taken from the CPU's Rope so both engines rotate by the same f32 numbers.
  const int dim = int(c_.mla ? c_.qk_rope_head_dim : c_.head_dim), half = dim / 2;
  Rope rope(c_, dim);
  std::vector<float> cs(size_t(ctx_) * half), sn(size_t(ctx_) * half), unit(static_cast<size_t>(dim));
  for (int p = 0; p < ctx_; ++p) {
    std::fill(unit.begin(), unit.begin() + half, 1.0f);
    std::fill(unit.begin() + half, unit.end(), 0.0f);
    rope.apply(unit.data(), 1, p, false);
    std::copy(unit.begin(), unit.begin() + half, cs.begin() + int64_t(p) * half);
    std::copy(unit.begin() + half, unit.end(), sn.begin() + int64_t(p) * half);
  }
  float* d_cos = w_->alloc_f32(cs.size());
  float* d_sin = w_->alloc_f32(sn.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d_cos, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  TANDEM_CUDA_CHECK(cudaMemcpy(d_sin, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  rope_ = {d_cos, d_sin, dim, c_.mla && c_.rope_interleave};
  if (c_.mla) {
    int n_sm = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, cuda_.device));
    const MlaScratchSize z = mla_scratch_size(n_sm, int(c_.kv_lora_rank));
    mla_scratch_.part = w_->alloc_f32(z.part_floats);
    mla_scratch_.tickets = reinterpret_cast<int*>(w_->alloc_f32(size_t(z.tickets)));
    TANDEM_CUDA_CHECK(cudaMemset(mla_scratch_.tickets, 0, size_t(z.tickets) * sizeof(int)));
    mla_scratch_.size = z;
  }

  live_.assign(size_t(options_.max_seqs), false);
  len_.assign(size_t(options_.max_seqs), 0);
  ensure_rows(int(std::max<int64_t>(options_.max_seqs, 32)));
}

CudaEngine::~CudaEngine() {
  cudaSetDevice(cuda_.device);
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [n, g] : graphs_) cudaGraphExecDestroy(g);
  peer_.reset();
  for (void* p : scratch_) cudaFree(p);
  if (h_meta_) cudaFreeHost(h_meta_);
  if (h_logits_) cudaFreeHost(h_logits_);
  w_.reset();
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaEngine::sync() {
  if (!done_) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(done_, stream_));
  TANDEM_CUDA_CHECK(cudaEventSynchronize(done_));
}

template <class T>
T* CudaEngine::scratch(size_t count) {
  scratch_.reserve(scratch_.size() + 1);  // the push below cannot throw once the memory is held
  const std::string what = fmt::format("step buffers of {} rows", R_);
  void* p = device_alloc(count * sizeof(T), what.c_str());
  scratch_.push_back(p);
  return static_cast<T*>(p);
}

void CudaEngine::drop_graphs() {
  TANDEM_CUDA_CHECK(cudaSetDevice(cuda_.device));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [k, g] : graphs_) TANDEM_CUDA_CHECK(cudaGraphExecDestroy(g));
  graphs_.clear();
  seen_.clear();
}

void CudaEngine::set_policy(const KernelPolicy& p) {
  drop_graphs();  // captured with the old choices
  policy_ = p;
}

bool CudaEngine::set_pdl(bool on) {
  drop_graphs();  // captured with the old setting
  pdl_ = pdl_ok_ && on;
  return pdl_;
}

void CudaEngine::ensure_rows(int n) {
  if (n <= R_) return;
  drop_graphs();
  for (void* p : scratch_) TANDEM_CUDA_CHECK(cudaFree(p));
  scratch_.clear();
  if (h_meta_) TANDEM_CUDA_CHECK(cudaFreeHost(h_meta_));
  if (h_logits_) TANDEM_CUDA_CHECK(cudaFreeHost(h_logits_));
  h_meta_ = nullptr, h_logits_ = nullptr;  // a failed allocation below must not leave them to be freed again
  int R = 32;
  while (R < n) R *= 2;
  R_ = std::min(R, kMaxStepRows);
  const size_t R8 = size_t(R_);
  const int nh = int(c_.n_head);
  d_meta_ = scratch<int32_t>(4 * R8);
  h_meta_ = static_cast<int32_t*>(host_alloc(4 * R8 * 4, cudaHostAllocDefault, "the step's metadata"));
  h_logits_ = static_cast<float*>(host_alloc(R8 * size_t(V_) * 4, cudaHostAllocDefault, "the step's logits"));
  x_ = scratch<float>(R8 * H_);
  h_ = scratch<float>(R8 * H_);
  hf_ = scratch<float>(R8 * H_);
  in_ = scratch<float>(R8 * in_width_);
  att_ = scratch<float>(R8 * att_width_);
  logits_d_ = scratch<float>(R8 * V_);
  if (c_.mla) {
    q_ = scratch<float>(R8 * nh * (c_.qk_nope_head_dim + c_.qk_rope_head_dim));
    q_lat_ = scratch<float>(R8 * nh * c_.kv_lora_rank);
    o_lat_ = scratch<float>(R8 * nh * c_.kv_lora_rank);
  }
  const size_t slots = R8 * size_t(kS_);
  hbuf_ = scratch<float>(std::max(slots, R8) * max_inter_);
  if (E_ > 0) {
    gate_logits_ = scratch<float>(R8 * E_);
    ids_ = scratch<int32_t>(slots);
    wts_ = scratch<float>(slots);
    slot_out_ = scratch<float>(slots * H_);
    moe_out_ = scratch<float>(R8 * H_);
    const int n_tot = E_ + 1;
    work_.n_active = scratch<int32_t>(1);
    work_.act_expert = scratch<int32_t>(n_tot);
    work_.act_offset = scratch<int32_t>(n_tot);
    work_.act_count = scratch<int32_t>(n_tot);
    work_.slot_list = scratch<int32_t>(slots);
    work_.n_cold = scratch<int32_t>(1);
    work_.cold_slots = scratch<int32_t>(slots);
  }
}

int CudaEngine::add_sequence() {
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i]) continue;
    live_[i] = true;
    len_[i] = 0;
    return int(i);
  }
  fail("all {} sequence slots are in use", live_.size());
}

void CudaEngine::remove_sequence(int seq) {
  TANDEM_ASSERT(seq >= 0 && size_t(seq) < live_.size() && live_[size_t(seq)], "bad sequence {}", seq);
  live_[size_t(seq)] = false;
  len_[size_t(seq)] = 0;
}

const std::vector<float>& CudaEngine::forward(std::span<const Item> items, bool all_logits) {
  // Validate everything before touching any state (the CPU engine's rules and messages).
  int64_t n = 0;
  std::vector<bool> seen(live_.size(), false);
  for (const auto& it : items) {
    if (it.seq < 0 || size_t(it.seq) >= live_.size() || !live_[size_t(it.seq)]) fail("sequence {} is not live", it.seq);
    if (seen[size_t(it.seq)]) fail("sequence {} appears twice in one batch", it.seq);
    seen[size_t(it.seq)] = true;
    if (it.tokens.empty()) fail("sequence {}: empty token run", it.seq);
    for (int32_t t : it.tokens)
      if (t < 0 || t >= c_.vocab_size) fail("token id {} out of range [0, {})", t, c_.vocab_size);
    const int64_t len = len_[size_t(it.seq)];
    if (len + int64_t(it.tokens.size()) > options_.max_ctx)
      fail("sequence {}: {} tokens exceed the context limit of {}", it.seq, len + int64_t(it.tokens.size()),
           options_.max_ctx);
    n += int64_t(it.tokens.size());
  }
  if (n > kMaxStepRows) fail("{} rows in one step exceed the CUDA engine's limit of {}", n, kMaxStepRows);
  logits_.clear();
  if (peer_) peer_->throw_if_failed();  // a failed lane fails every later request too
  if (n == 0) return logits_;
  if (peer_) peer_->ring();  // a napping peer wakes while the step is enqueued, before its first request
  TANDEM_CUDA_CHECK(cudaSetDevice(cuda_.device));
  ensure_rows(int(n));
  const PdlScope pdl(pdl_);  // every launch of this step, eager or captured
  // Metadata: tokens | seq | pos | logit rows, each R_ wide.
  int32_t* tok = h_meta_;
  int32_t* seq = h_meta_ + R_;
  int32_t* pos = h_meta_ + 2 * R_;
  int32_t* want = h_meta_ + 3 * R_;
  int r = 0, nw = 0;
  int32_t max_pos = 0;
  for (const auto& it : items) {
    for (size_t i = 0; i < it.tokens.size(); ++i, ++r) {
      tok[r] = it.tokens[i];
      seq[r] = it.seq;
      pos[r] = int32_t(len_[size_t(it.seq)] + int64_t(i));
      max_pos = std::max(max_pos, pos[r]);
      if (all_logits) want[nw++] = r;
    }
    if (!all_logits) want[nw++] = r - 1;
  }
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(d_meta_, h_meta_, size_t(4) * R_ * 4, cudaMemcpyHostToDevice, stream_));
  const bool hooked = bool(hooks.on_routing) || bool(hooks.on_moe);
  const bool checking = peer_ && cuda_.peer_check > 0 && peer_steps_ % cuda_.peer_check == 0;
  if (peer_) {
    ++peer_steps_;
    routed_slots_ += uint64_t(n) * uint64_t(c_.n_expert_used) * uint64_t(c_.n_moe_layers());
  }
  const bool decode = cuda_.graphs && !hooked && !checking && !all_logits && n == int64_t(items.size());
  const bool long_ctx = c_.mla && max_pos >= kMlaFusedMaxPos;
  const int key = 2 * int(n) + (long_ctx ? 1 : 0);
  if (decode && graphs_.count(key)) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(graphs_[key], stream_));
  } else if (decode && seen_[key] > 0) {
    // Second step of this key: capture it (the first ran eagerly, loading modules and attributes).
    cudaGraph_t graph = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    enqueue_step(int(n), nw, true, long_ctx, false, false);
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
    graphs_[key] = exec;
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  } else {
    if (decode) ++seen_[key];
    enqueue_step(int(n), nw, n == int64_t(items.size()), long_ctx, hooked, checking);
  }
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_d_, size_t(nw) * V_ * 4, cudaMemcpyDeviceToHost, stream_));
  if (peer_) peer_->enqueue_error_readback(stream_);
  sync();
  if (peer_) peer_->throw_if_failed();  // the step's logits are discarded
  logits_.assign(h_logits_, h_logits_ + size_t(nw) * V_);
  for (const auto& it : items) len_[size_t(it.seq)] += int64_t(it.tokens.size());
  return logits_;
}

// single: every row is its sequence's only row in the step (decode).
void CudaEngine::enqueue_step(int n, int nw, bool single, bool long_ctx, bool hooked, bool checking) {
  const RowInfo rows{d_meta_ + 2 * R_, d_meta_ + R_, n, ctx_};
  launch_embedding(w_->embed.p, w_->embed.wt, H_, d_meta_, n, x_, stream_);
  const float eps = c_.rms_norm_eps;
  // Small steps fold each RMSNorm into the projection that reads its output (one launch fewer each).
  const bool fuse = n <= kLinearNormRows;
  const bool mla_fused = single && !long_ctx && n <= policy_.mla_fused_rows;
  for (int64_t l = 0; l < c_.n_layer; ++l) {
    const DLayer& L = w_->layers[size_t(l)];
    if (!fuse) launch_rms_norm(x_, H_, nullptr, n, H_, L.attn_norm, eps, h_, H_, stream_);
    if (c_.mla)
      attention_mla(l, rows, fuse, single, mla_fused);
    else
      attention_gqa(l, rows, fuse);
    LinearArgs o;
    o.x = att_, o.x_stride = att_width_, o.n = n;
    o.w = L.o.p, o.wt = L.o.wt, o.M = H_, o.K = att_width_, o.w_ld = att_width_;
    o.y = x_, o.y_stride = H_, o.accumulate = true;
    launch_linear(o, policy_, stream_);
    if (!(fuse && L.moe)) launch_rms_norm(x_, H_, nullptr, n, H_, L.ffn_norm, eps, h_, H_, stream_);
    if (L.moe)
      moe(l, n, hooked, checking, fuse);
    else
      dense_mlp(l, n);
  }
  launch_rms_norm(x_, H_, d_meta_ + 3 * R_, nw, H_, w_->final_norm, eps, hf_, H_, stream_);
  LinearArgs lm;
  lm.x = hf_, lm.x_stride = H_, lm.n = nw;
  lm.w = w_->lm_head.p, lm.wt = w_->lm_head.wt, lm.M = V_, lm.K = H_, lm.w_ld = H_;
  lm.y = logits_d_, lm.y_stride = V_;
  launch_linear(lm, policy_, stream_);
}

void CudaEngine::attention_gqa(int64_t l, const RowInfo& rows, bool fuse_norm) {
  const DLayer& L = w_->layers[size_t(l)];
  LinearArgs in;
  in.x = h_, in.x_stride = H_, in.n = rows.n;
  if (fuse_norm) in.x = x_, in.norm_w = L.attn_norm, in.norm_eps = c_.rms_norm_eps;
  in.w = L.in_proj.p, in.wt = L.in_proj.wt, in.M = in_width_, in.K = H_, in.w_ld = H_;
  in.y = in_, in.y_stride = in_width_;
  launch_linear(in, policy_, stream_);
  GqaPrepArgs a;
  a.qkv = in_, a.stride = in_width_;
  a.n_head = int(c_.n_head), a.n_head_kv = int(c_.n_head_kv), a.head_dim = int(c_.head_dim);
  a.clip = float(c_.clip_qkv);
  switch (c_.qk_norm) {
    case QkNorm::kNone: a.qk_norm = 0; break;
    case QkNorm::kPerHead: a.qk_norm = 1; break;
    case QkNorm::kWhole: a.qk_norm = 2; break;
  }
  a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.eps = c_.rms_norm_eps;
  a.k_cache = k_cache_[size_t(l)], a.v_cache = v_cache_[size_t(l)];
  launch_gqa_prep(a, rows, rope_, stream_);
  launch_attention_gqa(a, rows, scale_, att_, stream_);
}

void CudaEngine::attention_mla(int64_t l, const RowInfo& rows, bool fuse_norm, bool single, bool fused) {
  const DLayer& L = w_->layers[size_t(l)];
  const int nh = int(c_.n_head), nope = int(c_.qk_nope_head_dim), rope = int(c_.qk_rope_head_dim);
  const int vd = int(c_.v_head_dim), lora = int(c_.kv_lora_rank), qk = nope + rope;
  LinearArgs in;
  in.x = h_, in.x_stride = H_, in.n = rows.n;
  if (fuse_norm) in.x = x_, in.norm_w = L.attn_norm, in.norm_eps = c_.rms_norm_eps;
  in.w = L.in_proj.p, in.wt = L.in_proj.wt, in.M = in_width_, in.K = H_, in.w_ld = H_;
  in.y = in_, in.y_stride = in_width_;
  launch_linear(in, policy_, stream_);
  MlaArgs a;
  a.fused = in_, a.stride = in_width_;
  a.q_lora = c_.q_lora_rank > 0;
  a.q_width = int(a.q_lora ? c_.q_lora_rank : nh * qk);
  a.q_a_norm = L.q_a_norm, a.kv_a_norm = L.kv_a_norm, a.eps = c_.rms_norm_eps;
  a.n_head = nh, a.nope = nope, a.rope = rope, a.v_dim = vd, a.kv_lora = lora;
  a.cache = k_cache_[size_t(l)];
  // Small decode steps skip mla_prep: q_b normalises q_a itself, attention builds each row's new cache
  // entry (attention.cuh, `fresh`).
  const bool fresh = single && fuse_norm && policy_.mla_fresh_rows && mla_fresh_applies(a);
  if (fresh && fused && L.uk_t.wt == L.q_b.wt && L.kv_b.wt == L.q_b.wt && mla_decode_applies(a, L.q_b.wt, policy_)) {
    MlaDecodeArgs d;
    d.a = a;
    d.q_b = L.q_b.p, d.uk_t = L.uk_t.p, d.kv_b = L.kv_b.p, d.wt = L.q_b.wt;
    d.out = att_, d.out_stride = att_width_;
    if (policy_.mla_prefetch_moe) {  // HBM idles through most of this launch: o_proj's, the router's and the
      d.after.add(L.o.p, L.o.bytes());  // shared expert's weights come next
      if (L.moe) d.after.add(L.router.p, L.router.bytes()), d.after.add(L.shared_expert, L.shared_expert_bytes);
    }
    launch_mla_decode(d, rows, rope_, scale_, policy_, stream_);
    return;
  }
  if (!fresh) launch_mla_prep(a, rows, rope_, stream_);
  const float* q = in_;
  int64_t q_stride = in_width_;
  if (a.q_lora) {
    LinearArgs qb;
    qb.x = in_, qb.x_stride = in_width_, qb.n = rows.n;
    if (fresh) qb.norm_w = L.q_a_norm, qb.norm_eps = c_.rms_norm_eps;
    qb.w = L.q_b.p, qb.wt = L.q_b.wt, qb.M = nh * qk, qb.K = a.q_width, qb.w_ld = a.q_width;
    qb.y = q_, qb.y_stride = nh * qk;
    launch_linear(qb, policy_, stream_);
    q = q_;
    q_stride = nh * qk;
  }
  // q_lat[:, head, :] = W_uk[head]ᵀ · q_nope[:, head], one batched launch over heads (W_uk stored transposed).
  LinearArgs uk;
  uk.x = q, uk.x_stride = q_stride, uk.n = rows.n;
  uk.w = L.uk_t.p, uk.wt = L.uk_t.wt, uk.M = lora, uk.K = nope, uk.w_ld = nope;
  uk.y = q_lat_, uk.y_stride = int64_t(nh) * lora;
  uk.batch = nh, uk.x_bstride = qk, uk.w_bstride = int64_t(lora) * nope, uk.y_bstride = lora;
  launch_linear(uk, policy_, stream_);
  launch_attention_mla(a, rows, q_lat_, q, q_stride, rope_, scale_, o_lat_, mla_scratch_, fresh, policy_,
                       stream_);
  // att[:, head, :] = W_uv[head] · o_lat[:, head, :], one batched launch over heads.
  LinearArgs up;
  up.x = o_lat_, up.x_stride = int64_t(nh) * lora, up.n = rows.n;
  up.w = static_cast<const char*>(L.kv_b.p) + size_t(nope) * lora * wtype_size(L.kv_b.wt);
  up.wt = L.kv_b.wt, up.M = vd, up.K = lora, up.w_ld = lora;
  up.y = att_, up.y_stride = att_width_;
  up.batch = nh, up.x_bstride = lora, up.w_bstride = int64_t(nope + vd) * lora, up.y_bstride = vd;
  launch_linear(up, policy_, stream_);
}

void CudaEngine::moe(int64_t l, int n, bool hooked, bool checking, bool fuse_norm) {
  const DLayer& L = w_->layers[size_t(l)];
  LinearArgs g;
  g.x = h_, g.x_stride = H_, g.n = n;
  if (fuse_norm)  // the router normalises x itself and leaves the normalised rows in h for the experts
    g.x = x_, g.norm_w = L.ffn_norm, g.norm_eps = c_.rms_norm_eps, g.norm_out = h_, g.norm_out_stride = H_;
  g.w = L.router.p, g.wt = L.router.wt, g.M = E_, g.K = H_, g.w_ld = H_;
  g.y = gate_logits_, g.y_stride = E_;
  launch_linear(g, policy_, stream_);
  RouteArgs ra;
  ra.logits = gate_logits_, ra.n = n, ra.n_expert = E_, ra.k = int(c_.n_expert_used);
  switch (c_.router) {
    case RouterKind::kSoftmaxTopK: ra.kind = RouteKind::kSoftmaxTopK; break;
    case RouterKind::kSigmoidGroupTopK: ra.kind = RouteKind::kSigmoidGroupTopK; break;
  }
  ra.norm_topk = c_.norm_topk_prob, ra.routed_scaling = c_.routed_scaling_factor;
  ra.n_group = int(c_.n_group), ra.topk_group = int(c_.topk_group), ra.bias = L.router_bias;
  ra.shared_slot = L.has_shared, ra.ids = ids_, ra.weights = wts_;
  const int kS = ra.k + (L.has_shared ? 1 : 0);
  const int n_tot = E_ + (L.has_shared ? 1 : 0);
  const uint8_t* mask = peer_ ? peer_->mask(l) : nullptr;
  ExpertRun run;
  run.x = h_, run.n = n, run.slots_per_row = kS, run.slot_weight = wts_;
  run.h = hbuf_, run.h_stride = max_inter_, run.out = slot_out_;
  run.max_active = std::min(n * kS, n_tot);
  run.evict_first = policy_.expert_evict_first;
  // One row and no peer: the expert blocks route the row themselves (moe.cuh), one launch fewer.
  const bool routed =
      !peer_ && policy_.moe_route_in_gate_up && launch_expert_gate_up_routed(ra, n_tot, L.experts, work_, run, stream_);
  if (!routed) launch_route_group(ra, n_tot, split_ ? nullptr : mask, work_, stream_);
  if (hooked && hooks.on_routing) {
    std::vector<int32_t> ids(size_t(n) * kS);
    std::vector<float> wts(size_t(n) * kS);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_, ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(wts.data(), wts_, wts.size() * 4, cudaMemcpyDeviceToHost, stream_));
    sync();
    Routing routing;
    routing.n_rows = n;
    routing.k = ra.k;
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < ra.k; ++j) {
        routing.ids.push_back(ids[size_t(r) * kS + j]);
        routing.weights.push_back(wts[size_t(r) * kS + j]);
      }
    hooks.on_routing(l, routing);
  }
  // Peer lane: the first chunk of rows goes to the peer before the hot experts run, so the CPU
  // computes the cold experts while the GPU computes the hot ones; later chunks (steps with more rows
  // than a request holds) follow one after the other.
  // Eager steps ring at every layer too: a hook or the check gate may hold the host (and so the GPU)
  // longer than the peer spins, and the stream's request cannot wake it (graph replays ring per step).
  const int chunk = peer_ ? peer_->max_rows() : 0;
  if (peer_) {
    peer_->ring();
    launch_peer_submit(peer_->dev(), int(l), h_, ids_, wts_, mask, 0, std::min(n, chunk), kS, ra.k, stream_);
  }
  if (!routed) launch_expert_gate_up(L.experts, work_, run, policy_, stream_);
  launch_expert_down(L.experts, work_, run, policy_, stream_);
  for (int r0 = 0; peer_ && r0 < n; r0 += chunk) {
    const int count = std::min(n - r0, chunk);
    if (r0 > 0) launch_peer_submit(peer_->dev(), int(l), h_, ids_, wts_, mask, r0, count, kS, ra.k, stream_);
    launch_peer_wait(peer_->dev(), ids_, mask, r0, count, kS, ra.k, split_, slot_out_, stream_);
    if (checking) {
      sync();
      peer_->check(l, count);
    }
  }
  launch_moe_combine(slot_out_, n, kS, H_, moe_out_, x_, stream_);
  if (hooked && hooks.on_moe) {
    std::vector<float> in(size_t(n) * H_), out(size_t(n) * H_);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(in.data(), h_, in.size() * 4, cudaMemcpyDeviceToHost, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(out.data(), moe_out_, out.size() * 4, cudaMemcpyDeviceToHost, stream_));
    sync();
    hooks.on_moe(l, in.data(), out.data(), n);
  }
}

void CudaEngine::dense_mlp(int64_t l, int n) {
  const DLayer& L = w_->layers[size_t(l)];
  ExpertRun run;
  run.x = h_, run.n = n, run.slots_per_row = 1;
  run.h = hbuf_, run.h_stride = max_inter_, run.out = x_, run.dense = true;
  run.evict_first = policy_.expert_evict_first;
  launch_expert_gate_up(L.experts, work_, run, policy_, stream_);
  launch_expert_down(L.experts, work_, run, policy_, stream_);
}

std::optional<CudaPeerStats> CudaEngine::peer_stats() const {
  if (!peer_) return std::nullopt;
  auto st = peer_->stats();
  CudaPeerStats out;
  out.client = st.client;
  out.rows_sent = st.rows_sent;
  out.cold_slots = st.cold_slots;
  out.routed_slots = routed_slots_;
  out.cold_slots_by_layer = std::move(st.cold_slots_by_layer);
  // Every MoE layer routes the same rows: the step's rows times k, counted once per MoE layer.
  const uint64_t per_layer = c_.n_moe_layers() ? routed_slots_ / uint64_t(c_.n_moe_layers()) : 0;
  out.routed_slots_by_layer.assign(size_t(c_.n_layer), 0);
  for (int64_t l = 0; l < c_.n_layer; ++l)
    if (c_.layer_is_moe[size_t(l)]) out.routed_slots_by_layer[size_t(l)] = per_layer;
  out.checks = peer_->checks();
  return out;
}

}  // namespace

std::optional<CudaPeerStats> cuda_peer_stats(const Engine& engine) {
  const auto* e = dynamic_cast<const CudaEngine*>(&engine);
  return e ? e->peer_stats() : std::nullopt;
}

bool cuda_set_pdl(Engine& engine, bool on) {
  auto* e = dynamic_cast<CudaEngine*>(&engine);
  return e ? e->set_pdl(on) : false;
}

void cuda_drop_graphs(Engine& engine) {
  if (auto* e = dynamic_cast<CudaEngine*>(&engine)) e->drop_graphs();
}


namespace {
CudaEngine& cuda_engine(Engine& engine) {
  auto* e = dynamic_cast<CudaEngine*>(&engine);
  TANDEM_ASSERT(e, "a CUDA diagnostic called on an engine that is not a CUDA engine");
  return *e;
}
}  // namespace

CudaKernelPolicy cuda_kernel_policy(Engine& engine) { return cuda_engine(engine).policy(); }

void cuda_set_kernel_policy(Engine& engine, const CudaKernelPolicy& p) {
  const int rows = p.expert_max_rows;
  if (!(rows == 1 || rows == 2 || rows == 4 || rows == 8)) fail("expert rows per pass: {} is not 1, 2, 4 or 8", rows);
  if (p.linear_mma_min_rows < 0)
    fail("tensor-core projection rows: {} is not 0 (never) or more", p.linear_mma_min_rows);
  const int split = p.linear_row_split;
  if (!(split == 0 || split == 1 || split == 2 || split == 4))
    fail("warps per projection feature: {} is not 0 (by the grid), 1, 2 or 4", split);
  if (p.linear_split_target < 1 || p.linear_split_target > 64)
    fail("projection blocks per multiprocessor: {} is not 1 to 64", p.linear_split_target);
  if (p.mla_min_chunk < 1 || p.mla_min_chunk > 1024)
    fail("MLA split chunk: {} positions is not 1 to 1024", p.mla_min_chunk);
  if (p.mla_fused_rows < 0 || p.mla_fused_rows > kLinearNormRows)
    fail("fused MLA decode rows: {} is not 0 (never) to {}", p.mla_fused_rows, kLinearNormRows);
  if (!(p.mla_cluster == 4 || p.mla_cluster == kMlaCluster))
    fail("fused MLA decode cluster: {} blocks is not 4 or {}", p.mla_cluster, kMlaCluster);
  cuda_engine(engine).set_policy(p);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options, const CudaOptions& cuda) {
  return std::make_unique<CudaEngine>(model, options, cuda);
}

}  // namespace tandem
