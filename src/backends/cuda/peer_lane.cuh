// The peer lane's device side: the GPU writes a handoff straight into the lane's shared-memory slot
// (mapped host memory), publishes its request counter, and later waits on the response counter
// inside the stream (a polling kernel: no host round trip, works inside CUDA graphs), then writes
// the peer's rows into the step's slot outputs. Sequence numbers live in device memory, so one
// captured graph issues 1, 2, 3, ... on every replay. Protocol: docs/protocol.md ("GPU primary").
#pragma once

#include "backends/cuda/cuda_common.cuh"

namespace tandem::cuda {

// Error codes a wait kernel leaves in PeerDevState::err (0 = none). The host turns them into
// LaneTripped / LaneError after the step; the step's output is discarded.
enum PeerErr : int {
  kPeerOk = 0,
  kPeerTripped = 1,   // lane state tripped
  kPeerStopped = 2,   // lane state anything else but serving
  kPeerStatus = 3,    // the peer answered an error status (err_value = status)
  kPeerProtocol = 4,  // response counter outside [sent - 1, sent] or a wrong row echo (err_value = what was seen)
};

constexpr int kPeerHistBuckets = 32;

// Device memory, one per lane (zeroed, then `sent` set to the slot's current request counter).
struct PeerDevState {
  unsigned long long sent;         // last request seq published
  int pending;                     // the current chunk has a request in flight
  int err, err_value;              // PeerErr and its detail
  unsigned int blocks_done;        // submit kernel: blocks finished (last one publishes)
  unsigned int chunk_rows;         // submit kernel: rows of the chunk with at least one cold slot
  unsigned long long rows_sent, cold_slots;
  unsigned long long handoffs, overruns, wait_ns_total, wait_ns_max;
  unsigned long long hist[kPeerHistBuckets];
};

// Device-visible pointers into the mapped segment (slot 0) and the header's primary-written counters.
struct PeerDev {
  unsigned long long* req_seq = nullptr;
  int32_t* req_layer = nullptr;
  uint32_t* req_n_rows = nullptr;
  uint32_t* req_k = nullptr;
  const unsigned long long* resp_seq = nullptr;
  const uint32_t* resp_status = nullptr;
  const uint32_t* resp_n_rows = nullptr;
  const uint32_t* state = nullptr;  // header lane state
  float* x = nullptr;               // [max_rows, hidden]
  int32_t* ids = nullptr;           // [max_rows, max_k]
  float* weights = nullptr;         // [max_rows, max_k]
  const float* out = nullptr;       // [max_rows, hidden]
  unsigned long long* h_counters = nullptr;  // header: handoffs, overruns, wait_ns_total, wait_ns_max
  unsigned long long* h_hist = nullptr;      // header: wait_hist[32]
  int hidden = 0, max_k = 0;
  unsigned long long spin_ns = 0;   // spin limit; past it the wait naps and counts an overrun
  PeerDevState* st = nullptr;       // device memory
  unsigned long long* layer_cold_slots = nullptr;  // device memory [n_layer]: cold slots sent, per layer
};

// One handoff's rows: rows [r0, r0 + count) of the step; routing ids/weights [n, kS] (k routed slots
// first), cold_mask [n_experts + 1] (1 = on the peer). Writes x / ids (-1 where hot) / weights of every
// row into the slot, then the last block publishes the request (layer, count, k; seq + 1) when at
// least one row has a cold slot. count <= max_rows.
void launch_peer_submit(const PeerDev& d, int layer, const float* x, const int32_t* ids, const float* weights,
                        const uint8_t* cold_mask, int r0, int count, int kS, int k, cudaStream_t stream);
// Waits for the answer of the pending request (spin, then __nanosleep past the spin limit; ends early
// only when the lane state leaves serving), records the wait, and writes each row's peer output into
// its first cold slot of slot_out [n * kS, H] (zero into its other cold slots). accumulate (the split
// lane, where the GPU already wrote its share of every cold slot): adds the output into the first
// cold slot and leaves the others as they are.
void launch_peer_wait(const PeerDev& d, const int32_t* ids, const uint8_t* cold_mask, int r0, int count, int kS,
                      int k, bool accumulate, float* slot_out, cudaStream_t stream);

}  // namespace tandem::cuda
