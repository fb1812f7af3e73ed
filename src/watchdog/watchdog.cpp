// The lane watchdog (see watchdog.h). Enforce order after a trip: reason + cause, state = tripped
// (release) and futex wake-ups (in-flight waits fail at once), SIGTERM (+SIGCONT for a frozen process),
// SIGKILL after the grace period, shm_unlink, rollback, then one JSON line on stdout.
#include "watchdog/watchdog.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "peer/protocol.h"
#include "peer/segment.h"
#include "peer/sync.h"

namespace tandem::watchdog {

using peer::LaneState;
using peer::TripCause;

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kHealthy: return "healthy";
    case Verdict::kStopped: return "stopped";
    case Verdict::kTripped: return "tripped";
    case Verdict::kStall: return "stall";
    case Verdict::kPeerGone: return "peer_gone";
    case Verdict::kPrimaryGone: return "primary_gone";
    case Verdict::kProtocol: return "protocol";
  }
  return "unknown";
}

StallDetector::StallDetector(double stall_s, size_t n_slots)
    : stall_ns_(uint64_t(stall_s * 1e9)), tracks_(n_slots) {}

Finding StallDetector::observe(uint64_t now_ns, const LaneSample& sample) {
  Finding f;
  if (sample.state == uint32_t(LaneState::kStopped)) {
    f.verdict = Verdict::kStopped;
    return f;
  }
  if (sample.state == uint32_t(LaneState::kTripped)) {
    f.verdict = Verdict::kTripped;
    return f;
  }
  if (sample.slots.size() != tracks_.size()) {
    f.verdict = Verdict::kProtocol;
    f.detail = fmt::format("sample has {} slots, expected {}", sample.slots.size(), tracks_.size());
    return f;
  }
  // Counters first: a protocol violation is reported even when a process is also gone.
  for (size_t i = 0; i < tracks_.size(); ++i) {
    const SlotSample& s = sample.slots[i];
    SlotTrack& t = tracks_[i];
    std::string bad;
    if (s.resp_seq > s.req_seq)
      bad = fmt::format("response counter {} ahead of request counter {}", s.resp_seq, s.req_seq);
    else if (started_ && s.req_seq < t.last_req)
      bad = fmt::format("request counter went backwards ({} after {})", s.req_seq, t.last_req);
    else if (started_ && s.resp_seq < t.last_resp)
      bad = fmt::format("response counter went backwards ({} after {})", s.resp_seq, t.last_resp);
    if (!bad.empty()) {
      f.verdict = Verdict::kProtocol;
      f.slot = int(i);
      f.detail = fmt::format("slot {}: {}", i, bad);
      return f;
    }
  }
  for (size_t i = 0; i < tracks_.size(); ++i) {
    const SlotSample& s = sample.slots[i];
    SlotTrack& t = tracks_[i];
    const bool pending = s.req_seq > s.resp_seq;
    if (!started_ || s.resp_seq != t.last_resp || (pending && !t.pending)) t.since_ns = now_ns;
    t.last_req = s.req_seq;
    t.last_resp = s.resp_seq;
    t.pending = pending;
  }
  started_ = true;
  if (!sample.peer_alive) {
    f.verdict = Verdict::kPeerGone;
    f.detail = "the peer process is gone";
    return f;
  }
  if (!sample.primary_alive) {
    f.verdict = Verdict::kPrimaryGone;
    f.detail = "the primary process is gone";
    return f;
  }
  for (size_t i = 0; i < tracks_.size(); ++i) {
    const SlotTrack& t = tracks_[i];
    if (t.pending && now_ns - t.since_ns >= stall_ns_) {
      f.verdict = Verdict::kStall;
      f.slot = int(i);
      f.stalled_s = double(now_ns - t.since_ns) / 1e9;
      f.detail = fmt::format("slot {}: request {} pending, response counter stuck at {} for {:.3f} s", i, t.last_req,
                             t.last_resp, f.stalled_s);
      return f;
    }
  }
  return f;
}

namespace {

bool alive(int32_t pid) {
  // A pid we may not signal (0, 1, ourselves, garbage) is not checked: counted alive.
  return !peer::signallable_pid(pid) || peer::process_state(pid) == peer::ProcessState::kAlive;
}

LaneSample take_sample(peer::Segment& seg) {
  peer::Header& h = seg.header();
  LaneSample s;
  s.state = h.state.load(std::memory_order_acquire);
  s.peer_alive = alive(h.peer_pid.load(std::memory_order_relaxed));
  const int32_t primary = h.primary_pid.load(std::memory_order_relaxed);
  s.primary_alive = primary == 0 || alive(primary);
  s.slots.resize(seg.geometry().n_slots);
  for (uint32_t i = 0; i < seg.geometry().n_slots; ++i) {
    peer::SlotView v = seg.slot(i);
    s.slots[i].resp_seq = v.response->seq.load(std::memory_order_acquire);  // response first: see SlotSample
    s.slots[i].req_seq = v.request->seq.load(std::memory_order_acquire);
  }
  return s;
}

TripCause cause_of(Verdict v) {
  switch (v) {
    case Verdict::kStall: return TripCause::kStall;
    case Verdict::kPeerGone: return TripCause::kPeerGone;
    case Verdict::kPrimaryGone: return TripCause::kPrimaryGone;
    case Verdict::kProtocol: return TripCause::kProtocol;
    case Verdict::kHealthy:
    case Verdict::kStopped:
    case Verdict::kTripped: return TripCause::kNone;
  }
  return TripCause::kNone;
}

// SIGTERM (+SIGCONT so a stopped process can act on it), then SIGKILL after grace. Returns what was done.
nlohmann::json stop_process(const char* role, int32_t pid) {
  nlohmann::json j = {{"role", role}, {"pid", pid}};
  if (!peer::signallable_pid(pid)) {
    j["action"] = "skipped (pid not signallable)";
    return j;
  }
  if (peer::process_state(pid) == peer::ProcessState::kGone) {
    j["action"] = "already gone";
    return j;
  }
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  j["action"] = "sigterm";
  return j;
}

bool all_gone(const std::vector<int32_t>& pids) {
  for (int32_t pid : pids)
    if (peer::signallable_pid(pid) && peer::process_state(pid) == peer::ProcessState::kAlive) return false;
  return true;
}

int run_rollback(const std::string& cmd, const std::string& lane, TripCause cause) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setenv("TANDEM_LANE", lane.c_str(), 1);
    setenv("TANDEM_TRIP_CAUSE", peer::to_string(cause), 1);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// How long a tripped primary gets to fail its requests and exit by itself before SIGTERM.
constexpr double kPrimaryFailWindowS = 1.0;

int enforce(peer::Segment& seg, const WatchdogOptions& o, const Finding& f) {
  peer::Header& h = seg.header();
  const TripCause cause = cause_of(f.verdict);
  const std::string reason = fmt::format("watchdog: {}", f.detail);
  uint32_t unclaimed = 0;
  if (h.trip_claim.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel))
    peer::write_bounded(h.trip_reason, peer::kReasonBytes, reason);
  h.trip_cause.store(uint32_t(cause), std::memory_order_relaxed);
  h.state.store(uint32_t(LaneState::kTripped), std::memory_order_release);
  peer::futex_wake_all(&h.doorbell);
  for (uint32_t i = 0; i < seg.geometry().n_slots; ++i) peer::futex_wake_all_low(&seg.slot(i).response->seq);

  const int32_t peer_pid = h.peer_pid.load(std::memory_order_relaxed);
  const int32_t primary_pid = h.primary_pid.load(std::memory_order_relaxed);
  nlohmann::json stopped = nlohmann::json::array();
  stopped.push_back(stop_process("peer", peer_pid));
  if (primary_pid != 0 && primary_pid != peer_pid) {
    // The woken primary fails its requests in flight with the trip's cause and exits on its own; give
    // it a moment to say so before it is stopped (its memory is freed either way).
    const uint64_t fail_end = peer::now_ns() + uint64_t(std::min(o.grace_s, kPrimaryFailWindowS) * 1e9);
    while (peer::signallable_pid(primary_pid) && peer::process_state(primary_pid) == peer::ProcessState::kAlive &&
           peer::now_ns() < fail_end)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stopped.push_back(stop_process("primary", primary_pid));
  }
  const uint64_t grace_end = peer::now_ns() + uint64_t(o.grace_s * 1e9);
  std::vector<int32_t> pids = {peer_pid, primary_pid};
  while (!all_gone(pids) && peer::now_ns() < grace_end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (auto& j : stopped) {
    int32_t pid = j["pid"];
    if (peer::signallable_pid(pid) && peer::process_state(pid) == peer::ProcessState::kAlive) {
      kill(pid, SIGKILL);
      j["action"] = "sigterm+sigkill";
    }
  }
  // The peer, stopping on SIGTERM, may have removed it already: report whether it is gone.
  const bool removed = seg.unlink_if_ours() || !seg.still_linked();
  nlohmann::json line = {{"event", "lane_tripped"},
                         {"lane", o.lane},
                         {"mode", "enforce"},
                         {"cause", peer::to_string(cause)},
                         {"detail", f.detail},
                         {"slot", f.slot},
                         {"stalled_s", f.stalled_s},
                         {"stall_limit_s", o.stall_s},
                         {"processes", stopped},
                         {"segment_removed", removed},
                         {"handoffs", h.handoffs.load(std::memory_order_relaxed)},
                         {"overruns", h.overruns.load(std::memory_order_relaxed)}};
  if (!o.rollback.empty()) {
    line["rollback"] = o.rollback;
    line["rollback_exit"] = run_rollback(o.rollback, o.lane, cause);
  }
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  spdlog::error("lane {} tripped: {}", o.lane, f.detail);
  return 1;
}

void observe_log(const WatchdogOptions& o, const Finding& f) {
  nlohmann::json line = {{"event", "lane_fault_observed"}, {"lane", o.lane},       {"mode", "observe"},
                         {"cause", to_string(f.verdict)},  {"detail", f.detail},   {"slot", f.slot},
                         {"stalled_s", f.stalled_s},       {"stall_limit_s", o.stall_s}};
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  spdlog::warn("lane {}: {} (observe mode: no action)", o.lane, f.detail);
}

}  // namespace

int run_watchdog(const WatchdogOptions& o) {
  peer::validate_lane_name(o.lane);
  if (!(o.stall_s > 0)) fail("--stall must be > 0 seconds (got {})", o.stall_s);
  if (!(o.grace_s >= 0)) fail("--grace must be >= 0 seconds (got {})", o.grace_s);
  auto seg = peer::Segment::open(o.lane, o.startup_timeout_s);
  const double poll_s = o.poll_s > 0 ? o.poll_s : std::clamp(o.stall_s / 10, 0.005, 0.1);
  spdlog::info("watching lane {} (stall {} s, mode {}, poll {} s)", o.lane, o.stall_s,
               o.mode == Mode::kEnforce ? "enforce" : "observe", poll_s);
  StallDetector detector(o.stall_s, seg->geometry().n_slots);
  bool in_episode = false;
  for (;;) {
    if (!seg->still_linked()) {
      spdlog::info("lane {}: segment removed, the lane is down; exiting", o.lane);
      return 0;
    }
    Finding f = detector.observe(peer::now_ns(), take_sample(*seg));
    switch (f.verdict) {
      case Verdict::kHealthy:
        in_episode = false;
        break;
      case Verdict::kStopped:
        spdlog::info("lane {}: stopped normally; exiting", o.lane);
        return 0;
      case Verdict::kTripped:
        spdlog::error("lane {}: already tripped: {}", o.lane,
                      peer::read_bounded(seg->header().trip_reason, peer::kReasonBytes));
        return 1;
      case Verdict::kStall:
      case Verdict::kPeerGone:
      case Verdict::kPrimaryGone:
      case Verdict::kProtocol:
        if (o.mode == Mode::kEnforce) return enforce(*seg, o, f);
        if (!in_episode) observe_log(o, f);
        in_episode = true;
        break;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
}

}  // namespace tandem::watchdog
