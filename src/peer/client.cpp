// The primary's side of the sidecar lane (see client.h). Wait path: spin (acquire loads) up to the
// spin limit, then futex-block on the response counter's low word in short naps that only serve to
// re-check the lane state; there is no deadline.
#include "peer/client.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/error.h"
#include "peer/sync.h"

namespace tandem::peer {

namespace {

constexpr uint64_t kBlockNapNs = 20'000'000;  // futex nap while blocked; the lane state is re-checked after each
constexpr int kSpinCheckEvery = 64;           // spin iterations between clock / state checks

int wait_bucket(uint64_t wait_ns) {
  uint64_t us = wait_ns / 1000;
  int b = 0;
  while (us > 0 && b < kWaitBuckets - 1) {
    us >>= 1;
    ++b;
  }
  return b;
}

}  // namespace

PeerClient::PeerClient(std::shared_ptr<Segment> segment, const ClientOptions& options)
    : segment_(std::move(segment)), options_(options) {
  const uint32_t n = segment_->geometry().n_slots;
  sent_.assign(n, 0);
  done_.assign(n, 0);
  sent_rows_.assign(n, 0);
}

Geometry peek_geometry(const std::string& lane, double timeout_s) {
  validate_lane_name(lane);
  return Segment::open(lane, timeout_s)->geometry();
}

std::unique_ptr<PeerClient> PeerClient::attach(const std::string& lane, uint64_t expected_fingerprint,
                                               const Geometry& geometry, const ClientOptions& options) {
  validate_lane_name(lane);
  return attach(Segment::open(lane, options.attach_timeout_s), expected_fingerprint, geometry, options);
}

std::unique_ptr<PeerClient> PeerClient::attach(std::shared_ptr<Segment> segment, uint64_t expected_fingerprint,
                                               const Geometry& geometry, const ClientOptions& options) {
  std::unique_ptr<PeerClient> client(new PeerClient(std::move(segment), options));
  try {
    client->handshake(expected_fingerprint, geometry);
  } catch (...) {
    client->closed_ = true;  // never attached: leave the lane's state to the peer
    throw;
  }
  if (options.heartbeat_interval_ms > 0) client->heartbeat_ = std::thread([c = client.get()] { c->heartbeat_loop(); });
  return client;
}

void PeerClient::handshake(uint64_t expected_fingerprint, const Geometry& want) {
  Segment& seg = *segment_;
  const std::string& lane = seg.lane();
  const Geometry& have = seg.geometry();
  if (want.hidden != have.hidden || want.dtype != have.dtype)
    fail("lane {}: the peer serves hidden size {} dtype {}, this primary needs hidden size {} dtype {}", lane,
         have.hidden, have.dtype, want.hidden, want.dtype);
  if (want.n_slots > have.n_slots || want.max_rows > have.max_rows || want.max_k > have.max_k)
    fail("lane {}: the peer's segment is too small: slots {} rows {} k {}, this primary needs slots {} rows {} k {}",
         lane, have.n_slots, have.max_rows, have.max_k, want.n_slots, want.max_rows, want.max_k);

  Header& h = seg.header();
  const int32_t me = int32_t(getpid());
  const int32_t peer_pid = h.peer_pid.load(std::memory_order_relaxed);
  peer_in_process_ = peer_pid == me;  // a peer thread of this process (tests, benches)
  if (!peer_in_process_) {
    peer_ = ProcessHandle::take(peer_pid);
    if (!peer_.valid())
      fail("lane {}: its peer (pid {}) is gone; the segment is a leftover: start a new `tandem peer --lane {} ...` "
           "(it replaces the segment)",
           lane, peer_pid, lane);
  }
  h.primary_fingerprint.store(expected_fingerprint, std::memory_order_relaxed);
  int32_t expected_pid = 0;
  if (!h.primary_pid.compare_exchange_strong(expected_pid, me, std::memory_order_acq_rel) && expected_pid != me)
    fail("lane {} already has a primary (pid {})", lane, expected_pid);
  h.primary_rowmap_fingerprint.store(options_.rowmap_fingerprint, std::memory_order_relaxed);
  h.primary_weights_fingerprint.store(options_.weights_fingerprint, std::memory_order_relaxed);
  h.primary_heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
  const uint32_t my_attach = h.attach_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  futex_wake_all(&h.doorbell);

  if (want.split_column != have.split_column) {
    auto cut = [](uint32_t c) {
      return c ? fmt::format("cuts each cold expert at intermediate feature {} (split lane)", c)
               : std::string("computes whole cold experts (peer lane)");
    };
    fail("lane {}: the peer {}, this primary {}; {}; refusing to attach", lane, cut(have.split_column),
         cut(want.split_column),
         want.split_column == 0 ? "the peer lane needs a peer started without --split-share (or run --lane split)"
                                : "start the peer with the primary's --split-share, or the primary with "
                                  "--split-share auto to take the peer's cut");
  }
  if (seg.fingerprint() != expected_fingerprint)
    fail("lane {}: fingerprint mismatch: {}; refusing to attach", lane,
         describe_mismatch(seg.fingerprint(), h.peer_rowmap_fingerprint, h.peer_weights_fingerprint,
                           expected_fingerprint, options_.rowmap_fingerprint, options_.weights_fingerprint, "the peer",
                           "this primary"));

  const uint64_t start = now_ns();
  const uint64_t deadline = start + uint64_t(options_.attach_timeout_s * 1e9);
  bool told = false;
  for (;;) {
    uint32_t st = h.state.load(std::memory_order_acquire);
    if (st == uint32_t(LaneState::kRefused))
      fail("lane {}: the peer refused this primary: {}", lane, read_bounded(h.refuse_reason, kReasonBytes));
    if (st == uint32_t(LaneState::kTripped) || st == uint32_t(LaneState::kStopped))
      fail("lane {}: cannot attach, the lane is {}", lane, state_name(st));
    if (st == uint32_t(LaneState::kServing) && h.attach_ack.load(std::memory_order_acquire) == my_attach) return;
    if (st > uint32_t(LaneState::kStopped))
      fail("lane {}: the segment header is corrupt (lane state {}); restart the peer", lane, st);
    if (!peer_alive())
      fail("lane {}: its peer (pid {}) is gone (state {}); start a new `tandem peer --lane {} ...`", lane,
           peer_.pid(), state_name(st), lane);
    if (!told && now_ns() - start > 1'000'000'000) {
      spdlog::info("lane {}: waiting up to {} s for its peer (pid {}, state {}) to accept this primary", lane,
                   options_.attach_timeout_s, h.peer_pid.load(std::memory_order_relaxed), state_name(st));
      told = true;
    }
    if (now_ns() >= deadline)
      fail("lane {}: the peer (pid {}) did not accept this primary within {} s (state {})", lane,
           h.peer_pid.load(std::memory_order_relaxed), options_.attach_timeout_s, state_name(st));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

PeerClient::~PeerClient() { close(); }

void PeerClient::close() {
  if (closed_) return;
  closed_ = true;
  if (heartbeat_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      heartbeat_stop_ = true;
    }
    heartbeat_cv_.notify_all();
    heartbeat_.join();
  }
  Header& h = segment_->header();
  uint32_t serving = uint32_t(LaneState::kServing);
  h.state.compare_exchange_strong(serving, uint32_t(LaneState::kStopped), std::memory_order_acq_rel);
  futex_wake_all(&h.doorbell);
}

void PeerClient::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(heartbeat_mu_);
  while (!heartbeat_stop_) {
    segment_->header().primary_heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
    heartbeat_cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_interval_ms));
  }
}

void PeerClient::check_state(const char* during) {
  Header& h = segment_->header();
  uint32_t st = h.state.load(std::memory_order_acquire);
  if (st == uint32_t(LaneState::kServing)) return;
  const std::string& lane = segment_->lane();
  if (st == uint32_t(LaneState::kTripped)) {
    uint32_t cause = h.trip_cause.load(std::memory_order_relaxed);
    throw LaneTripped(trip_cause_of(cause), fmt::format("lane {} tripped ({}) {}: {}", lane, cause_name(cause), during,
                                                        read_bounded(h.trip_reason, kReasonBytes)));
  }
  if (st > uint32_t(LaneState::kStopped))
    trip(TripCause::kCorrupt, fmt::format("primary: the segment header is corrupt (lane state {}) {}", st, during));
  throw LaneError(LaneError::Kind::kStopped, fmt::format("lane {} is {} {}", lane, state_name(st), during));
}

void PeerClient::check_peer(const char* during) {
  if (segment_->shrunk())
    trip(TripCause::kShrunk, fmt::format("primary: the segment file shrank below its {} bytes {}",
                                         segment_bytes(segment_->geometry()), during));
  // The segment stays: a watchdog cleans up after the trip (and runs its rollback); without one, the
  // next `tandem peer` of the lane replaces it (its peer is gone).
  if (!peer_alive())
    trip(TripCause::kPeerGone, fmt::format("primary: its peer (pid {}) is gone {}", peer_.pid(), during));
}

void PeerClient::check_faulted() {
  if (segment_->faulted())
    trip(TripCause::kShrunk, fmt::format("primary: the segment file shrank below its {} bytes",
                                         segment_bytes(segment_->geometry())));
}

void PeerClient::trip(TripCause cause, const std::string& reason) {
  segment_->trip(cause, reason);
  Header& h = segment_->header();
  throw LaneTripped(cause, fmt::format("lane {} tripped ({}): {}", segment_->lane(), to_string(cause),
                                       read_bounded(h.trip_reason, kReasonBytes)));
}

void PeerClient::submit(int slot, int layer, const float* x, int64_t n_rows, const int32_t* ids,
                        const float* weights, int64_t k) {
  const Geometry& g = segment_->geometry();
  TANDEM_ASSERT(slot >= 0 && uint32_t(slot) < g.n_slots, "slot {} out of range (n_slots {})", slot, g.n_slots);
  if (!broken_.empty()) throw LaneError(LaneError::Kind::kProtocol, broken_);
  check_state("before submit");
  TANDEM_ASSERT(sent_[slot] == done_[slot], "slot {} already has a pending request (seq {})", slot, sent_[slot]);
  if (n_rows < 0 || n_rows > int64_t(g.max_rows))
    fail("lane {}: request of {} rows is outside [0, {}] (max_rows)", segment_->lane(), n_rows, g.max_rows);
  if (k < 1 || k > int64_t(g.max_k))
    fail("lane {}: request k = {} is outside [1, {}] (max_k)", segment_->lane(), k, g.max_k);

  SlotView s = segment_->slot(uint32_t(slot));
  std::memcpy(s.x, x, size_t(n_rows) * g.hidden * sizeof(float));
  if (k == int64_t(g.max_k)) {
    std::memcpy(s.ids, ids, size_t(n_rows * k) * sizeof(int32_t));
    std::memcpy(s.weights, weights, size_t(n_rows * k) * sizeof(float));
  } else {
    for (int64_t r = 0; r < n_rows; ++r) {
      std::memcpy(s.ids + r * g.max_k, ids + r * k, size_t(k) * sizeof(int32_t));
      std::memcpy(s.weights + r * g.max_k, weights + r * k, size_t(k) * sizeof(float));
    }
  }
  s.request->layer = layer;
  s.request->n_rows = uint32_t(n_rows);
  s.request->k = uint32_t(k);
  const uint64_t t = now_ns();
  s.request->submit_ns = t;
  sent_rows_[slot] = uint32_t(n_rows);
  sent_[slot] += 1;
  s.request->seq.store(sent_[slot], std::memory_order_release);

  Header& h = segment_->header();
  h.primary_progress_ns.store(t, std::memory_order_relaxed);
  if (options_.heartbeat_interval_ms == 0) h.primary_heartbeat_ns.store(t, std::memory_order_relaxed);
  if (options_.ring_per_request) ring();
}

void PeerClient::ring() {
  Header& h = segment_->header();
  // Dekker pair with the peer (sleeping = 1; load doorbell): one of us sees the other.
  h.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h.peer_sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&h.doorbell);
}

void PeerClient::wait(int slot, float* out) {
  const Geometry& g = segment_->geometry();
  TANDEM_ASSERT(slot >= 0 && uint32_t(slot) < g.n_slots, "slot {} out of range (n_slots {})", slot, g.n_slots);
  TANDEM_ASSERT(sent_[slot] == done_[slot] + 1, "wait on slot {} without a pending request", slot);
  SlotView s = segment_->slot(uint32_t(slot));
  const uint64_t expected = sent_[slot];
  const std::string& lane = segment_->lane();

  auto validate = [&](uint64_t seen) {
    if (seen > expected || seen < done_[slot]) {
      check_state("while waiting for the peer");  // a trip, a corrupt state or a truncated segment explains
      check_peer("while waiting for its answer");  // a counter out of range better than "protocol"
      broken_ = fmt::format("lane {} slot {}: response counter {} outside [{}, {}] (peer broke the protocol)", lane,
                            slot, seen, done_[slot], expected);
      throw LaneError(LaneError::Kind::kProtocol, broken_);
    }
  };

  const uint64_t t0 = now_ns();
  const uint64_t spin_ns = options_.spin_limit_us * 1000;
  bool answered = false;
  if (spin_ns > 0) {
    for (int i = 1;; ++i) {
      uint64_t seen = s.response->seq.load(std::memory_order_acquire);
      if (seen == expected) {
        answered = true;
        break;
      }
      validate(seen);
      if (i % kSpinCheckEvery == 0) {
        check_state("while waiting for the peer");
        if (now_ns() - t0 >= spin_ns) break;
      }
      cpu_relax();
    }
  }
  const bool overrun = !answered;
  if (!answered) {
    // Block with no deadline; naps only bound a lost wake-up and let us see a trip.
    s.response->primary_waiting.store(1, std::memory_order_seq_cst);
    for (;;) {
      uint64_t seen = s.response->seq.load(std::memory_order_seq_cst);
      if (seen == expected) break;
      validate(seen);
      try {
        check_state("while waiting for the peer");
        check_peer("while waiting for its answer");  // every nap (20 ms): no watchdog needed for a dead peer
      } catch (...) {
        s.response->primary_waiting.store(0, std::memory_order_relaxed);
        throw;
      }
      futex_wait_low(&s.response->seq, seen, kBlockNapNs);
    }
    s.response->primary_waiting.store(0, std::memory_order_relaxed);
  }
  done_[slot] = expected;
  // An answer that arrived after a trip is not used: the lane ended.
  check_state("after the peer answered");
  check_faulted();

  const uint32_t status = s.response->status;
  const uint32_t echo = s.response->n_rows;
  if (status != uint32_t(Status::kOk)) {
    Status st = status < kStatusCount ? Status(status) : Status::kComputeError;
    throw LaneError(LaneError::Kind::kStatus,
                    fmt::format("lane {} slot {}: the peer answered status {} for layer {}: {}", lane, slot,
                                status_name(status), s.request->layer, read_bounded(s.response->detail, kDetailBytes)),
                    st);
  }
  if (echo != sent_rows_[slot]) {
    broken_ = fmt::format("lane {} slot {}: response echoes {} rows, the request had {}", lane, slot, echo,
                          sent_rows_[slot]);
    throw LaneError(LaneError::Kind::kProtocol, broken_);
  }
  std::memcpy(out, s.out, size_t(sent_rows_[slot]) * g.hidden * sizeof(float));
  check_faulted();  // nor one read, even in part, from the zero pages of a truncated segment
  record_wait(now_ns() - t0, overrun);
}

void PeerClient::record_wait(uint64_t wait_ns, bool overrun) {
  Header& h = segment_->header();
  h.handoffs.fetch_add(1, std::memory_order_relaxed);
  if (overrun) h.overruns.fetch_add(1, std::memory_order_relaxed);
  h.wait_ns_total.fetch_add(wait_ns, std::memory_order_relaxed);
  if (wait_ns > h.wait_ns_max.load(std::memory_order_relaxed)) h.wait_ns_max.store(wait_ns, std::memory_order_relaxed);
  h.wait_hist[wait_bucket(wait_ns)].fetch_add(1, std::memory_order_relaxed);
}

ClientStats PeerClient::stats() const {
  const Header& h = segment_->header();
  ClientStats s;
  s.handoffs = h.handoffs.load(std::memory_order_relaxed);
  s.overruns = h.overruns.load(std::memory_order_relaxed);
  s.wait_ns_total = h.wait_ns_total.load(std::memory_order_relaxed);
  s.wait_ns_max = h.wait_ns_max.load(std::memory_order_relaxed);
  for (int i = 0; i < kWaitBuckets; ++i) s.wait_hist[i] = h.wait_hist[i].load(std::memory_order_relaxed);
  return s;
}

}  // namespace tandem::peer
