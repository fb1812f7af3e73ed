// The peer lane of the CUDA engine, host side: attaches to a `tandem peer` through PeerClient
// (handshake, fingerprint, heartbeat thread, close), maps the lane's segment into the GPU's address
// space (cudaHostRegister, mapped), owns the device-side sequence state and the per-layer cold masks,
// enqueues the submit / wait kernels, turns a failed wait into LaneTripped / LaneError after the step,
// and runs the check gate (the peer's rows vs the CPU expert kernels over the mmapped checkpoint).
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/peer_lane.cuh"
#include "models/model.h"
#include "moe/peer_lane.h"
#include "peer/client.h"

namespace tandem::cuda {

struct GpuPeerOptions {
  std::string lane;
  uint64_t fingerprint = 0;
  uint64_t spin_limit_us = 50;
  double attach_timeout_s = 30;
  int64_t split_begin = 0;  // split lane: the peer computes features [split_begin, inter) of each cold expert
  double check_min = 0.999;  // check gate bar: a checked row below it trips the lane (check_row)
};

class GpuPeerLane {
 public:
  // cold: [n_layer] lists (validated by the caller). Throws InputError when the lane can't be attached.
  GpuPeerLane(const Model& model, const std::vector<std::vector<int32_t>>& cold, const GpuPeerOptions& options);
  ~GpuPeerLane();
  GpuPeerLane(const GpuPeerLane&) = delete;
  GpuPeerLane& operator=(const GpuPeerLane&) = delete;

  int max_rows() const { return max_rows_; }
  const uint8_t* mask(int64_t layer) const { return masks_[size_t(layer)]; }  // [n_expert + 1] device
  const PeerDev& dev() const { return dev_; }

  // Wakes the peer if it napped (the stream's requests cannot wake it): called before a step is
  // enqueued, and in eager steps before each layer's request. Lets a peer with a finite --spin-us
  // sleep between bursts.
  void ring() { client_->ring(); }
  // After the step's work: copies the error word back (async, on stream).
  void enqueue_error_readback(cudaStream_t stream);
  // After the stream synced: throws the lane's failure (and every later call throws it again).
  void throw_if_failed();
  // Check gate for the handoff just answered (stream synced): layer's cold rows recomputed on the CPU
  // (in the split lane: the peer's share of each cold expert).
  void check(int64_t layer, int count);

  struct Stats {
    peer::ClientStats client;
    uint64_t rows_sent = 0, cold_slots = 0;
    std::vector<uint64_t> cold_slots_by_layer;  // [n_layer]
  };
  Stats stats() const;  // syncs the device
  const std::vector<LayerCheck>& checks() const { return checks_; }

 private:
  size_t peer_sliced_bytes(const ExpertWeights& e) const;

  const Model& model_;
  std::string lane_;
  std::unique_ptr<peer::PeerClient> client_;
  void* registered_ = nullptr;
  int max_rows_ = 0;
  PeerDev dev_;
  PeerDevState* st_ = nullptr;
  unsigned long long* layer_cold_slots_ = nullptr;  // [n_layer]
  int* h_err_ = nullptr;  // pinned [2]: err, err_value
  std::vector<uint8_t*> masks_;
  std::vector<LayerCheck> checks_;
  std::exception_ptr failed_;
  std::vector<float> ref_;
  int64_t split_begin_ = 0;
  double check_min_ = 0.999;
  std::vector<ExpertWeights> sliced_;  // check gate of the split lane: the peer's share of the checked experts
  std::vector<uint8_t> sliced_bytes_;
};

}  // namespace tandem::cuda
