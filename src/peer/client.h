// The primary's side of the sidecar lane: attach to a peer's segment, hand rows to it, wait for the
// weighted rows. Rule: wait() returns only with the peer's answer. It spins up to the spin limit, then
// blocks with no deadline (counting an overrun); only a tripped lane (the watchdog), a stopped lane or
// an error status end a wait, and they throw. There is no path that proceeds without the answer.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "peer/protocol.h"
#include "peer/segment.h"
#include "peer/sync.h"

namespace tandem::peer {

// A request or the lane failed at run time. Attach-time problems (no lane, fingerprint or geometry
// mismatch, refused) are InputError instead: they are configuration, not run-time faults.
class LaneError : public std::runtime_error {
 public:
  enum class Kind {
    kTripped,   // the watchdog tripped the lane (LaneTripped)
    kStatus,    // the peer answered with an error status (status() says which)
    kProtocol,  // the peer broke the protocol (counters ahead or backwards, wrong echo)
    kStopped,   // the lane was shut down while a request was pending
  };
  LaneError(Kind kind, const std::string& what, Status status = Status::kOk)
      : std::runtime_error(what), kind_(kind), status_(status) {}
  Kind kind() const { return kind_; }
  Status status() const { return status_; }

 private:
  Kind kind_;
  Status status_;
};

class LaneTripped : public LaneError {
 public:
  LaneTripped(TripCause cause, const std::string& what) : LaneError(Kind::kTripped, what), cause_(cause) {}
  TripCause cause() const { return cause_; }

 private:
  TripCause cause_;
};

struct ClientOptions {
  // --peer-spin-limit, in microseconds: how long wait() spins on the response counter before it
  // blocks (futex, no deadline) and counts an overrun. 0 blocks at once.
  uint64_t spin_limit_us = 50;
  double attach_timeout_s = 30.0;         // for the segment to appear and the peer to accept us
  uint64_t heartbeat_interval_ms = 100;   // primary heartbeat thread period; 0 = no thread
  bool ring_per_request = true;  // testing aid: false publishes like a GPU's stream (no doorbell ring)
  // What the expected lane fingerprint is made of (0: unknown), written into the header's identity
  // line so that a mismatch names the part that differs in the fp1 form (rowmap or cold weights).
  uint64_t rowmap_fingerprint = 0;
  uint64_t weights_fingerprint = 0;
};

struct ClientStats {
  uint64_t handoffs = 0;  // successful waits
  uint64_t overruns = 0;  // waits that outlasted the spin limit
  uint64_t wait_ns_total = 0;
  uint64_t wait_ns_max = 0;
  std::array<uint64_t, kWaitBuckets> wait_hist{};  // bucket i: [2^(i-1), 2^i) µs; 0: < 1 µs
};

// The geometry lane `lane`'s peer published (validated), without attaching: waits up to timeout_s for
// the segment as attach does and leaves the lane untouched. A split primary reads the peer's cut here
// (Geometry::split_column) before it builds its half. InputError as Segment::open.
Geometry peek_geometry(const std::string& lane, double timeout_s);

class PeerClient {
 public:
  // Opens lane `lane` (waiting up to attach_timeout_s for it), checks magic, version, fingerprint and
  // geometry (hidden, dtype and split_column equal; n_slots, max_rows, max_k at least those asked),
  // claims the lane (writes pid and fingerprint) and waits until the peer accepts. Throws InputError
  // naming the mismatch; on a fingerprint or cut mismatch it still announces itself so that the peer
  // refuses too.
  static std::unique_ptr<PeerClient> attach(const std::string& lane, uint64_t expected_fingerprint,
                                            const Geometry& geometry, const ClientOptions& options = {});
  // The same over a segment this process already mapped (a peer thread in the same process).
  static std::unique_ptr<PeerClient> attach(std::shared_ptr<Segment> segment, uint64_t expected_fingerprint,
                                            const Geometry& geometry, const ClientOptions& options = {});

  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;
  // Shuts the lane down normally (state serving -> stopped; the peer then exits) unless it tripped.
  ~PeerClient();

  // Publishes a request on `slot` (which must not have one pending). Throws InputError when n_rows
  // is outside [0, max_rows] or k outside [1, max_k]; LaneTripped / LaneError when the lane is not serving.
  //   x       [n_rows, hidden] f32
  //   ids     [n_rows, k] i32, -1 = empty; the peer validates range and coldness
  //   weights [n_rows, k] f32
  void submit(int slot, int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights,
              int64_t k);
  // Waits for `slot`'s answer and copies it to out [n_rows, hidden]. Throws LaneTripped (naming the
  // cause and the watchdog's reason), LaneError (error status, protocol violation, lane stopped).
  void wait(int slot, float* out);
  // Slot 0 shorthands.
  void submit(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights, int64_t k) {
    submit(0, layer, x, n_rows, ids, weights, k);
  }
  void wait(float* out) { wait(0, out); }
  // Wakes a napping peer without a request: bumps the doorbell, and wakes the peer when it sleeps on
  // it. submit() does this itself; a primary whose requests a device publishes (a GPU's stream, which
  // cannot wake a futex) calls it on the host before each step, so its peer may nap between steps.
  void ring();

  ClientStats stats() const;
  const Geometry& geometry() const { return segment_->geometry(); }
  Segment& segment() { return *segment_; }
  // Stops heartbeats and shuts the lane down (as the destructor). Idempotent.
  void close();
  // Ends the lane from this side (Segment::trip: state tripped, the peer stops) and throws LaneTripped
  // with `cause` and `reason`: for faults the primary itself sees, e.g. a check gate below its bar.
  [[noreturn]] void trip(TripCause cause, const std::string& reason);

 private:
  PeerClient(std::shared_ptr<Segment> segment, const ClientOptions& options);
  void handshake(uint64_t expected_fingerprint, const Geometry& geometry);
  // Throws when the lane is not serving (tripped, stopped, refused, corrupt state, shrunk segment).
  void check_state(const char* during);
  // Trips the lane and throws when the segment shrank (kShrunk) or the peer process this primary
  // attached to is gone (kPeerGone). A system call each: for the blocked wait's naps.
  void check_peer(const char* during);
  // Trips the lane (kShrunk) when an access of this process hit the segment's truncated end.
  void check_faulted();
  void heartbeat_loop();
  void record_wait(uint64_t wait_ns, bool overrun);

  std::shared_ptr<Segment> segment_;
  ClientOptions options_;
  std::vector<uint64_t> sent_;        // per slot: last request seq published
  std::vector<uint64_t> done_;        // per slot: last response seq consumed
  std::vector<uint32_t> sent_rows_;   // per slot: n_rows of the pending request
  std::string broken_;                // set after a protocol violation: every later call throws
  ProcessHandle peer_;                // the peer process, pinned at attach
  bool peer_in_process_ = false;      // the peer is a thread of this process: nothing to pin
  bool peer_alive() const { return peer_in_process_ || peer_.alive(); }
  bool closed_ = false;
  std::thread heartbeat_;
  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;
  bool heartbeat_stop_ = false;
};

}  // namespace tandem::peer
