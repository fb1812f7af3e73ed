// The lane watchdog: a separate process that reads a lane's shared counters and turns a stalled or
// orphaned lane into a clean stop. StallDetector is the pure decision (fed samples and times, so it is
// tested without clocks); run_watchdog is the loop and the actions (trip, stop processes, remove the
// segment, log one JSON line, run the rollback command).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::watchdog {

enum class Mode { kEnforce, kObserve };

struct WatchdogOptions {
  std::string lane;
  double stall_s = 2.0;            // pending work with a response counter that has not moved this long trips
  Mode mode = Mode::kEnforce;
  std::string rollback;            // run via /bin/sh -c after a trip (enforce) when not empty
  double grace_s = 2.0;            // SIGTERM, then SIGKILL after this long
  double poll_s = 0.0;             // 0: min(stall / 10, 0.1 s)
  double startup_timeout_s = 30.0; // how long to wait for the lane's segment to appear
};

struct SlotSample {
  uint64_t req_seq = 0;   // read after resp_seq, so a healthy lane always has resp_seq <= req_seq
  uint64_t resp_seq = 0;
};

struct LaneSample {
  uint32_t state = 0;        // raw LaneState
  bool peer_alive = true;
  bool primary_alive = true; // true while no primary is attached
  std::vector<SlotSample> slots;
};

enum class Verdict {
  kHealthy,
  kStopped,      // the lane was shut down normally (state stopped)
  kTripped,      // already tripped (by another watchdog)
  kStall,
  kPeerGone,
  kPrimaryGone,
  kProtocol,     // a counter went backwards or the response got ahead of the request
};
const char* to_string(Verdict v);

struct Finding {
  Verdict verdict = Verdict::kHealthy;
  int slot = -1;           // for kStall and kProtocol
  double stalled_s = 0.0;  // kStall: seconds since the response counter last moved while work was pending
  std::string detail;
};

class StallDetector {
 public:
  StallDetector(double stall_s, size_t n_slots);
  // Feeds one sample taken at now_ns (monotonic). Returns the worst finding of this sample.
  Finding observe(uint64_t now_ns, const LaneSample& sample);

 private:
  struct SlotTrack {
    uint64_t last_req = 0;
    uint64_t last_resp = 0;
    uint64_t since_ns = 0;  // when the response counter last moved or work last became pending
    bool pending = false;
  };
  uint64_t stall_ns_;
  std::vector<SlotTrack> tracks_;
  bool started_ = false;
};

// Watches the lane until it stops (exit 0) or trips (enforce: exit 1 after acting). Observe mode logs
// each episode once and keeps watching. Throws InputError (bad options, no such lane, bad segment).
int run_watchdog(const WatchdogOptions& options);

}  // namespace tandem::watchdog
