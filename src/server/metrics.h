// The server's counters and histograms, rendered in Prometheus' text format (version 0.0.4) with the
// scheduler's and the lane's state at the time of the scrape. Thread-safe: handlers and the engine
// thread record, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/scheduler.h"

namespace tandem::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending (+Inf is implied)
  void observe(double v);
  // `name`_bucket{le=...}, _sum, _count lines (no HELP/TYPE).
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One finished HTTP request: the endpoint ("/v1/chat/completions", ...) and the status sent.
  void count_request(const std::string& endpoint, int status);
  // One generation request over, by how it ended: stop, length, error or cancelled (the client left).
  void count_answer(const std::string& finish);
  void add_prompt_tokens(int64_t n);
  void add_generated_tokens(int64_t n);
  void observe_ttft(double seconds);  // submit to first token
  void observe_tpot(double seconds);  // mean time per output token after the first, per request
  // Every metric, with the scheduler's and the lane's gauges from `s`.
  std::string render(const SchedulerSnapshot& s) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> answers_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_;
};

}  // namespace tandem::server
