// Logging set-up (see log.h).
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace tandem {

void init_logging(const std::string& process, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(process);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %n[%P] %^%l%$: %v");
  std::string lv = level;
  if (lv.empty()) {
    const char* env = std::getenv("TANDEM_LOG");
    lv = env ? env : "info";
  }
  logger->set_level(spdlog::level::from_str(lv));
  spdlog::set_default_logger(logger);
}

}  // namespace tandem
