// Stress of the shared-memory handshake, built with ThreadSanitizer: random row counts on two slots in
// flight, every answer checked bit for bit; client and server on two threads over one mapping (so TSan
// sees every payload access against the counters' release/acquire), then across two processes.
// TANDEM_STRESS_HANDOFFS (default 100000 per case) scales it for the long stress run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "lane_tools/mock_compute.h"
#include "peer/client.h"
#include "peer/server.h"

namespace tandem::peer {
namespace {

constexpr int kLayers = 3, kExperts = 9, kHidden = 8, kRows = 8, kK = 2;

uint64_t handoffs() {
  const char* env = std::getenv("TANDEM_STRESS_HANDOFFS");
  return env ? std::strtoull(env, nullptr, 10) : 100000;
}

Geometry geometry() {
  Geometry g;
  g.n_slots = 2;
  g.max_rows = kRows;
  g.hidden = kHidden;
  g.max_k = kK;
  return g;
}

// Alternates two slots so that two requests are in flight; checks every answer exactly.
void drive(PeerClient& client, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<test::MockRequest> pool;
  for (int i = 0; i < 64; ++i) pool.push_back(test::make_mock_request(rng, kLayers, kExperts, kHidden, kRows, kK));
  std::vector<float> out(kRows * kHidden);
  const test::MockRequest* pending[2] = {nullptr, nullptr};
  for (uint64_t i = 0; i < n + 2; ++i) {
    const int slot = int(i % 2);
    if (pending[slot]) {
      client.wait(slot, out.data());
      const auto& q = *pending[slot];
      ASSERT_EQ(0, std::memcmp(out.data(), q.expected.data(), q.expected.size() * 4)) << "handoff " << i;
      pending[slot] = nullptr;
    }
    if (i < n) {
      const auto& q = pool[rng() % pool.size()];
      client.submit(slot, q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
      pending[slot] = &q;
    }
  }
  EXPECT_EQ(client.stats().handoffs, n);
}

TEST(PeerStress, TwoThreadsOneMapping) {
  const std::string lane = "tsan-" + std::to_string(getpid()) + "-threads";
  test::MockCompute compute(kLayers, kExperts, kHidden);
  auto seg = Segment::create(lane, 9, geometry());
  ServerOptions so;
  so.spin_us = 20;
  PeerServer server(seg, compute, so);
  ServeEnd end = ServeEnd::kStopped;
  std::thread t([&] { end = server.serve(); });
  {
    ClientOptions o;
    o.spin_limit_us = 20;
    auto client = PeerClient::attach(seg, 9, geometry(), o);
    drive(*client, handoffs(), 1);
  }  // the client's close stops the lane
  t.join();
  EXPECT_EQ(end, ServeEnd::kLaneStopped);
  EXPECT_EQ(server.served(), handoffs());
}

TEST(PeerStress, TwoProcesses) {
  const std::string lane = "tsan-" + std::to_string(getpid()) + "-procs";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    test::MockCompute compute(kLayers, kExperts, kHidden);
    ServerOptions so;
    so.spin_us = 20;
    auto server = PeerServer::create(lane, 9, geometry(), compute, so);
    ServeEnd end = server->serve();
    _exit(end == ServeEnd::kLaneStopped && server->served() == handoffs() ? 0 : 1);
  }
  {
    ClientOptions o;
    o.spin_limit_us = 20;
    o.heartbeat_interval_ms = 0;
    auto client = PeerClient::attach(lane, 9, geometry(), o);
    drive(*client, handoffs(), 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer process status " << status;
  EXPECT_FALSE(Segment::exists(lane));
}

}  // namespace
}  // namespace tandem::peer
