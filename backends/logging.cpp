#include "backends/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "backends/error.h"

namespace xfuser {

void init_logging(int rank, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  XF_CHECK(lvl != spdlog::level::off || level == "off", "unknown log level '", level,
           "' (expected trace, debug, info, warn, error or off)");
  auto logger = spdlog::stderr_color_mt("xfuser-" + std::to_string(rank));
  logger->set_pattern(rank >= 0 ? "[rank " + std::to_string(rank) + "] [%^%l%$] %v"
                                : "[%^%l%$] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace xfuser
