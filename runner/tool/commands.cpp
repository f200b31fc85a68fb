#include "runner/tool/commands.h"

#include <CLI/CLI.hpp>

namespace xfuser::runner::tool {

void register_commands(CLI::App& app) {
  register_forward(app);
  register_tokenize(app);
  register_make_tiny(app);
  register_models(app);
  register_validate(app);
  register_trace(app);
  register_compare(app);
  register_serve(app);
}

}  // namespace xfuser::runner::tool
