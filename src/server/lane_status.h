// What the server shows of the lane (health, metrics, the page): a snapshot taken on the engine thread
// between steps, where the lane's counters are not being written, so a LaneStatus needs no locking.
// The command that builds the runtime implements it (the server library knows no lane types).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::server {

struct LaneSnapshot {
  std::string name = "local";  // --lane: local, host, peer, split
  bool serving = true;         // false: tripped, stopped, or the peer process is gone
  std::string state = "serving";
  std::string reason;          // why not serving ("" while serving)
  bool has_peer = false;       // peer and split lanes: the counters below mean something
  int64_t peer_pid = 0;        // the peer process (0: none, or not known)
  uint64_t restarts = 0;       // fresh lanes started after a trip (--restart-lane)
  uint64_t handoffs = 0, overruns = 0, rows_sent = 0;
  uint64_t routed_slots = 0, cold_slots = 0;  // (row, expert) pairs routed, all / to cold experts
  std::vector<uint64_t> routed_slots_by_layer, cold_slots_by_layer;  // [n_layer], the same per layer
  uint64_t wait_ns_total = 0;
  std::vector<uint64_t> wait_hist;  // handoff waits: bucket i holds [2^(i-1), 2^i) µs; bucket 0: < 1 µs
  int64_t checks = 0;               // check-gate rows compared, all layers
  double check_min_cosine = 1.0;    // lowest cosine the check gate saw (1 when none)
};

class LaneStatus {
 public:
  virtual ~LaneStatus() = default;
  // Called on the engine thread only, between steps.
  virtual LaneSnapshot snapshot() = 0;
};

}  // namespace tandem::server
