// A C++ program that generates an image through xfuser's Runner API (the life cycle of
// xfuser-run: preprocess_args -> initialize -> run -> save -> cleanup).
//
//   build/bin/xfuser-example-generate "a cat in a garden" out/
#include <iostream>

#include "backends/error.h"
#include "parallel/mpi_env.h"
#include "runner/runner.h"

int main(int argc, char** argv) {
  xfuser::parallel::MpiEnvironment mpi(&argc, &argv);
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " PROMPT OUTPUT_DIR" << std::endl;
    return 2;
  }
  try {
    xfuser::runner::RunConfig config;
    config.model = "tiny-flux";
    config.prompt = {argv[1]};
    config.height = 256;
    config.width = 256;
    config.num_inference_steps = 4;
    config.output_directory = argv[2];
    xfuser::runner::Runner runner(config);
    auto args = runner.preprocess_args();
    runner.initialize(args);
    auto result = runner.run(args);
    for (const auto& path : runner.save(args, result)) std::cout << path.string() << std::endl;
    runner.cleanup();
  } catch (const xfuser::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
