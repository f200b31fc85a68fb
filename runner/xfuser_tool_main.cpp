// `xfuser`: the tool with subcommands (forward, ...). See docs/tools.md.
#include <mpi.h>

#include <iostream>

#include <CLI/CLI.hpp>

#include "backends/device.h"
#include "backends/error.h"
#include "backends/logging.h"
#include "parallel/mpi_env.h"
#include "runner/fault_handler.h"
#include "runner/tool/commands.h"

int main(int argc, char** argv) {
  xfuser::init_logging(-1);
  xfuser::runner::install_fault_handlers(-1);
  CLI::App app{"xfuser: tools for xfuser models and checkpoints"};
  app.require_subcommand(1);
  xfuser::runner::tool::register_commands(app);
  try {
    xfuser::backends::check_cxx_runtime();  // a clear error, not a crash, on a mislinked binary
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "xfuser: error: " << e.what() << std::endl;
    // Under mpirun one failing rank ends the job instead of leaving the others waiting.
    int initialized = 0, finalized = 0, size = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (size > 1) xfuser::parallel::MpiEnvironment::abort(1);
    }
    return 1;
  }
  return 0;
}
