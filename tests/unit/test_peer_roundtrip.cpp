// Client and server in one process (server on a thread, one shared mapping): answers equal the mock
// reference exactly, every malformed request gets its error status while the peer keeps serving, a
// wait never returns without the answer, a trip fails the wait, refusals and shutdowns end cleanly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "lane_tools/mock_compute.h"
#include "peer/client.h"
#include "peer/server.h"
#include "peer/sync.h"

namespace tandem::peer {
namespace {

using test::make_mock_request;
using test::MockCompute;

constexpr int kLayers = 4, kExperts = 12;

Geometry geometry(uint32_t slots = 2, uint32_t rows = 8, uint32_t hidden = 16, uint32_t k = 4) {
  Geometry g;
  g.n_slots = slots;
  g.max_rows = rows;
  g.hidden = hidden;
  g.max_k = k;
  return g;
}

// A compute that can be held: compute() blocks until release().
class GatedCompute : public MockCompute {
 public:
  GatedCompute() : MockCompute(kLayers, kExperts, 16) {}
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* w, int64_t k,
               float* out) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    MockCompute::compute(layer, x, n_rows, ids, w, k, out);
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
};

struct Lane {
  Lane(PeerCompute& compute, Geometry g = geometry(), uint64_t fp = 42, ServerOptions so = {}) {
    lane = fmt::format("rt-{}-{}", getpid(), counter++);
    segment = Segment::create(lane, fp, g);
    server = std::make_unique<PeerServer>(segment, compute, so);
    thread = std::thread([this] { end = server->serve(); });
  }
  ~Lane() {
    client.reset();
    server->request_stop();
    thread.join();
  }
  void attach(uint64_t fp = 42, ClientOptions o = {}, Geometry g = geometry()) {
    client = PeerClient::attach(segment, fp, g, o);
  }
  static inline int counter = 0;
  std::string lane;
  std::shared_ptr<Segment> segment;
  std::unique_ptr<PeerServer> server;
  std::unique_ptr<PeerClient> client;
  std::thread thread;
  ServeEnd end = ServeEnd::kStopped;
};

TEST(PeerRoundTrip, AnswersEqualTheReference) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  std::mt19937_64 rng(7);
  std::vector<float> out(8 * 16);
  for (int i = 0; i < 300; ++i) {
    auto q = make_mock_request(rng, kLayers, kExperts, 16, 8, 4);
    lane.client->submit(i % 2, q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
    lane.client->wait(i % 2, out.data());
    ASSERT_EQ(0, std::memcmp(out.data(), q.expected.data(), q.expected.size() * 4)) << "request " << i;
  }
  EXPECT_EQ(lane.client->stats().handoffs, 300u);
  EXPECT_EQ(lane.server->served(), 300u);
}

TEST(PeerRoundTrip, TwoSlotsInFlightAndSmallerK) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  std::mt19937_64 rng(3);
  std::vector<float> out0(8 * 16), out1(8 * 16);
  for (int i = 0; i < 100; ++i) {
    auto a = make_mock_request(rng, kLayers, kExperts, 16, 8, 2);  // k < max_k: strided copy
    auto b = make_mock_request(rng, kLayers, kExperts, 16, 8, 4);
    lane.client->submit(0, a.layer, a.x.data(), a.n_rows, a.ids.data(), a.weights.data(), a.k);
    lane.client->submit(1, b.layer, b.x.data(), b.n_rows, b.ids.data(), b.weights.data(), b.k);
    lane.client->wait(1, out1.data());
    lane.client->wait(0, out0.data());
    ASSERT_EQ(0, std::memcmp(out0.data(), a.expected.data(), a.expected.size() * 4));
    ASSERT_EQ(0, std::memcmp(out1.data(), b.expected.data(), b.expected.size() * 4));
  }
}

TEST(PeerRoundTrip, ZeroRowsAndEmptySlots) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  std::vector<float> x(16, 1.0f), out(16, 123.0f);
  std::vector<int32_t> ids(4, -1);
  std::vector<float> w(4, 0.5f);
  lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 4);
  lane.client->wait(out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);  // no cold expert in the row: zeros, computed by the peer
  lane.client->submit(0, x.data(), 0, ids.data(), w.data(), 4);
  lane.client->wait(out.data());
}

// Sends one request that must fail with `status`; then a valid one that must succeed.
void expect_status_then_recovery(PeerClient& c, int layer, std::vector<int32_t> ids, std::vector<float> w,
                                 Status status, const char* detail) {
  std::vector<float> x(2 * 16, 0.5f), out(2 * 16);
  c.submit(layer, x.data(), 2, ids.data(), w.data(), 4);
  try {
    c.wait(out.data());
    ADD_FAILURE() << "expected status " << to_string(status);
  } catch (const LaneError& e) {
    EXPECT_EQ(e.kind(), LaneError::Kind::kStatus);
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(to_string(status)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
  std::mt19937_64 rng(11);
  auto q = make_mock_request(rng, kLayers, kExperts, 16, 8, 4);
  std::vector<float> good(q.expected.size());
  c.submit(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
  c.wait(good.data());
  EXPECT_EQ(0, std::memcmp(good.data(), q.expected.data(), good.size() * 4));
}

TEST(PeerRoundTrip, MalformedRequestsGetErrorStatusAndPeerKeepsServing) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  PeerClient& c = *lane.client;
  const std::vector<float> w(8, 0.25f);
  // Layer 0: cold experts are 0, 3, 6, 9.
  expect_status_then_recovery(c, 0, {0, 3, -1, 12, 0, 0, 0, 0}, w, Status::kBadExpert, "expert id 12");
  expect_status_then_recovery(c, 0, {0, 3, -1, -1, -7, 0, 0, 0}, w, Status::kBadExpert, "expert id -7");
  expect_status_then_recovery(c, 0, {0, 3, -1, -1, 1, 0, 0, 0}, w, Status::kHotExpert, "expert 1 of layer 0");
  expect_status_then_recovery(c, kLayers, {0, 3, -1, -1, 0, 0, 0, 0}, w, Status::kBadLayer, "layer 4");
  expect_status_then_recovery(c, -1, {0, 3, -1, -1, 0, 0, 0, 0}, w, Status::kBadLayer, "layer -1");
  std::vector<float> nan_w(8, 0.25f);
  nan_w[5] = std::nanf("");
  expect_status_then_recovery(c, 0, {0, 3, -1, -1, 0, 3, 0, 0}, nan_w, Status::kBadWeight, "not finite");
  EXPECT_EQ(lane.segment->header().peer_errors.load(), 6u);
}

TEST(PeerRoundTrip, ComputeErrorIsAStatus) {
  struct Throwing : MockCompute {
    Throwing() : MockCompute(kLayers, kExperts, 16) {}
    void compute(int, const float*, int64_t, const int32_t*, const float*, int64_t, float*) override {
      throw std::runtime_error("device lost");
    }
  } compute;
  Lane lane(compute);
  lane.attach();
  std::vector<float> x(16), out(16);
  std::vector<int32_t> ids = {0, -1, -1, -1};
  std::vector<float> w(4, 1.0f);
  lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 4);
  try {
    lane.client->wait(out.data());
    FAIL() << "expected a compute error";
  } catch (const LaneError& e) {
    EXPECT_EQ(e.status(), Status::kComputeError);
    EXPECT_NE(std::string(e.what()).find("device lost"), std::string::npos);
  }
}

TEST(PeerRoundTrip, ClientRejectsOversizedRequestsLocally) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  std::vector<float> x(9 * 16), w(9 * 5);
  std::vector<int32_t> ids(9 * 5, -1);
  EXPECT_THROW(lane.client->submit(0, x.data(), 9, ids.data(), w.data(), 4), InputError);
  EXPECT_THROW(lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 5), InputError);
  EXPECT_THROW(lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 0), InputError);
  EXPECT_THROW(lane.client->submit(0, x.data(), -1, ids.data(), w.data(), 4), InputError);
}

TEST(PeerRoundTrip, AttachChecksGeometry) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  try {
    lane.attach(42, {}, geometry(2, 8, 32, 4));
    FAIL() << "hidden size mismatch must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size 16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lane.attach(42, {}, geometry(2, 9, 16, 4)), InputError);
  EXPECT_THROW(lane.attach(42, {}, geometry(3, 8, 16, 4)), InputError);
}

TEST(PeerRoundTrip, FingerprintMismatchIsRefusedOnBothSides) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute, geometry(), 0x1111);
  try {
    lane.attach(0x2222);
    FAIL() << "attach must refuse";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fingerprint mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0000000000001111"), std::string::npos) << e.what();
  }
  lane.thread.join();
  EXPECT_EQ(lane.end, ServeEnd::kRefused);
  EXPECT_EQ(lane.segment->header().state.load(), uint32_t(LaneState::kRefused));
  EXPECT_NE(read_bounded(lane.segment->header().refuse_reason, kReasonBytes).find("expects 0000000000002222"),
            std::string::npos);
  EXPECT_FALSE(Segment::exists(lane.lane));
  lane.thread = std::thread([] {});
}

// The split lane's cut is in the geometry: a primary reads it without attaching (peek_geometry), and one
// that needs another cut (or whole experts) is refused on both sides, the message naming both cuts (the
// peer refuses on the fingerprint, which covers the cut: lane_fingerprint, hence 43 here).
TEST(PeerRoundTrip, PeekReadsTheCutAndAnotherCutIsRefusedOnBothSides) {
  MockCompute compute(kLayers, kExperts, 16);
  Geometry cut16 = geometry();
  cut16.split_column = 16;
  for (uint32_t want : {0u, 8u}) {
    Lane lane(compute, cut16);
    EXPECT_EQ(peek_geometry(lane.lane, 5).split_column, 16u);
    EXPECT_EQ(lane.segment->header().primary_pid.load(), 0);  // peeking claims nothing
    Geometry g = geometry();
    g.split_column = want;
    try {
      lane.attach(43, {}, g);
      ADD_FAILURE() << "attached with cut " << want << " to a peer cutting at 16";
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("peer cuts each cold expert at intermediate feature 16"), std::string::npos) << m;
      EXPECT_NE(m.find(want ? "primary cuts each cold expert at intermediate feature 8" : "computes whole cold experts"),
                std::string::npos)
          << m;
    }
    lane.thread.join();
    EXPECT_EQ(lane.end, ServeEnd::kRefused);
    lane.thread = std::thread([] {});
  }
  Lane lane(compute, cut16);
  ASSERT_NO_THROW(lane.attach(42, {}, cut16));  // the same cut attaches
}

TEST(PeerRoundTrip, WaitDoesNotReturnWithoutTheAnswer) {
  GatedCompute compute;
  Lane lane(compute);
  ClientOptions o;
  o.spin_limit_us = 1;
  lane.attach(42, o);
  std::mt19937_64 rng(5);
  auto q = make_mock_request(rng, kLayers, kExperts, 16, 8, 4);
  std::vector<float> out(q.expected.size(), -1.0f);
  lane.client->submit(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    lane.client->wait(out.data());
    returned = true;
  });
  compute.wait_entered();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // far past the 1 µs spin limit
  EXPECT_FALSE(returned.load());
  compute.release();
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(0, std::memcmp(out.data(), q.expected.data(), out.size() * 4));
  EXPECT_EQ(lane.client->stats().overruns, 1u);
}

TEST(PeerRoundTrip, TripFailsTheWaitNamingTheCause) {
  GatedCompute compute;
  Lane lane(compute);
  lane.attach();
  std::vector<float> x(16), out(16);
  std::vector<int32_t> ids = {0, -1, -1, -1};
  std::vector<float> w(4, 1.0f);
  lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 4);
  auto waited = std::async(std::launch::async, [&] { lane.client->wait(out.data()); });
  compute.wait_entered();
  Header& h = lane.segment->header();
  write_bounded(h.trip_reason, kReasonBytes, "watchdog: test stall");
  h.trip_cause.store(uint32_t(TripCause::kStall));
  h.state.store(uint32_t(LaneState::kTripped), std::memory_order_release);
  try {
    waited.get();
    FAIL() << "wait must fail on a trip";
  } catch (const LaneTripped& e) {
    EXPECT_EQ(e.cause(), TripCause::kStall);
    EXPECT_NE(std::string(e.what()).find("test stall"), std::string::npos) << e.what();
  }
  // The answer arrives after the trip: it is not used, and nothing more can be submitted.
  compute.release();
  EXPECT_THROW(lane.client->submit(0, x.data(), 1, ids.data(), w.data(), 4), LaneTripped);
}

TEST(PeerRoundTrip, ClientCloseStopsThePeer) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.attach();
  lane.client->close();
  lane.thread.join();
  EXPECT_EQ(lane.end, ServeEnd::kLaneStopped);
  EXPECT_FALSE(Segment::exists(lane.lane));
  lane.thread = std::thread([] {});
}

TEST(PeerRoundTrip, StaleHeartbeatMeansPrimaryGone) {
  MockCompute compute(kLayers, kExperts, 16);
  ServerOptions so;
  so.primary_stall_s = 0.05;
  Lane lane(compute, geometry(), 42, so);
  ClientOptions o;
  o.heartbeat_interval_ms = 0;  // no heartbeat thread: the heartbeat goes stale while idle
  lane.attach(42, o);
  lane.thread.join();
  EXPECT_EQ(lane.end, ServeEnd::kPrimaryGone);
  EXPECT_FALSE(Segment::exists(lane.lane));
  lane.thread = std::thread([] {});
}

// A GPU primary's stream publishes requests but cannot wake a futex: its host rings before each step.
TEST(PeerRoundTrip, RingWakesANappingPeerWithoutARequest) {
  MockCompute compute(kLayers, kExperts, 16);
  ServerOptions so;
  so.spin_us = 500'000;     // awake for 0.5 s after a wake-up (the test polls every 1 ms)
  so.idle_nap_ms = 20'000;  // a nap nobody ends lasts 20 s
  Lane lane(compute, geometry(), 42, so);
  lane.attach();
  const Header& h = lane.segment->header();
  auto becomes = [&](uint32_t sleeping, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (h.peer_sleeping.load() == sleeping) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  ASSERT_TRUE(becomes(1, 10.0)) << "the idle peer never napped";
  lane.client->ring();
  EXPECT_TRUE(becomes(0, 2.0)) << "the ring did not wake the peer";
  EXPECT_EQ(lane.server->served(), 0u);
}

// A primary that publishes without ringing (as a GPU's stream does): the peer's naps delay its answers
// until, after the second such request, it learns to keep polling; then answers come at once.
TEST(PeerRoundTrip, PeerLearnsToPollForAPrimaryThatDoesNotRing) {
  MockCompute compute(kLayers, kExperts, 16);
  ServerOptions so;  // spin_us 100: naps between requests 20 ms apart
  so.idle_nap_ms = 300;
  so.unrung_spin_us = 2'000'000;
  Lane lane(compute, geometry(), 42, so);
  ClientOptions o;
  o.ring_per_request = false;
  lane.attach(42, o);
  std::mt19937_64 rng(5);
  std::vector<float> out(8 * 16);
  auto round_trip_s = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the peer's 100 µs spin
    auto q = make_mock_request(rng, kLayers, kExperts, 16, 8, 4);
    const auto t0 = std::chrono::steady_clock::now();
    lane.client->submit(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
    lane.client->wait(out.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(0, std::memcmp(out.data(), q.expected.data(), q.expected.size() * 4));
    return s;
  };
  EXPECT_EQ(lane.server->spin_us(), 100u);
  double first = 0;
  for (int i = 0; i < 10 && lane.server->spin_us() == 100u; ++i) first = std::max(first, round_trip_s());
  ASSERT_EQ(lane.server->spin_us(), 2'000'000u) << "the peer never learned";
  EXPECT_GT(first, 0.1) << "an unrung request was answered before the nap ended";
  for (int i = 0; i < 5; ++i) EXPECT_LT(round_trip_s(), 0.15) << "request " << i << " waited for a nap";
}

TEST(PeerRoundTrip, RequestStopEndsServe) {
  MockCompute compute(kLayers, kExperts, 16);
  Lane lane(compute);
  lane.server->request_stop();
  lane.thread.join();
  EXPECT_EQ(lane.end, ServeEnd::kStopped);
  EXPECT_EQ(lane.segment->header().state.load(), uint32_t(LaneState::kStopped));
  lane.thread = std::thread([] {});
}

}  // namespace
}  // namespace tandem::peer
