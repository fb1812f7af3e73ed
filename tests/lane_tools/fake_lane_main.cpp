// tandem_fake_lane: a test-only peer or primary over the real transport with the mock expert function
// (mock_compute.h), so fault tests can freeze, kill and garble real lane processes.
//   tandem_fake_lane peer    --lane L --fingerprint HEX [geometry] [--sleep-us N] [--primary-stall S]
//   tandem_fake_lane primary --lane L --fingerprint HEX [geometry] [--requests N (0 = until stopped)]
// Primary exit codes: 0 every answer matched the reference, 1 a mismatch, 2 bad input / attach refused,
// 3 lane tripped, 4 other lane error. Peer: 0 stopped / lane stopped / primary gone, 1 tripped, 2 refused,
// 4 the segment was damaged (corrupt header, truncated file).
#include <CLI/CLI.hpp>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "lane_tools/mock_compute.h"
#include "peer/client.h"
#include "peer/server.h"
#include "runtime/exit_codes.h"

namespace {

using namespace tandem;

volatile sig_atomic_t g_term = 0;
void on_term(int) { g_term = 1; }

struct Args {
  std::string lane;
  std::string fingerprint = "1";
  uint32_t slots = 1, max_rows = 16, hidden = 8, max_k = 4;
  int layers = 4, experts = 12;
  uint64_t sleep_us = 0;
  double primary_stall_s = 2.0;
  uint64_t spin_us = 50;
  uint64_t requests = 0;
  uint64_t seed = 1;
  uint64_t spin_limit_us = 50;
};

peer::Geometry geometry(const Args& a) {
  peer::Geometry g;
  g.n_slots = a.slots;
  g.max_rows = a.max_rows;
  g.hidden = a.hidden;
  g.max_k = a.max_k;
  return g;
}

int run_peer(const Args& a) {
  test::MockCompute compute(a.layers, a.experts, int(a.hidden), a.sleep_us);
  peer::ServerOptions o;
  o.primary_stall_s = a.primary_stall_s;
  o.spin_us = a.spin_us;
  auto server = peer::PeerServer::create(a.lane, std::stoull(a.fingerprint, nullptr, 16), geometry(a), compute, o);
  peer::install_stop_signals(*server);
  peer::ServeEnd end = server->serve();
  std::printf("peer end: %s served=%llu\n", peer::to_string(end), (unsigned long long)server->served());
  std::fflush(stdout);
  return exit_code(end);  // as `tandem peer`
}

int run_primary(const Args& a) {
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, nullptr);
  peer::ClientOptions o;
  o.spin_limit_us = a.spin_limit_us;
  o.attach_timeout_s = 10;
  auto client = peer::PeerClient::attach(a.lane, std::stoull(a.fingerprint, nullptr, 16), geometry(a), o);
  std::mt19937_64 rng(a.seed);
  std::vector<float> out(size_t(a.max_rows) * a.hidden);
  uint64_t verified = 0;
  try {
    for (uint64_t i = 0; a.requests == 0 || i < a.requests; ++i) {
      if (g_term) {
        // Asked to stop: a tripped lane still fails (the next submit throws), otherwise leave cleanly.
        if (client->segment().header().state.load() != uint32_t(peer::LaneState::kTripped)) break;
      }
      auto q = test::make_mock_request(rng, a.layers, a.experts, a.hidden, a.max_rows, a.max_k);
      client->submit(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), q.k);
      client->wait(out.data());
      if (std::memcmp(out.data(), q.expected.data(), q.expected.size() * sizeof(float)) != 0) {
        std::printf("mismatch at request %llu\n", (unsigned long long)i);
        return 1;
      }
      ++verified;
    }
  } catch (const peer::LaneTripped& e) {
    std::printf("verified=%llu\n", (unsigned long long)verified);
    std::fprintf(stderr, "lane tripped: cause=%s: %s\n", peer::to_string(e.cause()), e.what());
    return 3;
  } catch (const peer::LaneError& e) {
    std::printf("verified=%llu\n", (unsigned long long)verified);
    std::fprintf(stderr, "lane error: %s\n", e.what());
    return 4;
  }
  auto s = client->stats();
  std::printf("ok verified=%llu handoffs=%llu overruns=%llu\n", (unsigned long long)verified,
              (unsigned long long)s.handoffs, (unsigned long long)s.overruns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"test-only fake lane process"};
  app.require_subcommand(1);
  Args a;
  auto add_common = [&](CLI::App* s) {
    s->add_option("--lane", a.lane)->required();
    s->add_option("--fingerprint", a.fingerprint, "hex");
    s->add_option("--slots", a.slots);
    s->add_option("--max-rows", a.max_rows);
    s->add_option("--hidden", a.hidden);
    s->add_option("--max-k", a.max_k);
    s->add_option("--layers", a.layers);
    s->add_option("--experts", a.experts);
  };
  CLI::App* peer_cmd = app.add_subcommand("peer");
  add_common(peer_cmd);
  peer_cmd->add_option("--sleep-us", a.sleep_us, "sleep per request");
  peer_cmd->add_option("--primary-stall", a.primary_stall_s);
  peer_cmd->add_option("--spin-us", a.spin_us);
  CLI::App* primary_cmd = app.add_subcommand("primary");
  add_common(primary_cmd);
  primary_cmd->add_option("--requests", a.requests, "0 = until stopped");
  primary_cmd->add_option("--seed", a.seed);
  primary_cmd->add_option("--spin-limit-us", a.spin_limit_us);
  CLI11_PARSE(app, argc, argv);
  init_logging(peer_cmd->parsed() ? "fake-peer" : "fake-primary");
  try {
    return peer_cmd->parsed() ? run_peer(a) : run_primary(a);
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitBadInput;
  }
}
