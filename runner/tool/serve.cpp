// `xfuser serve <xfuser-run flags> [serving flags]`: the model loaded once over the ranks of an
// mpirun job, behind an OpenAI-compatible HTTP API (runner/serve/server.h, docs/serving.md).
#include <memory>

#include <CLI/CLI.hpp>

#include "runner/run_config.h"
#include "runner/serve/server.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {

void register_serve(CLI::App& app) {
  auto run = std::make_shared<RunConfig>();
  auto config = std::make_shared<serve::ServeConfig>();
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve a model over HTTP (OpenAI's images and videos API) from every rank of an mpirun job");
  add_run_flags(*cmd, *run);
  serve::add_serve_flags(*cmd, *config);
  cmd->callback([run, config] {
    const int code = serve::serve(*run, *config);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace xfuser::runner::tool
