// Prometheus text rendering (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

namespace tandem::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  return out;
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}
void Metrics::count_answer(const std::string& finish) {
  std::lock_guard lock(mu_);
  ++answers_[finish];
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += uint64_t(n);
}
void Metrics::add_generated_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  generated_tokens_ += uint64_t(n);
}
void Metrics::observe_ttft(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}
void Metrics::observe_tpot(double seconds) {
  std::lock_guard lock(mu_);
  tpot_.observe(seconds);
}

namespace {
void head(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
}  // namespace

std::string Metrics::render(const SchedulerSnapshot& s) const {
  std::string out;
  {
    std::lock_guard lock(mu_);
    head(out, "tandem_requests_total", "counter", "HTTP requests answered, by endpoint and status");
    for (const auto& [key, n] : requests_)
      out += fmt::format("tandem_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    head(out, "tandem_answers_total", "counter",
         "Generation requests over, by finish: stop, length, error (a failed lane: never a truncated answer), "
         "cancelled (the client left)");
    for (const auto& [finish, n] : answers_) out += fmt::format("tandem_answers_total{{finish=\"{}\"}} {}\n", finish, n);
    head(out, "tandem_prompt_tokens_total", "counter", "Prompt tokens prefilled");
    out += fmt::format("tandem_prompt_tokens_total {}\n", prompt_tokens_);
    head(out, "tandem_generated_tokens_total", "counter", "Tokens generated");
    out += fmt::format("tandem_generated_tokens_total {}\n", generated_tokens_);
    head(out, "tandem_time_to_first_token_seconds", "histogram", "From a request's admission to the queue to its first token");
    out += ttft_.render("tandem_time_to_first_token_seconds");
    head(out, "tandem_time_per_output_token_seconds", "histogram", "Mean time per output token after the first, per request");
    out += tpot_.render("tandem_time_per_output_token_seconds");
  }
  head(out, "tandem_running_sequences", "gauge", "Sequences in the engine");
  out += fmt::format("tandem_running_sequences {}\n", s.running);
  head(out, "tandem_waiting_requests", "gauge", "Requests waiting for admission");
  out += fmt::format("tandem_waiting_requests {}\n", s.waiting);
  head(out, "tandem_engine_steps_total", "counter", "Forward steps run");
  out += fmt::format("tandem_engine_steps_total {}\n", s.steps);
  head(out, "tandem_kv_blocks", "gauge", "KV cache pool blocks (total 0: no fixed pool)");
  out += fmt::format("tandem_kv_blocks{{state=\"total\"}} {}\n", s.kv.blocks_total);
  out += fmt::format("tandem_kv_blocks{{state=\"used\"}} {}\n", s.kv.blocks_used);
  out += fmt::format("tandem_kv_blocks{{state=\"free\"}} {}\n", std::max<int64_t>(0, s.kv.blocks_total - s.kv.blocks_used));
  out += fmt::format("tandem_kv_blocks{{state=\"reserved\"}} {}\n", s.kv_blocks_reserved);
  head(out, "tandem_healthy", "gauge", "1 while the server accepts requests (what /health says)");
  out += fmt::format("tandem_healthy {}\n", s.healthy ? 1 : 0);
  const LaneSnapshot& l = s.lane;
  head(out, "tandem_lane_serving", "gauge", "1 while the lane serves, by lane and state");
  out += fmt::format("tandem_lane_serving{{lane=\"{}\",state=\"{}\"}} {}\n", l.name, l.state, l.serving ? 1 : 0);
  head(out, "tandem_lane_restarts_total", "counter", "Fresh lanes started after a trip (--restart-lane)");
  out += fmt::format("tandem_lane_restarts_total {}\n", l.restarts);
  if (l.has_peer) {
    head(out, "tandem_lane_handoffs_total", "counter", "Handoffs to the peer answered");
    out += fmt::format("tandem_lane_handoffs_total {}\n", l.handoffs);
    head(out, "tandem_lane_rows_sent_total", "counter", "Rows sent to the peer");
    out += fmt::format("tandem_lane_rows_sent_total {}\n", l.rows_sent);
    head(out, "tandem_lane_overruns_total", "counter", "Handoff waits that outlasted the spin limit");
    out += fmt::format("tandem_lane_overruns_total {}\n", l.overruns);
    head(out, "tandem_lane_handoff_wait_seconds", "histogram", "Time the primary waited for the peer's answer");
    uint64_t cum = 0;
    for (size_t i = 0; i < l.wait_hist.size(); ++i) {
      cum += l.wait_hist[i];
      const double le = i == 0 ? 1e-6 : double(uint64_t(1) << i) * 1e-6;
      out += fmt::format("tandem_lane_handoff_wait_seconds_bucket{{le=\"{}\"}} {}\n", le, cum);
    }
    out += fmt::format("tandem_lane_handoff_wait_seconds_bucket{{le=\"+Inf\"}} {}\n", l.handoffs);
    out += fmt::format("tandem_lane_handoff_wait_seconds_sum {}\n", double(l.wait_ns_total) * 1e-9);
    out += fmt::format("tandem_lane_handoff_wait_seconds_count {}\n", l.handoffs);
    head(out, "tandem_lane_cold_share", "gauge", "Share of routed (row, expert) slots that went to cold experts");
    out += fmt::format("tandem_lane_cold_share {}\n",
                       l.routed_slots ? double(l.cold_slots) / double(l.routed_slots) : 0.0);
    head(out, "tandem_lane_layer_cold_share", "gauge",
         "Share of routed (row, expert) slots that went to cold experts, per MoE layer that routed any");
    for (size_t i = 0; i < l.routed_slots_by_layer.size() && i < l.cold_slots_by_layer.size(); ++i)
      if (const uint64_t routed = l.routed_slots_by_layer[i])
        out += fmt::format("tandem_lane_layer_cold_share{{layer=\"{}\"}} {}\n", i,
                           double(l.cold_slots_by_layer[i]) / double(routed));
    head(out, "tandem_lane_check_rows_total", "counter", "Rows the check gate recomputed");
    out += fmt::format("tandem_lane_check_rows_total {}\n", l.checks);
    head(out, "tandem_lane_check_min_cosine", "gauge", "Lowest cosine the check gate saw (1 when none)");
    out += fmt::format("tandem_lane_check_min_cosine {}\n", l.check_min_cosine);
  }
  return out;
}

}  // namespace tandem::server
