// The peer's serving loop (see server.h). Idle protocol: spin over the slots for spin_us, then set
// peer_sleeping, read the doorbell, look once more and futex-nap on the doorbell; the primary bumps the
// doorbell after each request and wakes us when peer_sleeping is set. A GPU primary cannot: its host
// rings once per step, and a peer that finds requests waiting after unrung naps learns to spin longer.
#include "peer/server.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <exception>

#include "core/error.h"
#include "peer/sync.h"

namespace tandem::peer {

namespace {

constexpr uint64_t kHeartbeatEveryNs = 1'000'000;  // peer heartbeat resolution while busy

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::atomic<PeerServer*> g_signal_server{nullptr};

void on_stop_signal(int) {
  if (PeerServer* s = g_signal_server.load(std::memory_order_relaxed)) s->request_stop();
}

}  // namespace

const char* to_string(ServeEnd e) {
  switch (e) {
    case ServeEnd::kStopped: return "stopped";
    case ServeEnd::kLaneStopped: return "lane_stopped";
    case ServeEnd::kTripped: return "tripped";
    case ServeEnd::kPrimaryGone: return "primary_gone";
    case ServeEnd::kRefused: return "refused";
  }
  return "unknown";
}

void install_stop_signals(PeerServer& server) {
  g_signal_server.store(&server, std::memory_order_relaxed);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a futex nap returns EINTR at once
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

std::unique_ptr<PeerServer> PeerServer::create(const std::string& lane, uint64_t fingerprint,
                                               const Geometry& geometry, PeerCompute& compute,
                                               const ServerOptions& options) {
  return std::make_unique<PeerServer>(Segment::create(lane, fingerprint, geometry), compute, options);
}

PeerServer::PeerServer(std::shared_ptr<Segment> segment, PeerCompute& compute, const ServerOptions& options)
    : segment_(std::move(segment)), compute_(compute), options_(options), spin_us_(options.spin_us) {
  const Geometry& g = segment_->geometry();
  TANDEM_ASSERT(compute_.n_layers() > 0 && compute_.n_experts() > 0, "compute has {} layers, {} experts",
                compute_.n_layers(), compute_.n_experts());
  answered_.assign(g.n_slots, 0);
  ids_.resize(size_t(g.max_rows) * g.max_k);
  weights_.resize(size_t(g.max_rows) * g.max_k);
}

PeerServer::~PeerServer() {
  PeerServer* self = this;
  g_signal_server.compare_exchange_strong(self, nullptr);
}

ServeEnd PeerServer::serve() {
  Header& h = segment_->header();
  uint32_t starting = uint32_t(LaneState::kStarting);
  h.state.compare_exchange_strong(starting, uint32_t(LaneState::kServing), std::memory_order_acq_rel);
  spdlog::info("lane {}: serving (pid {}, lane fingerprint {:016x}, {} slots x {} rows x {} hidden, k {})",
               segment_->lane(), getpid(), segment_->fingerprint(), segment_->geometry().n_slots,
               segment_->geometry().max_rows, segment_->geometry().hidden, segment_->geometry().max_k);
  const uint32_t n_slots = segment_->geometry().n_slots;
  uint64_t last_work = now_ns();
  uint64_t last_beat = 0;
  for (;;) {
    if (stop_.load(std::memory_order_relaxed)) return finish(ServeEnd::kStopped);
    uint32_t st = h.state.load(std::memory_order_acquire);
    if (st == uint32_t(LaneState::kTripped)) return finish(ServeEnd::kTripped);
    if (st != uint32_t(LaneState::kServing)) return finish(ServeEnd::kLaneStopped);
    if (h.attach_seq.load(std::memory_order_acquire) != acked_attach_ && !handle_attach())
      return finish(ServeEnd::kRefused);

    bool worked = false;
    for (uint32_t i = 0; i < n_slots; ++i) {
      uint64_t seq = segment_->slot(i).request->seq.load(std::memory_order_acquire);
      if (seq > answered_[i]) {  // a counter below answered_ went backwards: the watchdog trips on it
        serve_one(i, seq);
        worked = true;
      }
    }
    uint64_t now = now_ns();
    if (now - last_beat >= kHeartbeatEveryNs) {
      h.peer_heartbeat_ns.store(now, std::memory_order_relaxed);
      last_beat = now;
      if (primary_gone(now)) return finish(ServeEnd::kPrimaryGone);
    }
    if (worked) {
      last_work = now;
      continue;
    }
    if (now - last_work < spin_us_.load(std::memory_order_relaxed) * 1000) {
      cpu_relax();
      continue;
    }
    h.peer_sleeping.store(1, std::memory_order_seq_cst);
    uint32_t bell = h.doorbell.load(std::memory_order_seq_cst);
    if (!any_pending() && !stop_.load(std::memory_order_relaxed))
      futex_wait(&h.doorbell, bell, options_.idle_nap_ms * 1'000'000);
    h.peer_sleeping.store(0, std::memory_order_relaxed);
    if (h.doorbell.load(std::memory_order_relaxed) != bell) {
      last_work = now_ns();
    } else if (any_pending()) {
      note_unrung_request();
    }
  }
}

void PeerServer::note_unrung_request() {
  // Twice, not once: a CPU primary publishes, then rings, and a nap may end between the two.
  if (++unrung_seen_ < 2 || spin_us_.load(std::memory_order_relaxed) >= options_.unrung_spin_us) return;
  spin_us_.store(options_.unrung_spin_us, std::memory_order_relaxed);
  spdlog::info("lane {}: requests arrive without a doorbell ring (a GPU primary): polling {} us after each "
               "request from now on instead of {} (--spin-us)",
               segment_->lane(), options_.unrung_spin_us, options_.spin_us);
}

bool PeerServer::any_pending() {
  for (uint32_t i = 0; i < segment_->geometry().n_slots; ++i)
    if (segment_->slot(i).request->seq.load(std::memory_order_acquire) > answered_[i]) return true;
  return false;
}

bool PeerServer::handle_attach() {
  Header& h = segment_->header();
  const uint32_t seq = h.attach_seq.load(std::memory_order_acquire);
  const uint64_t fp = h.primary_fingerprint.load(std::memory_order_relaxed);
  const int32_t pid = h.primary_pid.load(std::memory_order_relaxed);
  acked_attach_ = seq;
  if (fp != segment_->fingerprint()) {
    std::string reason = fmt::format("fingerprint mismatch: this peer serves {:016x}, the primary (pid {}) expects "
                                     "{:016x} (model or rowmap differ)",
                                     segment_->fingerprint(), pid, fp);
    write_bounded(h.refuse_reason, kReasonBytes, reason);
    h.state.store(uint32_t(LaneState::kRefused), std::memory_order_release);
    spdlog::error("lane {}: refused a primary: {}", segment_->lane(), reason);
    return false;
  }
  if (pid <= 0) {
    spdlog::warn("lane {}: attach without a valid primary pid ({}); ignored", segment_->lane(), pid);
    return true;
  }
  primary_pid_ = pid;
  h.attach_ack.store(seq, std::memory_order_release);
  spdlog::info("lane {}: primary pid {} attached", segment_->lane(), pid);
  return true;
}

bool PeerServer::primary_gone(uint64_t now) {
  if (primary_pid_ <= 0) return false;
  if (process_state(primary_pid_) == ProcessState::kGone) {
    spdlog::warn("lane {}: primary pid {} is gone", segment_->lane(), primary_pid_);
    return true;
  }
  const uint64_t beat = segment_->header().primary_heartbeat_ns.load(std::memory_order_relaxed);
  const uint64_t stall_ns = uint64_t(options_.primary_stall_s * 1e9);
  if (beat < now && now - beat > stall_ns) {
    spdlog::warn("lane {}: primary pid {} heartbeat is {:.3f} s old (limit {} s)", segment_->lane(), primary_pid_,
                 double(now - beat) / 1e9, options_.primary_stall_s);
    return true;
  }
  return false;
}

Status PeerServer::validate(SlotView s, int32_t layer, uint32_t n_rows, uint32_t k) {
  const Geometry& g = segment_->geometry();
  if (n_rows > g.max_rows) {
    detail_ = fmt::format("n_rows {} exceeds max_rows {}", n_rows, g.max_rows);
    return Status::kBadRows;
  }
  if (k < 1 || k > g.max_k) {
    detail_ = fmt::format("k {} is outside [1, {}]", k, g.max_k);
    return Status::kBadK;
  }
  if (layer < 0 || layer >= compute_.n_layers()) {
    detail_ = fmt::format("layer {} is outside [0, {})", layer, compute_.n_layers());
    return Status::kBadLayer;
  }
  const int n_experts = compute_.n_experts();
  for (uint32_t r = 0; r < n_rows; ++r) {
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t id = s.ids[size_t(r) * g.max_k + j];  // one read each: validate the copy, use the copy
      const float w = s.weights[size_t(r) * g.max_k + j];
      ids_[size_t(r) * k + j] = id;
      weights_[size_t(r) * k + j] = w;
      if (id == -1) continue;
      if (id < -1 || id >= n_experts) {
        detail_ = fmt::format("row {} slot {}: expert id {} is outside [-1, {})", r, j, id, n_experts);
        return Status::kBadExpert;
      }
      if (!compute_.is_cold(layer, id)) {
        detail_ = fmt::format("row {} slot {}: expert {} of layer {} is not cold on this peer", r, j, id, layer);
        return Status::kHotExpert;
      }
      if (!std::isfinite(w)) {
        detail_ = fmt::format("row {} slot {}: gate weight {} is not finite", r, j, w);
        return Status::kBadWeight;
      }
    }
  }
  return Status::kOk;
}

void PeerServer::serve_one(uint32_t slot, uint64_t seq) {
  SlotView s = segment_->slot(slot);
  // Copy the head once (the primary may be buggy): validate and use only the copies.
  const int32_t layer = s.request->layer;
  const uint32_t n_rows = s.request->n_rows;
  const uint32_t k = s.request->k;
  Status status = Status::kOk;
  detail_.clear();
  if (seq != answered_[slot] + 1) {
    status = Status::kBadSequence;
    detail_ = fmt::format("request seq {} after {} (expected {})", seq, answered_[slot], answered_[slot] + 1);
  } else {
    status = validate(s, layer, n_rows, k);
  }
  if (status == Status::kOk) {
    try {
      compute_.compute(layer, s.x, int64_t(n_rows), ids_.data(), weights_.data(), int64_t(k), s.out);
    } catch (const std::exception& e) {
      status = Status::kComputeError;
      detail_ = e.what();
    }
  }
  Header& h = segment_->header();
  if (status != Status::kOk) {
    spdlog::warn("lane {} slot {}: request {} failed: {}: {}", segment_->lane(), slot, seq, to_string(status),
                 detail_);
    h.peer_errors.fetch_add(1, std::memory_order_relaxed);
  }
  s.response->status = uint32_t(status);
  s.response->n_rows = n_rows;
  write_bounded(s.response->detail, kDetailBytes, detail_);
  answered_[slot] = seq;
  served_.fetch_add(1, std::memory_order_relaxed);  // counted before the answer is published
  // seq_cst: the Dekker pair with the primary's (primary_waiting = 1; load seq).
  s.response->seq.store(seq, std::memory_order_seq_cst);
  if (s.response->primary_waiting.load(std::memory_order_seq_cst) != 0) futex_wake_all_low(&s.response->seq);
  h.peer_served.fetch_add(1, std::memory_order_relaxed);
  h.peer_progress_ns.store(now_ns(), std::memory_order_relaxed);
}

ServeEnd PeerServer::finish(ServeEnd end) {
  Header& h = segment_->header();
  uint32_t st = h.state.load(std::memory_order_acquire);
  if (st == uint32_t(LaneState::kStarting) || st == uint32_t(LaneState::kServing))
    h.state.compare_exchange_strong(st, uint32_t(LaneState::kStopped), std::memory_order_acq_rel);
  for (uint32_t i = 0; i < segment_->geometry().n_slots; ++i) futex_wake_all_low(&segment_->slot(i).response->seq);
  bool removed = segment_->unlink_if_ours();
  spdlog::info("lane {}: peer exits ({}), {} requests served, segment {}", segment_->lane(), to_string(end), served_.load(),
               removed ? "removed" : "already gone");
  return end;
}

}  // namespace tandem::peer
