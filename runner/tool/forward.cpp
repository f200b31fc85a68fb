// PLACEHOLDER replaced by the FLUX work: `xfuser forward`.
#include <CLI/CLI.hpp>

#include "backends/error.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {

void register_forward(CLI::App& app) {
  auto* cmd = app.add_subcommand("forward", "Run one model component on saved inputs");
  cmd->callback([] { XF_THROW("xfuser forward is not implemented yet"); });
}

}  // namespace xfuser::runner::tool
