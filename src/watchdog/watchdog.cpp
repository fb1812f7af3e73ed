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

// The lane's processes as the watchdog verified them: a pid named by the header is taken as the lane's
// own only when that process maps the lane's segment (/proc/<pid>/maps) at first sight; it is then
// pinned (ProcessHandle: a pidfd, or pid + start time), so a pid reused later is never signalled. A pid
// that does not map the segment (an edited header naming an unrelated process) is never signalled and
// counts as gone: it is not the lane's process. Every verified process of a role is kept, so a header
// that changes a pid afterwards cannot hide the real one.
class LaneProcesses {
 public:
  explicit LaneProcesses(const peer::Segment& seg)
      : lane_(seg.lane()),
        shm_(peer::shm_name(seg.lane())),
        can_verify_(peer::process_maps_segment(getpid(), shm_)) {
    if (!can_verify_)
      spdlog::warn("lane {}: cannot read /proc/<pid>/maps here: lane pids are verified by start time only", lane_);
  }

  // True when `pid` (from the header, for `role`) is a live process of the lane. 0: none named.
  bool alive(const char* role, int32_t pid) {
    if (pid == 0 || pid == int32_t(getpid())) return true;  // nothing to check (no primary yet; ourselves)
    Role& r = role_of(role);
    if (pid != r.last_seen) {
      r.last_seen = pid;
      r.current_verified = verify(role, pid, r);
    }
    if (!r.current_verified) return false;
    for (const auto& h : r.handles)
      if (h.pid() == pid) return h.alive();
    return false;
  }

  // SIGTERM + SIGCONT to every verified live process of `role`. Returns what was done, per process.
  nlohmann::json stop(const char* role, int32_t header_pid) {
    Role& r = role_of(role);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& h : r.handles) {
      nlohmann::json j = {{"role", role}, {"pid", h.pid()}};
      if (h.signal(SIGTERM)) {
        h.signal(SIGCONT);
        j["action"] = "sigterm";
      } else {
        j["action"] = "already gone";
      }
      out.push_back(j);
    }
    if (header_pid != 0 && !r.verified_pid(header_pid))
      out.push_back({{"role", role},
                     {"pid", header_pid},
                     {"action", "not signalled (not verified as the lane's process)"}});
    return out;
  }
  // SIGKILL to the verified processes of `role` still alive; marks their entries in `done`.
  void kill_left(const char* role, nlohmann::json& done) {
    for (const auto& h : role_of(role).handles) {
      if (!h.alive()) continue;
      h.signal(SIGKILL);
      for (auto& j : done)
        if (j["pid"] == h.pid() && j["role"] == role) j["action"] = "sigterm+sigkill";
    }
  }
  bool any_alive() const {
    for (const Role* r : {&peer_, &primary_})
      for (const auto& h : r->handles)
        if (h.alive()) return true;
    return false;
  }

 private:
  struct Role {
    int32_t last_seen = 0;
    bool current_verified = false;
    std::vector<peer::ProcessHandle> handles;  // every verified process of this role
    bool verified_pid(int32_t pid) const {
      for (const auto& h : handles)
        if (h.pid() == pid) return true;
      return false;
    }
  };
  Role& role_of(const char* role) { return std::string_view(role) == "peer" ? peer_ : primary_; }

  bool verify(const char* role, int32_t pid, Role& r) {
    if (r.verified_pid(pid)) return true;
    if (!peer::signallable_pid(pid)) {
      spdlog::warn("lane {}: the header names {} pid {}, which is not a pid that can be the lane's", lane_, role, pid);
      return false;
    }
    peer::ProcessHandle h = peer::ProcessHandle::take(pid);  // pin first, then check what it maps
    if (!h.valid()) return false;                           // gone already
    if (can_verify_ && !peer::process_maps_segment(pid, shm_)) {
      spdlog::warn("lane {}: {} pid {} named by the header does not map {}: not the lane's process; it will not be "
                   "signalled",
                   lane_, role, pid, shm_);
      return false;
    }
    if (!h.alive()) return false;  // exited (and maybe reused) between the two looks
    r.handles.push_back(std::move(h));
    return true;
  }

  std::string lane_, shm_;
  bool can_verify_;
  Role peer_, primary_;
};

LaneSample take_sample(peer::Segment& seg, LaneProcesses& procs) {
  peer::Header& h = seg.header();
  LaneSample s;
  s.state = h.state.load(std::memory_order_acquire);
  s.peer_alive = procs.alive("peer", h.peer_pid.load(std::memory_order_relaxed));
  s.primary_alive = procs.alive("primary", h.primary_pid.load(std::memory_order_relaxed));
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

// Trips the lane (or, for a lane a lane process tripped itself — a primary that saw its peer gone, a
// check gate below its bar, a damaged segment — takes its cause) and does the rest: stop the processes,
// remove the segment, one JSON line, the rollback.
int enforce(peer::Segment& seg, const WatchdogOptions& o, const Finding& f, LaneProcesses& procs) {
  peer::Header& h = seg.header();
  TripCause cause = cause_of(f.verdict);
  if (f.verdict == Verdict::kTripped)
    cause = peer::trip_cause_of(h.trip_cause.load(std::memory_order_relaxed));
  else
    seg.trip(cause, fmt::format("watchdog: {}", f.detail));

  const int32_t peer_pid = h.peer_pid.load(std::memory_order_relaxed);
  const int32_t primary_pid = h.primary_pid.load(std::memory_order_relaxed);
  procs.alive("peer", peer_pid);  // verify what the header names now, if not seen yet
  procs.alive("primary", primary_pid);
  nlohmann::json stopped = procs.stop("peer", peer_pid);
  // The woken primary fails its requests in flight with the trip's cause and exits on its own; give
  // it a moment to say so before it is stopped (its memory is freed either way).
  const uint64_t fail_end = peer::now_ns() + uint64_t(std::min(o.grace_s, kPrimaryFailWindowS) * 1e9);
  while (procs.alive("primary", primary_pid) && primary_pid != 0 && peer::now_ns() < fail_end)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& j : procs.stop("primary", primary_pid)) stopped.push_back(j);
  const uint64_t grace_end = peer::now_ns() + uint64_t(o.grace_s * 1e9);
  while (procs.any_alive() && peer::now_ns() < grace_end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  procs.kill_left("peer", stopped);
  procs.kill_left("primary", stopped);
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
  LaneProcesses procs(*seg);
  bool in_episode = false;
  for (;;) {
    // A segment removed by a peer that stopped on a trip (a check gate, a damaged segment) still
    // reads tripped through our mapping: that is handled below, not a normal stop.
    if (!seg->still_linked() &&
        seg->header().state.load(std::memory_order_acquire) != uint32_t(LaneState::kTripped)) {
      spdlog::info("lane {}: segment removed, the lane is down; exiting", o.lane);
      return 0;
    }
    Finding f = detector.observe(peer::now_ns(), take_sample(*seg, procs));
    switch (f.verdict) {
      case Verdict::kHealthy:
        in_episode = false;
        break;
      case Verdict::kStopped:
        spdlog::info("lane {}: stopped normally; exiting", o.lane);
        return 0;
      case Verdict::kTripped:
        spdlog::error("lane {}: tripped ({}): {}", o.lane, peer::cause_name(seg->header().trip_cause.load()),
                      peer::read_bounded(seg->header().trip_reason, peer::kReasonBytes));
        if (o.mode == Mode::kEnforce) {
          f.detail = "tripped by a lane process: " + peer::read_bounded(seg->header().trip_reason, peer::kReasonBytes);
          return enforce(*seg, o, f, procs);
        }
        return 1;
      case Verdict::kStall:
      case Verdict::kPeerGone:
      case Verdict::kPrimaryGone:
      case Verdict::kProtocol:
        if (o.mode == Mode::kEnforce) return enforce(*seg, o, f, procs);
        if (!in_episode) observe_log(o, f);
        in_episode = true;
        break;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
}

}  // namespace tandem::watchdog
