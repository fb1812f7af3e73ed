// The peer's serving loop (see server.h). Idle protocol: spin over the slots for spin_us, then set
// peer_sleeping, read the doorbell, look once more and futex-nap on the doorbell; the primary bumps the
// doorbell after each request and wakes us when peer_sleeping is set. A GPU primary cannot: its host
// rings once per step, and a peer that finds requests waiting after unrung naps learns to spin longer.
#include "peer/server.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <exception>

#include "core/error.h"
#include "peer/sync.h"

namespace tandem::peer {

namespace {

constexpr uint64_t kHeartbeatEveryNs = 1'000'000;  // peer heartbeat resolution while busy

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
    case ServeEnd::kCorrupt: return "corrupt";
    case ServeEnd::kShrunk: return "shrunk";
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
                                               const ServerOptions& options, uint64_t rowmap_fp,
                                               uint64_t weights_fp) {
  return std::make_unique<PeerServer>(Segment::create(lane, fingerprint, geometry, rowmap_fp, weights_fp), compute,
                                      options);
}

PeerServer::PeerServer(std::shared_ptr<Segment> segment, PeerCompute& compute, const ServerOptions& options)
    : segment_(std::move(segment)), compute_(compute), options_(options), spin_us_(options.spin_us) {
  const Geometry& g = segment_->geometry();
  TANDEM_ASSERT(compute_.n_layers() > 0 && compute_.n_experts() > 0, "compute has {} layers, {} experts",
                compute_.n_layers(), compute_.n_experts());
  answered_.assign(g.n_slots, 0);
  std::memcpy(identity_.data(), static_cast<const void*>(&segment_->header()), kCacheLine);  // line 0
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
  // A damaged header or a truncated file trips the lane with its own cause (never a normal stop).
  auto damaged = [&]() -> std::optional<ServeEnd> {
    if (segment_->shrunk()) {
      segment_->trip(TripCause::kShrunk, fmt::format("peer: the segment file shrank below its {} bytes",
                                                     segment_bytes(segment_->geometry())));
      spdlog::error("lane {}: the segment file was truncated under the lane; stopping", segment_->lane());
      return ServeEnd::kShrunk;
    }
    if (std::string why = header_damage(); !why.empty()) {
      segment_->trip(TripCause::kCorrupt, "peer: the segment header is corrupt: " + why);
      spdlog::error("lane {}: the segment header is corrupt ({}); stopping", segment_->lane(), why);
      return ServeEnd::kCorrupt;
    }
    return std::nullopt;
  };
  for (;;) {
    if (stop_.load(std::memory_order_relaxed)) return finish(ServeEnd::kStopped);
    uint32_t st = h.state.load(std::memory_order_acquire);
    if (st != uint32_t(LaneState::kServing) || segment_->faulted())
      if (auto end = damaged()) return finish(*end);
    if (st == uint32_t(LaneState::kTripped)) return finish(ServeEnd::kTripped);
    if (st != uint32_t(LaneState::kServing)) return finish(ServeEnd::kLaneStopped);
    if (h.attach_seq.load(std::memory_order_acquire) != acked_attach_) {
      // Garbage written over the header can look like an attach: a damaged header is corrupt, never a
      // refused primary, so it is checked before the attach and again after its fields were read.
      if (auto end = damaged()) return finish(*end);
      const bool attached = handle_attach();
      if (auto end = damaged()) return finish(*end);
      if (!attached) return finish(ServeEnd::kRefused);
    }

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
      if (auto end = damaged()) return finish(*end);
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
    if (!header_damage().empty()) return true;  // not a primary at all: the caller stops the lane as corrupt
    std::string reason = fmt::format(
        "fingerprint mismatch with the primary (pid {}): {}", pid,
        describe_mismatch(segment_->fingerprint(), h.peer_rowmap_fingerprint, h.peer_weights_fingerprint, fp,
                          h.primary_rowmap_fingerprint.load(std::memory_order_relaxed),
                          h.primary_weights_fingerprint.load(std::memory_order_relaxed), "this peer", "the primary"));
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

std::string PeerServer::header_damage() {
  const Header& h = segment_->header();
  const uint32_t st = h.state.load(std::memory_order_acquire);
  if (st > uint32_t(LaneState::kStopped)) return fmt::format("lane state {}", st);
  if (std::memcmp(static_cast<const void*>(&h), identity_.data(), kCacheLine) != 0)
    return "the identity line (magic, version, fingerprint, sizes, geometry) changed";
  const int32_t peer = h.peer_pid.load(std::memory_order_relaxed);
  if (peer != int32_t(getpid())) return fmt::format("peer_pid {} is not this peer ({})", peer, getpid());
  const int32_t primary = h.primary_pid.load(std::memory_order_relaxed);
  if (primary_pid_ > 0 && primary != primary_pid_)
    return fmt::format("primary_pid {} is not the attached primary ({})", primary, primary_pid_);
  return {};
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
  if (segment_->faulted()) return;  // computed from zero pages: never published; serve() stops (kShrunk)
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
