// bench_handoff: the cost of one primary -> peer -> primary handoff over the shared-memory lane, with no
// expert work (the peer's compute is a no-op), so what is timed is copy-in, signalling, validation and
// copy-out. Cases: an empty round trip (0 rows) and real row sizes (hidden 2048, 1..64 rows, k 6), each
// over two threads (one mapping) and two processes (fork). Prints a table; --out writes JSON.
#include <CLI/CLI.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "peer/client.h"
#include "peer/server.h"
#include "peer/sync.h"

namespace {

using namespace tandem::peer;

// Every expert cold, nothing computed: the handoff alone.
class NullCompute : public PeerCompute {
 public:
  explicit NullCompute(int n_experts) : n_experts_(n_experts) {}
  int n_layers() const override { return 64; }
  int n_experts() const override { return n_experts_; }
  bool is_cold(int, int) const override { return true; }
  void compute(int, const float*, int64_t, const int32_t*, const float*, int64_t, float*) override {}

 private:
  int n_experts_;
};

struct Options {
  int iters = 20000;
  int warmup = 1000;
  uint32_t hidden = 2048;
  uint32_t k = 6;
  std::vector<uint32_t> rows = {1, 4, 16, 64};
  uint64_t spin_limit_us = 50;
  uint64_t peer_spin_us = 1000;
  std::string transports = "threads,processes";
  std::string out;
};

struct CaseResult {
  std::string transport;
  uint32_t rows = 0;
  double p50_us = 0, p99_us = 0, mean_us = 0, max_us = 0;
  uint64_t overruns = 0;
};

Geometry geometry(const Options& o) {
  Geometry g;
  g.n_slots = 1;
  g.max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  g.hidden = o.hidden;
  g.max_k = o.k;
  return g;
}

double percentile(std::vector<uint64_t>& v, double p) {
  size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + long(i), v.end());
  return double(v[i]) / 1000.0;
}

// Times o.iters round trips of `rows` rows on an attached client.
CaseResult time_case(PeerClient& client, const Options& o, uint32_t rows, const std::string& transport) {
  std::mt19937 rng(1);
  std::vector<float> x(size_t(std::max(rows, 1u)) * o.hidden, 0.5f), out(x.size());
  std::vector<int32_t> ids(size_t(std::max(rows, 1u)) * o.k);
  std::vector<float> w(ids.size(), 0.1f);
  for (auto& id : ids) id = int32_t(rng() % 384);
  uint64_t overruns_before = 0;
  std::vector<uint64_t> ns;
  ns.reserve(size_t(o.iters));
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    if (i == o.warmup) overruns_before = client.stats().overruns;
    const uint64_t t0 = now_ns();
    client.submit(i % 64, x.data(), rows, ids.data(), w.data(), o.k);
    client.wait(out.data());
    const uint64_t t1 = now_ns();
    if (i >= o.warmup) ns.push_back(t1 - t0);
  }
  CaseResult r;
  r.transport = transport;
  r.rows = rows;
  uint64_t sum = 0;
  for (uint64_t v : ns) sum += v;
  r.mean_us = double(sum) / double(ns.size()) / 1000.0;
  r.max_us = double(*std::max_element(ns.begin(), ns.end())) / 1000.0;
  r.p50_us = percentile(ns, 0.50);
  r.p99_us = percentile(ns, 0.99);
  r.overruns = client.stats().overruns - overruns_before;
  return r;
}

std::vector<uint32_t> case_rows(const Options& o) {
  std::vector<uint32_t> rows = {0};  // the empty round trip
  rows.insert(rows.end(), o.rows.begin(), o.rows.end());
  return rows;
}

std::vector<CaseResult> run_threads(const Options& o) {
  const std::string lane = "bench-" + std::to_string(getpid()) + "-t";
  NullCompute compute(384);
  auto seg = Segment::create(lane, 1, geometry(o));
  ServerOptions so;
  so.spin_us = o.peer_spin_us;
  PeerServer server(seg, compute, so);
  std::thread t([&] { server.serve(); });
  std::vector<CaseResult> results;
  {
    ClientOptions co;
    co.spin_limit_us = o.spin_limit_us;
    auto client = PeerClient::attach(seg, 1, geometry(o), co);
    for (uint32_t rows : case_rows(o)) results.push_back(time_case(*client, o, rows, "threads"));
  }
  t.join();
  return results;
}

std::vector<CaseResult> run_processes(const Options& o) {
  const std::string lane = "bench-" + std::to_string(getpid()) + "-p";
  pid_t child = fork();
  if (child == 0) {
    NullCompute compute(384);
    ServerOptions so;
    so.spin_us = o.peer_spin_us;
    auto server = PeerServer::create(lane, 1, geometry(o), compute, so);
    server->serve();
    _exit(0);
  }
  std::vector<CaseResult> results;
  {
    ClientOptions co;
    co.spin_limit_us = o.spin_limit_us;
    auto client = PeerClient::attach(lane, 1, geometry(o), co);
    for (uint32_t rows : case_rows(o)) results.push_back(time_case(*client, o, rows, "processes"));
  }
  int status = 0;
  waitpid(child, &status, 0);
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Shared-memory handoff round trip (no expert work): p50/p99 per handoff"};
  app.add_option("--iters", o.iters, "timed handoffs per case");
  app.add_option("--warmup", o.warmup);
  app.add_option("--hidden", o.hidden);
  app.add_option("--k", o.k);
  app.add_option("--rows", o.rows, "row counts (besides the empty round trip)")->delimiter(',');
  app.add_option("--spin-limit-us", o.spin_limit_us, "primary spin before blocking (--peer-spin-limit)");
  app.add_option("--peer-spin-us", o.peer_spin_us, "peer spin before sleeping");
  app.add_option("--transports", o.transports, "threads,processes");
  app.add_option("--out", o.out, "write JSON here");
  CLI11_PARSE(app, argc, argv);
  tandem::init_logging("bench", "warn");

  std::vector<CaseResult> results;
  if (o.transports.find("threads") != std::string::npos) {
    auto r = run_threads(o);
    results.insert(results.end(), r.begin(), r.end());
  }
  if (o.transports.find("processes") != std::string::npos) {
    auto r = run_processes(o);
    results.insert(results.end(), r.begin(), r.end());
  }
  std::printf("%-10s %5s %7s %3s %10s %10s %10s %10s %9s\n", "transport", "rows", "hidden", "k", "p50_us", "p99_us",
              "mean_us", "max_us", "overruns");
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& r : results) {
    std::printf("%-10s %5u %7u %3u %10.2f %10.2f %10.2f %10.1f %9llu\n", r.transport.c_str(), r.rows,
                r.rows ? o.hidden : 0, r.rows ? o.k : 0, r.p50_us, r.p99_us, r.mean_us, r.max_us,
                (unsigned long long)r.overruns);
    cases.push_back({{"transport", r.transport}, {"rows", r.rows}, {"hidden", o.hidden}, {"k", o.k},
                     {"p50_us", r.p50_us}, {"p99_us", r.p99_us}, {"mean_us", r.mean_us}, {"max_us", r.max_us},
                     {"overruns", r.overruns}, {"iters", o.iters}});
  }
  if (!o.out.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    nlohmann::json doc = {{"bench", "handoff"},
                          {"host", host},
                          {"cpus", std::thread::hardware_concurrency()},
                          {"spin_limit_us", o.spin_limit_us},
                          {"peer_spin_us", o.peer_spin_us},
                          {"cases", cases}};
    std::ofstream(o.out) << doc.dump(2) << "\n";
  }
  return 0;
}
