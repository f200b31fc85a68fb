// SD3Transformer2DModel under the generic DiT sequence-parallel driver (mpiexec, NP 2): Ulysses 2
// and ring 2 over [image, text] joint attention and the image-only attn2 of the dual-attention
// layer equal the one-rank forward, with the text split (154 tokens) or kept whole (21 tokens),
// on the diffusers fixtures (SD3.5, and patch 2 on a cropped 10 x 18 grid).
#include <mpi.h>

#include <cstdio>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/sd3/sd3_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::sd3::SD3Config;
using xfuser::models::sd3::SD3Transformer2DModel;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

class SD3SequenceParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> SD3SequenceParallel::world_;

TEST_F(SD3SequenceParallel, UlyssesAndRingEqualOneRank) {
  for (const std::string name : {"sd3-tiny_sd35-s1", "sd3-crop-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
    XF_REQUIRE_FIXTURE(dir);
    std::ifstream f(dir / "config.json");
    auto cfg = SD3Config::from_json(nlohmann::json::parse(f), (dir / "config.json").string());
    SD3Transformer2DModel model(cfg);
    SafetensorsFile weights((dir / "diffusion_pytorch_model.safetensors").string());
    model.load(weights, at::kFloat);
    SafetensorsFile inputs_file((dir / "inputs.safetensors").string());
    TensorMap named;
    for (const auto& n : inputs_file.names()) named[n] = inputs_file.get(n).clone();
    const auto in = model.parse_forward_inputs(named);
    const auto want = model.forward(in);
    const auto diffusers = SafetensorsFile((dir / "output.safetensors").string()).get("sample");
    for (auto [ulysses, ring] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
      auto groups = std::make_shared<ProcessGroups>(
          WorldConfig::from_degrees(world_->size(), 1, 1, 1, ulysses, ring, 1), world_);
      auto got = xfuser::models::dit::sequence_parallel_forward(model, in, *groups);
      const double rel = max_rel_error(got, want);
      auto sample = model.forward_outputs(got, named).at("sample");
      const double rel_diffusers = max_rel_error(sample, diffusers);
      if (world_rank() == 0) {
        std::printf("[sd3 sp] %-18s ulysses %d ring %d: vs one rank %.2e, vs diffusers %.2e\n",
                    name.c_str(), ulysses, ring, rel, rel_diffusers);
      }
      EXPECT_LE(rel, 1e-5) << "ulysses " << ulysses << " ring " << ring;
      EXPECT_LE(rel_diffusers, 1e-4) << "ulysses " << ulysses << " ring " << ring;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  xfuser::set_process_rank(world_rank());
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
