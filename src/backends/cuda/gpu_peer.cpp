// The CUDA engine's peer lane, host side (see gpu_peer.h). The segment is registered as mapped host
// memory once; the kernels write requests and read answers through device pointers into it, so no
// step ever waits on the host. The request counter the GPU continues from is the slot's current one.
#include "backends/cuda/gpu_peer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "moe/experts.h"

namespace tandem::cuda {

namespace {

template <class T>
T* dev_ptr(void* host_base, void* dev_base, const void* p) {
  return reinterpret_cast<T*>(static_cast<char*>(dev_base) +
                              (static_cast<const char*>(p) - static_cast<const char*>(host_base)));
}

}  // namespace

size_t GpuPeerLane::peer_sliced_bytes(const ExpertWeights& e) const {
  return sliced_bytes(e, split_begin_, e.gate.rows());
}

GpuPeerLane::GpuPeerLane(const Model& model, const std::vector<std::vector<int32_t>>& cold,
                         const GpuPeerOptions& options)
    : model_(model), lane_(options.lane), split_begin_(options.split_begin), check_min_(options.check_min) {
  const auto& c = model.cfg;
  peer::Geometry g;
  g.n_slots = 1;
  g.max_rows = 1;  // the least we need; steps are chunked by what the peer offers
  g.hidden = uint32_t(c.hidden_size);
  g.max_k = uint32_t(c.n_expert_used);
  g.split_column = uint32_t(options.split_begin);
  peer::ClientOptions co;
  co.spin_limit_us = options.spin_limit_us;
  co.attach_timeout_s = options.attach_timeout_s;
  client_ = peer::PeerClient::attach(options.lane, options.fingerprint, g, co);
  peer::Segment& seg = client_->segment();
  const peer::Geometry& have = seg.geometry();
  max_rows_ = int(have.max_rows);

  // Map the whole segment (header + slots) into the GPU's address space.
  void* base = &seg.header();
  const size_t bytes = size_t(peer::segment_bytes(have));
  cudaError_t err = cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("lane {}: cannot map the shared-memory segment ({} bytes) for the GPU: {}", lane_, bytes,
         cudaGetErrorString(err));
  }
  registered_ = base;
  void* dbase = nullptr;
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dbase, base, 0));
  peer::SlotView s = seg.slot(0);
  peer::Header& h = seg.header();
  dev_.req_seq = dev_ptr<unsigned long long>(base, dbase, &s.request->seq);
  dev_.req_layer = dev_ptr<int32_t>(base, dbase, &s.request->layer);
  dev_.req_n_rows = dev_ptr<uint32_t>(base, dbase, &s.request->n_rows);
  dev_.req_k = dev_ptr<uint32_t>(base, dbase, &s.request->k);
  dev_.resp_seq = dev_ptr<unsigned long long>(base, dbase, &s.response->seq);
  dev_.resp_status = dev_ptr<uint32_t>(base, dbase, &s.response->status);
  dev_.resp_n_rows = dev_ptr<uint32_t>(base, dbase, &s.response->n_rows);
  dev_.state = dev_ptr<uint32_t>(base, dbase, &h.state);
  dev_.x = dev_ptr<float>(base, dbase, s.x);
  dev_.ids = dev_ptr<int32_t>(base, dbase, s.ids);
  dev_.weights = dev_ptr<float>(base, dbase, s.weights);
  dev_.out = dev_ptr<float>(base, dbase, s.out);
  static_assert(offsetof(peer::Header, overruns) == offsetof(peer::Header, handoffs) + 8 &&
                offsetof(peer::Header, wait_ns_total) == offsetof(peer::Header, handoffs) + 16 &&
                offsetof(peer::Header, wait_ns_max) == offsetof(peer::Header, handoffs) + 24);
  dev_.h_counters = dev_ptr<unsigned long long>(base, dbase, &h.handoffs);
  dev_.h_hist = dev_ptr<unsigned long long>(base, dbase, &h.wait_hist[0]);
  dev_.hidden = int(have.hidden);
  dev_.max_k = int(have.max_k);
  dev_.spin_ns = options.spin_limit_us * 1000;

  // Device state: continue the slot's request counter; start from the header's counters.
  PeerDevState init{};
  init.sent = s.request->seq.load(std::memory_order_acquire);
  init.handoffs = h.handoffs.load(std::memory_order_relaxed);
  init.overruns = h.overruns.load(std::memory_order_relaxed);
  init.wait_ns_total = h.wait_ns_total.load(std::memory_order_relaxed);
  init.wait_ns_max = h.wait_ns_max.load(std::memory_order_relaxed);
  for (int i = 0; i < kPeerHistBuckets; ++i) init.hist[i] = h.wait_hist[i].load(std::memory_order_relaxed);
  st_ = static_cast<PeerDevState*>(device_alloc(sizeof(PeerDevState), "the peer lane's device state"));
  TANDEM_CUDA_CHECK(cudaMemcpy(st_, &init, sizeof init, cudaMemcpyHostToDevice));
  dev_.st = st_;
  layer_cold_slots_ = static_cast<unsigned long long*>(
      device_alloc(size_t(c.n_layer) * sizeof(unsigned long long), "the peer lane's per-layer counters"));
  TANDEM_CUDA_CHECK(cudaMemset(layer_cold_slots_, 0, size_t(c.n_layer) * sizeof(unsigned long long)));
  dev_.layer_cold_slots = layer_cold_slots_;
  h_err_ = static_cast<int*>(host_alloc(2 * sizeof(int), cudaHostAllocDefault, "the peer lane's error word"));
  h_err_[0] = h_err_[1] = 0;

  // Cold masks [n_expert + 1] per layer (the last entry: the shared expert, never cold).
  masks_.assign(size_t(c.n_layer), nullptr);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!c.layer_is_moe[size_t(l)]) continue;
    std::vector<uint8_t> m(size_t(c.n_expert) + 1, 0);
    if (size_t(l) < cold.size())
      for (int32_t e : cold[size_t(l)]) m[size_t(e)] = 1;
    masks_[size_t(l)] = static_cast<uint8_t*>(device_alloc(m.size(), "a cold expert mask"));
    TANDEM_CUDA_CHECK(cudaMemcpy(masks_[size_t(l)], m.data(), m.size(), cudaMemcpyHostToDevice));
  }
  checks_.assign(size_t(c.n_layer), LayerCheck{});
  spdlog::info("lane {}: attached the GPU (peer offers {} rows per request, spin limit {} us)", lane_, max_rows_,
               options.spin_limit_us);
}

GpuPeerLane::~GpuPeerLane() {
  for (uint8_t* m : masks_)
    if (m) cudaFree(m);
  if (st_) cudaFree(st_);
  if (layer_cold_slots_) cudaFree(layer_cold_slots_);
  if (h_err_) cudaFreeHost(h_err_);
  if (registered_) cudaHostUnregister(registered_);
  client_.reset();  // closes the lane: the peer exits and removes the segment
}

void GpuPeerLane::enqueue_error_readback(cudaStream_t stream) {
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(h_err_, &st_->err, 2 * sizeof(int), cudaMemcpyDeviceToHost, stream));
}

void GpuPeerLane::throw_if_failed() {
  if (failed_) std::rethrow_exception(failed_);
  const int code = h_err_[0], value = h_err_[1];
  if (code == kPeerOk) return;
  peer::Segment& seg = client_->segment();
  peer::Header& h = seg.header();
  peer::SlotView s = seg.slot(0);
  try {
    switch (PeerErr(code)) {
      case kPeerOk: break;
      case kPeerTripped: {
        const uint32_t cause = h.trip_cause.load(std::memory_order_acquire);
        const peer::TripCause tc = cause <= uint32_t(peer::TripCause::kProtocol) ? peer::TripCause(cause)
                                                                                 : peer::TripCause::kNone;
        throw peer::LaneTripped(tc, fmt::format("lane {} tripped ({}) while the GPU waited for the peer: {}", lane_,
                                                peer::cause_name(cause),
                                                peer::read_bounded(h.trip_reason, peer::kReasonBytes)));
      }
      case kPeerStopped:
        throw peer::LaneError(peer::LaneError::Kind::kStopped,
                              fmt::format("lane {} is {} while the GPU waited for the peer", lane_,
                                          peer::state_name(uint32_t(value))));
      case kPeerStatus: {
        const peer::Status st = uint32_t(value) < peer::kStatusCount ? peer::Status(value) : peer::Status::kComputeError;
        throw peer::LaneError(peer::LaneError::Kind::kStatus,
                              fmt::format("lane {}: the peer answered status {} for layer {}: {}", lane_,
                                          peer::status_name(uint32_t(value)), s.request->layer,
                                          peer::read_bounded(s.response->detail, peer::kDetailBytes)),
                              st);
      }
      case kPeerProtocol:
        throw peer::LaneError(peer::LaneError::Kind::kProtocol,
                              value >= 0 ? fmt::format("lane {}: response counter {} is not the request's (peer broke "
                                                       "the protocol)", lane_, value)
                                         : fmt::format("lane {}: response echoes {} rows, not the request's (peer "
                                                       "broke the protocol)", lane_, -(value + 1)));
    }
    throw peer::LaneError(peer::LaneError::Kind::kProtocol, fmt::format("lane {}: unknown GPU error {}", lane_, code));
  } catch (...) {
    failed_ = std::current_exception();
    throw;
  }
}

void GpuPeerLane::check(int64_t layer, int count) {
  if (h_err_[0] != kPeerOk || failed_) return;  // reported after the step
  TANDEM_CUDA_CHECK(cudaMemcpy(h_err_, &st_->err, 2 * sizeof(int), cudaMemcpyDeviceToHost));
  if (h_err_[0] != kPeerOk) return;
  peer::SlotView s = client_->segment().slot(0);
  const int64_t H = dev_.hidden, K = dev_.max_k;
  ref_.resize(size_t(count) * size_t(H));
  std::span<const ExpertWeights> experts = model_.layers[size_t(layer)].experts;
  if (split_begin_ > 0) {
    // Slice the experts this request names (ids were validated by the peer, which answered kOk).
    const size_t n_expert = experts.size();
    std::vector<uint8_t> named(n_expert, 0);
    size_t bytes = 0;
    for (int64_t i = 0; i < int64_t(count) * K; ++i) {
      const int32_t e = s.ids[i];
      if (e < 0 || size_t(e) >= n_expert || named[size_t(e)]) continue;
      named[size_t(e)] = 1;
      bytes += peer_sliced_bytes(experts[size_t(e)]) + 64;
    }
    sliced_bytes_.resize(bytes + 64);
    sliced_.assign(n_expert, ExpertWeights{});
    uint8_t* p = sliced_bytes_.data() + (64 - reinterpret_cast<uintptr_t>(sliced_bytes_.data()) % 64) % 64;
    for (size_t e = 0; e < n_expert; ++e) {
      if (!named[e]) continue;
      const ExpertWeights& full = experts[e];
      sliced_[e] = slice_expert(full, split_begin_, full.gate.rows(), p);
      p += peer_sliced_bytes(full);
    }
    experts = sliced_;
  }
  run_experts_cpu(experts, s.x, count, H, s.ids, s.weights, K, ref_.data(), global_pool());
  auto& chk = checks_[size_t(layer)];
  for (int r = 0; r < count; ++r) {
    bool any = false;
    for (int64_t j = 0; j < K; ++j) any |= s.ids[r * K + j] >= 0;
    if (any) check_row(chk, s.out + int64_t(r) * H, ref_.data() + int64_t(r) * H, H, check_min_, *client_, layer, r);
  }
}

GpuPeerLane::Stats GpuPeerLane::stats() const {
  PeerDevState st{};
  TANDEM_CUDA_CHECK(cudaMemcpy(&st, st_, sizeof st, cudaMemcpyDeviceToHost));
  Stats out;
  out.client = client_->stats();
  out.rows_sent = st.rows_sent;
  out.cold_slots = st.cold_slots;
  out.cold_slots_by_layer.resize(checks_.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(out.cold_slots_by_layer.data(), layer_cold_slots_,
                               out.cold_slots_by_layer.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace tandem::cuda
