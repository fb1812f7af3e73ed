// The watchdog's decision logic over synthetic samples and times (no clocks, no processes).
#include <gtest/gtest.h>

#include "peer/protocol.h"
#include "watchdog/watchdog.h"

namespace tandem::watchdog {
namespace {

constexpr uint64_t kSec = 1'000'000'000ULL;

LaneSample sample(uint64_t req, uint64_t resp, uint32_t state = uint32_t(peer::LaneState::kServing)) {
  LaneSample s;
  s.state = state;
  s.slots = {{req, resp}};
  return s;
}

TEST(PeerWatchdog, PendingWithoutProgressTripsAfterStall) {
  StallDetector d(2.0, 1);
  EXPECT_EQ(d.observe(0, sample(5, 4)).verdict, Verdict::kHealthy);
  EXPECT_EQ(d.observe(kSec, sample(5, 4)).verdict, Verdict::kHealthy);
  Finding f = d.observe(2 * kSec + 1, sample(5, 4));
  EXPECT_EQ(f.verdict, Verdict::kStall);
  EXPECT_EQ(f.slot, 0);
  EXPECT_GE(f.stalled_s, 2.0);
  EXPECT_NE(f.detail.find("request 5 pending"), std::string::npos);
}

TEST(PeerWatchdog, ProgressResetsTheClock) {
  StallDetector d(2.0, 1);
  d.observe(0, sample(5, 4));
  EXPECT_EQ(d.observe(1 * kSec + kSec / 2, sample(6, 5)).verdict, Verdict::kHealthy);  // moved
  EXPECT_EQ(d.observe(3 * kSec, sample(6, 5)).verdict, Verdict::kHealthy);            // 1.5 s since the move
  EXPECT_EQ(d.observe(3 * kSec + kSec / 2 + 1, sample(6, 5)).verdict, Verdict::kStall);
}

TEST(PeerWatchdog, IdleLaneNeverTrips) {
  StallDetector d(1.0, 1);
  for (uint64_t t = 0; t < 100; ++t) EXPECT_EQ(d.observe(t * kSec, sample(9, 9)).verdict, Verdict::kHealthy);
  // Work that appears after a long idle period gets the full stall time.
  EXPECT_EQ(d.observe(100 * kSec, sample(10, 9)).verdict, Verdict::kHealthy);
  EXPECT_EQ(d.observe(100 * kSec + kSec / 2, sample(10, 9)).verdict, Verdict::kHealthy);
  EXPECT_EQ(d.observe(101 * kSec, sample(10, 9)).verdict, Verdict::kStall);
}

TEST(PeerWatchdog, StalledSlotAmongSeveral) {
  StallDetector d(1.0, 3);
  LaneSample s = sample(0, 0);
  s.slots = {{3, 3}, {7, 6}, {1, 1}};
  d.observe(0, s);
  s.slots = {{4, 4}, {7, 6}, {2, 2}};  // slots 0 and 2 progress, slot 1 stuck
  Finding f = d.observe(2 * kSec, s);
  EXPECT_EQ(f.verdict, Verdict::kStall);
  EXPECT_EQ(f.slot, 1);
}

TEST(PeerWatchdog, ProcessesGone) {
  StallDetector d(1.0, 1);
  LaneSample s = sample(1, 1);
  s.peer_alive = false;
  EXPECT_EQ(d.observe(0, s).verdict, Verdict::kPeerGone);
  s.peer_alive = true;
  s.primary_alive = false;
  EXPECT_EQ(d.observe(1, s).verdict, Verdict::kPrimaryGone);
}

TEST(PeerWatchdog, CountersInconsistent) {
  {
    StallDetector d(1.0, 1);
    Finding f = d.observe(0, sample(3, 4));
    EXPECT_EQ(f.verdict, Verdict::kProtocol);
    EXPECT_NE(f.detail.find("ahead"), std::string::npos);
  }
  {
    StallDetector d(1.0, 1);
    d.observe(0, sample(10, 10));
    Finding f = d.observe(1, sample(8, 8));
    EXPECT_EQ(f.verdict, Verdict::kProtocol);
    EXPECT_NE(f.detail.find("went backwards"), std::string::npos);
  }
  {
    StallDetector d(1.0, 2);
    EXPECT_EQ(d.observe(0, sample(1, 1)).verdict, Verdict::kProtocol);  // wrong slot count
  }
}

TEST(PeerWatchdog, StoppedAndTrippedStates) {
  StallDetector d(1.0, 1);
  EXPECT_EQ(d.observe(0, sample(5, 4, uint32_t(peer::LaneState::kStopped))).verdict, Verdict::kStopped);
  EXPECT_EQ(d.observe(0, sample(5, 4, uint32_t(peer::LaneState::kTripped))).verdict, Verdict::kTripped);
}

}  // namespace
}  // namespace tandem::watchdog
