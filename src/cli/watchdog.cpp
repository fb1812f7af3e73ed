// `tandem watchdog`: watch a lane's shared counters; trip it on a stall or a vanished process.
// Exit 0 when the lane stops normally, 1 after a trip (enforce), 2 on bad options or no such lane.
#include <memory>

#include "cli/command.h"
#include "watchdog/watchdog.h"

namespace {

tandem::cli::RunFn setup_watchdog(CLI::App& app) {
  auto o = std::make_shared<tandem::watchdog::WatchdogOptions>();
  auto mode = std::make_shared<std::string>("enforce");
  app.add_option("--lane", o->lane, "Lane name ([A-Za-z0-9_-], up to 64 chars)")->required();
  app.add_option("--stall", o->stall_s, "Seconds of pending work with no response progress that trip the lane")
      ->required();
  app.add_option("--mode", *mode, "enforce (trip, stop the processes, remove the segment) or observe (log only)")
      ->check(CLI::IsMember({"enforce", "observe"}));
  app.add_option("--rollback", o->rollback, "Command run via /bin/sh -c after a trip");
  app.add_option("--grace", o->grace_s, "Seconds between SIGTERM and SIGKILL (default 2)");
  app.add_option("--poll", o->poll_s, "Seconds between samples (default min(stall/10, 0.1))");
  app.add_option("--startup-timeout", o->startup_timeout_s, "Seconds to wait for the lane to appear (default 30)");
  return [o, mode] {
    o->mode = *mode == "observe" ? tandem::watchdog::Mode::kObserve : tandem::watchdog::Mode::kEnforce;
    return tandem::watchdog::run_watchdog(*o);
  };
}

}  // namespace

TANDEM_COMMAND(watchdog, "watchdog", "Watch a sidecar lane and stop it cleanly when it stalls", setup_watchdog);
