// The peer's side of the sidecar lane: owns the segment, accepts one primary (same fingerprint),
// serves requests on every slot until stopped. Every field read from shared memory is copied once and
// validated (layer, n_rows, k, expert ids in range and cold here, finite weights) before use; a bad
// request gets an error status and the loop keeps serving.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "peer/compute.h"
#include "peer/protocol.h"
#include "peer/segment.h"

namespace tandem::peer {

struct ServerOptions {
  uint64_t spin_us = 100;        // spin on the slots this long after the last request before sleeping
  double primary_stall_s = 2.0;  // a primary whose heartbeat is older than this counts as gone
  uint64_t idle_nap_ms = 10;     // futex nap while idle: how often stop, state and liveness are checked
  // A primary whose requests come without a doorbell ring (a GPU's stream publishes them; its host
  // rings once per step) leaves a napping peer asleep until the nap ends. After the second request
  // found that way, the peer spins at least this long after each request from then on (logged once).
  uint64_t unrung_spin_us = 50'000;
};

// The exit code of a lane process that stopped because the segment was damaged under it (ServeEnd::
// kCorrupt / kShrunk; a primary's LaneTripped with cause corrupt or shrunk): not 0 (a normal stop), not
// 1 (a lane fault the protocol knows), not 2 (bad input at start).
inline constexpr int kExitLaneDamaged = 4;

// Why serve() returned.
enum class ServeEnd {
  kStopped,      // request_stop() (SIGTERM / SIGINT)
  kLaneStopped,  // the primary shut the lane down normally
  kTripped,      // the watchdog tripped the lane
  kPrimaryGone,  // the primary's pid vanished or its heartbeat went stale
  kRefused,      // a primary with another fingerprint attached; refused
  kCorrupt,      // a header field the protocol keeps fixed changed: the lane is tripped (cause corrupt)
  kShrunk,       // the segment file was truncated under the lane: tripped (cause shrunk)
};
const char* to_string(ServeEnd e);

class PeerServer {
 public:
  // Creates the lane's segment (Segment::create) for `compute`. Throws InputError.
  // rowmap_fp / weights_fp: what `fingerprint` is made of (Segment::create), for mismatch messages.
  static std::unique_ptr<PeerServer> create(const std::string& lane, uint64_t fingerprint, const Geometry& geometry,
                                            PeerCompute& compute, const ServerOptions& options = {},
                                            uint64_t rowmap_fp = 0, uint64_t weights_fp = 0);
  // Serves a segment made by Segment::create (e.g. shared with a client thread in tests and benches).
  PeerServer(std::shared_ptr<Segment> segment, PeerCompute& compute, const ServerOptions& options = {});
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;
  ~PeerServer();

  // Marks the lane serving and serves until one of ServeEnd happens. On return the lane state is
  // stopped (unless tripped/refused), a waiting primary is woken and the segment name is removed.
  ServeEnd serve();
  // Async-signal-safe: serve() returns kStopped soon after.
  void request_stop() { stop_.store(true, std::memory_order_relaxed); }
  Segment& segment() { return *segment_; }
  uint64_t served() const { return served_.load(); }
  // The spin in force: options.spin_us, or unrung_spin_us once the primary proved not to ring.
  uint64_t spin_us() const { return spin_us_.load(std::memory_order_relaxed); }

 private:
  bool handle_attach();  // false when the primary was refused
  bool primary_gone(uint64_t now);
  // Empty while every field the protocol keeps fixed (identity line, geometry, our pid, the accepted
  // primary's pid, a known state) still holds its value; otherwise what changed.
  std::string header_damage();
  bool any_pending();
  void serve_one(uint32_t slot, uint64_t seq);
  // Validates the request of `slot` into ids_/weights_; returns kOk or the status, with detail_ set.
  Status validate(SlotView s, int32_t layer, uint32_t n_rows, uint32_t k);
  ServeEnd finish(ServeEnd end);
  // A request was pending when a nap ended without a ring: see ServerOptions::unrung_spin_us.
  void note_unrung_request();

  std::shared_ptr<Segment> segment_;
  PeerCompute& compute_;
  ServerOptions options_;
  std::atomic<bool> stop_{false};
  std::vector<uint64_t> answered_;  // per slot: last request seq answered
  std::array<uint8_t, kCacheLine> identity_{};  // header line 0 as created, compared by header_damage()
  uint32_t acked_attach_ = 0;
  int32_t primary_pid_ = 0;  // 0 until a primary is accepted
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> spin_us_{0};
  int unrung_seen_ = 0;
  std::vector<int32_t> ids_;    // [max_rows, max_k] private copy of the request's ids
  std::vector<float> weights_;  // [max_rows, max_k]
  std::string detail_;
};

// Routes SIGTERM and SIGINT to server.request_stop() (one server per process).
void install_stop_signals(PeerServer& server);

}  // namespace tandem::peer
