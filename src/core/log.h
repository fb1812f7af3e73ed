// Logging: spdlog to stderr, one format for every process (primary, peer, watchdog), so a lane's
// logs interleave readably. Level from --log-level or TANDEM_LOG (trace, debug, info, warn, error).
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tandem {

// Sets up the default logger; `process` names the process in each line ("primary", "peer", ...).
void init_logging(const std::string& process, const std::string& level = "");

}  // namespace tandem
