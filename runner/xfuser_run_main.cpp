// `xfuser-run`: generate images with a registered model, on one rank or under mpirun.
// Flags follow xDiT's runner (see `xfuser-run --help` and README.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "backends/device.h"
#include "backends/error.h"
#include "backends/logging.h"
#include "backends/memory.h"
#include "backends/threads.h"
#include "models/registry.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "runner/fault_handler.h"
#include "runner/launch.h"
#include "runner/run_config.h"
#include "runner/runner.h"

namespace {

// After an error on a multi-rank run: every rank is ended through MPI_Abort. Open MPI then
// prints its own follow-up (the MPI_ABORT banner, ORTE_ERROR_LOG lines, the other ranks'
// "received SIGTERM"), which is the consequence of the error above, not another one: say so.
void end_job(int world_size) {
  if (world_size <= 1) return;
  spdlog::error(
      "ending every rank of the job (MPI_Abort): the Open MPI messages that follow (MPI_ABORT "
      "was invoked, ORTE_ERROR_LOG, other ranks' \"received SIGTERM\") are its consequence, not "
      "further errors");
  // mpirun forwards each rank's output asynchronously but prints its own MPI_ABORT banner at
  // once: flush, then give the forwarding a moment, so the reason comes before the banner even on
  // a loaded machine (only on this error path).
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  xfuser::parallel::MpiEnvironment::abort(1);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace xfuser;
  // The launcher's rank (if any) until MPI is up, so early messages name it.
  const char* launcher_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  runner::install_fault_handlers(launcher_rank ? std::atoi(launcher_rank) : -1);
  runner::RunConfig config;
  CLI::App app{"xfuser-run: parallel diffusion-transformer inference (xDiT's runner, natively)"};
  runner::add_run_flags(app, config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  int world_size = 1;
  try {
    parallel::MpiEnvironment mpi(&argc, &argv);
    world_size = mpi.size();
    runner::install_fault_handlers(mpi.rank());
    if (world_size > 1) runner::start_parent_watchdog();
    init_logging(mpi.rank(), config.log_level);
    backends::check_cxx_runtime();  // a clear error, not a crash, on a mislinked binary
    // Flag values first, so a bad value is named by its flag before the mesh is built from it.
    runner::validate_values(config);
    if (config.dry_run) {
      // The plan needs no mesh: the degrees give the world it describes.
      return mpi.rank() == 0 ? runner::print_memory_plan(config) : 0;
    }
    // The device, then the mesh (runner/launch.h).
    const std::shared_ptr<parallel::ProcessGroups> groups =
        runner::make_process_groups(config, mpi);
    // Every host tensor from here on is counted: the report's measured peak beside the plan.
    track_host_tensor_memory();
    const int threads = configure_threads(mpi.local_size());

    runner::Runner runner(config, groups);
    auto args = runner.preprocess_args();
    if (mpi.rank() == 0) {
      spdlog::info("model {} | {}x{} | {} steps | guidance {} | seed {} | dtype {} | {} thread(s)",
                   args.spec->id, args.request.height, args.request.width,
                   args.request.num_inference_steps, args.request.guidance_scale, args.config.seed,
                   args.config.dtype, threads);
    }
    runner.initialize(args);
    if (config.profile) {
      // Like xDiT: in profile mode only the traces are written (no images, no timings).
      spdlog::info("wrote {}", runner.profile(args).string());
      runner.cleanup();
      return 0;
    }
    auto result = runner.run(args);
    for (const auto& path : runner.save(args, result)) spdlog::info("wrote {}", path.string());
    if (groups) {
      // Per-rank communication report: calls, bytes and seconds per group and operation.
      for (const auto& [group, ops] : groups->stats()) {
        for (const auto& [op, st] : ops) {
          spdlog::info("comm {} {}: {} calls, {} bytes, {:.3f} s", group, op, st.calls, st.bytes,
                       st.seconds);
        }
      }
    }
    runner.cleanup();
  } catch (const xfuser::Error& e) {
    // The first line is the reason; the context and the source location follow.
    spdlog::error("{}", e.what());
    end_job(world_size);
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    end_job(world_size);
    return 1;
  }
  return 0;
}
