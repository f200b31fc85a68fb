// `xfuser make-tiny --arch flux --out DIR [--seed N]`: writes a complete diffusers-format
// pipeline folder with seeded random weights (see models/flux/tiny_flux.h).
#include <iostream>

#include <CLI/CLI.hpp>

#include "backends/error.h"
#include "models/flux/tiny_flux.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {

void register_make_tiny(CLI::App& app) {
  struct Options {
    std::string arch = "flux";
    std::string out;
    uint64_t seed = 0;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "make-tiny", "Write a tiny diffusers-format pipeline folder with seeded random weights");
  cmd->add_option("--arch", opts->arch, "Architecture")
      ->check(CLI::IsMember({"flux"}))
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "Output folder (must not exist, or be empty)")->required();
  cmd->add_option("--seed", opts->seed, "Seed of the random weights")->capture_default_str();
  cmd->callback([opts] {
    models::flux::make_tiny_flux(opts->out, opts->seed);
    std::cout << "wrote tiny " << opts->arch << " pipeline to " << opts->out << std::endl;
  });
}

}  // namespace xfuser::runner::tool
