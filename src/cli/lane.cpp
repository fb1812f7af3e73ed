// `tandem lane --lane NAME`: the lane's counters as the shared-memory header holds them right now —
// state, pids, handoffs, wait time (mean, max, p50/p99 from the histogram), spin-limit overruns, peer
// errors, seconds since each side's last heartbeat. Read-only; safe on a serving lane.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "peer/segment.h"
#include "peer/sync.h"
#include "runtime/runtime.h"

namespace tandem::cli {
namespace {

RunFn setup(CLI::App& app) {
  auto lane = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  app.add_option("--lane", *lane, "Lane name")->required();
  app.add_flag("--json", *json_out, "One JSON object instead of a table");
  return [lane, json_out] {
    peer::validate_lane_name(*lane);
    auto seg = peer::Segment::open(*lane, 0.0);
    auto& h = seg->header();
    const uint64_t now = peer::now_ns();
    const uint64_t handoffs = h.handoffs.load();
    std::vector<uint64_t> hist(peer::kWaitBuckets);
    for (size_t i = 0; i < hist.size(); ++i) hist[i] = h.wait_hist[i].load();
    auto age = [&](uint64_t t) { return t ? double(now - std::min(now, t)) / 1e9 : -1.0; };
    // A lane whose peer process is gone is not serving, whatever its header still says.
    const int32_t peer_pid = h.peer_pid.load();
    const bool peer_alive = peer::signallable_pid(peer_pid) && peer::ProcessHandle::take(peer_pid).valid() &&
                            peer::process_maps_segment(peer_pid, peer::shm_name(*lane));
    const std::string header_state = peer::state_name(h.state.load());
    const bool live_state = header_state == "starting" || header_state == "serving";
    nlohmann::json j = {
        {"lane", *lane},
        {"state", live_state && !peer_alive ? std::string("gone") : header_state},
        {"header_state", header_state},
        {"peer_alive", peer_alive},
        {"trip_cause", peer::cause_name(h.trip_cause.load())},
        {"peer_pid", h.peer_pid.load()},
        {"primary_pid", h.primary_pid.load()},
        {"handoffs", handoffs},
        {"overruns", h.overruns.load()},
        {"wait_mean_us", handoffs ? double(h.wait_ns_total.load()) / double(handoffs) / 1e3 : 0.0},
        {"wait_max_us", double(h.wait_ns_max.load()) / 1e3},
        {"wait_p50", wait_percentile(hist, 0.5)},
        {"wait_p99", wait_percentile(hist, 0.99)},
        {"wait_histogram_us_pow2", hist},
        {"peer_served", h.peer_served.load()},
        {"peer_errors", h.peer_errors.load()},
        {"peer_heartbeat_age_s", age(h.peer_heartbeat_ns.load())},
        {"primary_heartbeat_age_s", age(h.primary_heartbeat_ns.load())}};
    if (live_state && !peer_alive)
      spdlog::warn("lane {}: its peer (pid {}) is gone; the segment is a leftover (a new `tandem peer --lane {}` "
                   "replaces it)",
                   *lane, peer_pid, *lane);
    if (*json_out) {
      fmt::print("{}\n", j.dump());
      return 0;
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "wait_histogram_us_pow2") fmt::print("{:<24} {}\n", it.key(), it.value().dump());
    return 0;
  };
}

}  // namespace
TANDEM_COMMAND(lane, "lane", "Show a lane's shared-memory counters (state, handoffs, waits, overruns)", setup);
}  // namespace tandem::cli
