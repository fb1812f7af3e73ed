// `tandem serve` on the peer lane with the peer and the watchdog it starts itself, faulted under load:
// the peer killed, the peer frozen. Every answer in flight ends with an error event (never a truncated
// answer), /health turns 503 within stall + 1 s, no token arrives after that, and with --restart-lane
// (on by default with a child peer) the server is healthy again on a fresh peer and answers as before.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "../lane_tools/rowmap_util.h"
#include "lane_tools/process.h"
#include "serve_harness.h"
#include "test_util.h"

namespace tandem::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kStall = 1.0;  // the server's --stall

// A streamed request whose events are time-stamped as they arrive.
struct TimedStream {
  std::string body;
  std::vector<std::pair<std::string, Clock::time_point>> events;  // data after "data: ", arrival
  std::atomic<int> n_events{0};
  int status = 0;
  void run(int port, const json& request) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = request.dump();
    req.set_header("Content-Type", "application/json");
    size_t pos = 0;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      for (size_t end; (end = body.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
        const std::string ev = body.substr(pos, end - pos);
        if (ev.rfind("data: ", 0) == 0) events.emplace_back(ev.substr(6), Clock::now());
        n_events.store(int(events.size()));
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    c.send(req, res, err);
    status = res.status;
  }
};

class ServeFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    rowmap_ = dir_.path + "/tiny.rowmap.json";
    write_rowmap(tiny_model_dir(), rowmap_, [](int64_t, int64_t e) { return e % 3 == 1; });
    server_ = spawn({tandem_binary(), "serve", "--model", tiny_model_dir(), "--lane", "peer", "--rowmap", rowmap_,
                     "--port", "0", "--threads", "1", "--peer-threads", "1", "--stall", "1", "--ctx", "512",
                     "--max-seqs", "8", "--served-model-name", "tiny"},
                    dir_.path + "/serve.out", dir_.path + "/serve.err");
    ASSERT_TRUE(wait_until([&] { return port_from_log() > 0; }, 30)) << log();
    port_ = port_from_log();
    ASSERT_TRUE(wait_until([&] { return get_json(port_, "/health").status == 200; }, 60)) << log();
  }
  void TearDown() override {
    if (server_.pid > 0 && !server_.reaped) {
      kill(server_.pid, SIGTERM);
      EXPECT_TRUE(wait_exit(server_, 30)) << "serve did not stop on SIGTERM";
      EXPECT_EQ(server_.exit_code, 0) << log();
    }
    // serve stopped its peer: no lane of it is left behind.
    const std::string prefix = "tandem-serve-" + std::to_string(server_.pid) + "-";
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      EXPECT_NE(e.path().filename().string().rfind(prefix, 0), 0u) << "left behind: " << e.path();
  }
  std::string log() const { return read_file(dir_.path + "/serve.err"); }
  int port_from_log() const {
    const std::string text = log();
    const std::string key = "listening on http://127.0.0.1:";
    const size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + key.size());
  }
  std::string answer(const std::string& prompt) {
    auto r = post_json(port_, "/v1/completions", completion_body(prompt, 12).dump());
    EXPECT_EQ(r.status, 200) << r.raw;
    return r.status == 200 ? r.body["choices"][0]["text"].get<std::string>() : std::string("<failed>");
  }

  // Four long streams, the fault once each has sent a few chunks, then the checks of the issue.
  void fault_under_load(int signal) {
    const std::string before = answer("the reference prompt");
    const json h0 = get_json(port_, "/health").body;
    const int64_t peer_pid = h0["lane"].value("peer_pid", int64_t(0));
    ASSERT_GT(peer_pid, 0) << h0.dump();

    constexpr int kStreams = 4;
    std::vector<std::unique_ptr<TimedStream>> streams;
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i) {
      streams.push_back(std::make_unique<TimedStream>());
      threads.emplace_back([&, i] {
        streams[i]->run(port_, completion_body("doomed " + std::to_string(i), 480, true));
      });
    }
    ASSERT_TRUE(wait_until([&] {
      for (auto& s : streams)
        if (s->n_events.load() < 3) return false;
      return true;
    }, 60)) << log();
    ASSERT_EQ(kill(pid_t(peer_pid), signal), 0);
    const auto fault = Clock::now();
    ASSERT_TRUE(wait_until([&] { return get_json(port_, "/health").status == 503; }, 10)) << log();
    const auto down = Clock::now();
    EXPECT_LT(std::chrono::duration<double>(down - fault).count(), kStall + 1.0) << "/health turned 503 too late";
    for (auto& t : threads) t.join();
    for (int i = 0; i < kStreams; ++i) {
      const TimedStream& s = *streams[i];
      EXPECT_EQ(s.status, 200);
      ASSERT_FALSE(s.events.empty());
      // The last event is the error; no [DONE], no finish reason but "error", no text after /health said 503.
      const json last = json::parse(s.events.back().first, nullptr, false);
      ASSERT_TRUE(last.is_object() && last.contains("error")) << "stream " << i << " did not end with an error: " << s.body;
      EXPECT_EQ(last["choices"][0]["finish_reason"], "error");
      EXPECT_EQ(s.body.find("[DONE]"), std::string::npos);
      EXPECT_EQ(s.body.find("\"finish_reason\":\"length\""), std::string::npos) << "stream " << i << " was cut short";
      for (size_t k = 0; k + 1 < s.events.size(); ++k)
        EXPECT_LE(s.events[k].second, down) << "stream " << i << ": a chunk arrived after /health turned 503";
    }
    // New requests are refused while the lane is down or coming back.
    auto refused = post_json(port_, "/v1/completions", completion_body("too early", 2).dump());
    if (refused.status != 200) EXPECT_EQ(refused.status, 503) << refused.raw;
    // --restart-lane: a fresh peer, healthy again after the probe, the same answer as before the fault.
    ASSERT_TRUE(wait_until([&] { return get_json(port_, "/health").status == 200; }, 90)) << log();
    const json h1 = get_json(port_, "/health").body;
    EXPECT_EQ(h1["lane"]["restarts"], 1) << h1.dump();
    EXPECT_NE(h1["lane"].value("peer_pid", int64_t(0)), peer_pid);
    EXPECT_EQ(answer("the reference prompt"), before);
    EXPECT_NE(log().find("probe through lane peer passed"), std::string::npos);
    if (getenv("TANDEM_TEST_VERBOSE")) std::fprintf(stderr, "%s\n", log().c_str());
  }

  TempDir dir_;
  std::string rowmap_;
  Child server_;
  int port_ = 0;
};

// The same server, unfaulted: /metrics gives the cold share of each MoE layer (one series per MoE layer,
// none for a dense one), and since every MoE layer routes the same rows, their mean is the overall share.
using ServePeerLane = ServeFaults;
TEST_F(ServePeerLane, MetricsGiveTheColdSharePerMoeLayer) {
  answer("a prompt that routes");
  auto c = httplib::Client("127.0.0.1", port_);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m && m->status == 200);
  std::map<int, double> layers;
  double overall = -1;
  std::istringstream lines(m->body);
  for (std::string line; std::getline(lines, line);) {
    int layer = -1;
    double v = 0;
    if (std::sscanf(line.c_str(), "tandem_lane_layer_cold_share{layer=\"%d\"} %lf", &layer, &v) == 2) layers[layer] = v;
    if (line.rfind("tandem_lane_cold_share ", 0) == 0) overall = std::stod(line.substr(23));
  }
  const ModelConfig& cfg = tiny_model().cfg;
  std::map<int, double> want_layers;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    if (cfg.layer_is_moe[size_t(l)]) want_layers[int(l)] = 0;
  ASSERT_EQ(layers.size(), want_layers.size()) << m->body;
  double sum = 0;
  for (const auto& [l, v] : layers) {
    EXPECT_TRUE(want_layers.count(l)) << "layer " << l << " is not a MoE layer";
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
    sum += v;
  }
  ASSERT_GT(overall, 0.0) << "a third of the experts are cold, yet no slot went to them: " << m->body;
  EXPECT_NEAR(sum / double(layers.size()), overall, 1e-9) << m->body;
}

TEST_F(ServeFaults, KilledPeerFailsAnswersInFlightAndTheLaneComesBack) { fault_under_load(SIGKILL); }

TEST_F(ServeFaults, FrozenPeerTripsTheWatchdogAndTheLaneComesBack) { fault_under_load(SIGSTOP); }

}  // namespace
}  // namespace tandem::test
