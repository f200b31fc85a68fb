// `xfuser`: the tool with subcommands (forward, ...). See docs/tools.md.
#include <iostream>

#include <CLI/CLI.hpp>

#include "backends/error.h"
#include "backends/logging.h"
#include "runner/tool/commands.h"

int main(int argc, char** argv) {
  xfuser::init_logging(-1);
  CLI::App app{"xfuser: tools for xfuser models and checkpoints"};
  app.require_subcommand(1);
  xfuser::runner::tool::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const xfuser::Error& e) {
    std::cerr << "xfuser: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "xfuser: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
