// `xfuser make-tiny --arch NAME --out DIR [--seed N]`: writes a complete diffusers-format
// pipeline folder with seeded random weights; every family registers its layouts (TinyArch).
#include <iostream>

#include <CLI/CLI.hpp>

#include "backends/error.h"
#include "models/registry.h"
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
  std::string archs;
  for (const auto& arch : models::FamilyRegistry::tiny_archs()) {
    archs += "\n  " + arch.name + ": " + arch.description;
  }
  cmd->add_option("--arch", opts->arch, "Architecture:" + archs)->capture_default_str();
  cmd->add_option("--out", opts->out, "Output folder (must not exist, or be empty)")->required();
  cmd->add_option("--seed", opts->seed, "Seed of the random weights")->capture_default_str();
  cmd->callback([opts] {
    models::FamilyRegistry::find_tiny_arch(opts->arch).write(opts->out, opts->seed);
    std::cout << "wrote tiny " << opts->arch << " pipeline to " << opts->out << std::endl;
  });
}

}  // namespace xfuser::runner::tool
