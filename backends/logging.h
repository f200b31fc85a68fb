// Logging: spdlog with a "[rank r]" prefix on every line. Call init_logging once per process.
#pragma once

#include <string>

namespace xfuser {

// Sets up the default spdlog logger: "[rank r] [level] message" on stderr. `level` is one of
// trace, debug, info, warn, error (an unknown name is an error naming the accepted ones).
void init_logging(int rank, const std::string& level = "info");

}  // namespace xfuser
