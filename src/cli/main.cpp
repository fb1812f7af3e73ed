// tandem: entry point. Parses the command line and dispatches to the registered subcommand. An
// exception that ends a command becomes its exit code through runtime/exit_codes.h, the one map: 0 ok,
// 1 failure (a check or gate failed, a lane tripped), 2 bad input, 4 the lane's shared memory was
// damaged under it (a corrupt header or a truncated segment), 5 a device ran out of memory.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/exit_codes.h"

namespace tandem::cli {
std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace tandem::cli

namespace {
// "tandem 0.1.0 (git 215db1a)": the CMake project version and `git describe` at configure time.
std::string version_string() {
#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif
#ifndef TANDEM_GIT_DESCRIBE
#define TANDEM_GIT_DESCRIBE ""
#endif
  std::string v = std::string("tandem ") + TANDEM_VERSION;
  if (std::string_view(TANDEM_GIT_DESCRIBE).size() > 0) v += std::string(" (git ") + TANDEM_GIT_DESCRIBE + ")";
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App app{"tandem: mixture-of-experts inference split between a primary device and a sidecar peer"};
  app.footer("Exit codes: 0 ok, 1 failure (a check or gate failed, a lane tripped), 2 bad input, 4 the lane's "
             "shared memory was damaged under it, 5 a device ran out of memory.");
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", version_string(), "Print the version (and the git commit it was built from)");  // --log-level may also follow the subcommand
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (default: $TANDEM_LOG or info)");
  auto& registry = cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::RunFn> runs;
  for (const auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runs[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    init_logging(sub->get_name(), log_level);
    try {
      return run();
    } catch (const std::exception& e) {  // bad input, a tripped lane, an error status, out of memory
      std::fprintf(stderr, "error: %s\n", e.what());
      return exit_code(e);
    }
  }
  return kExitBadInput;
}
