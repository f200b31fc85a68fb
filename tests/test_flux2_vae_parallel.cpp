// Patch-parallel decode of AutoencoderKLFlux2 under mpiexec (NP 2 and 4), fp32: the decoder split
// into bands of latent rows over the ranks equals the one-rank decode and diffusers 0.36.0's
// decode (fixture flux2-vae-tiny-s1), also for odd / uneven row counts on a random model.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux2/flux2_vae.h"
#include "models/vae/patch_parallel.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::flux2::AutoencoderKLFlux2;
using xfuser::models::flux2::AutoencoderKLFlux2Config;
using xfuser::models::vae::patch_parallel_decode;
using xfuser::parallel::MpiCommunicator;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

fs::path case_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / "flux2-vae-tiny-s1";
}

at::Tensor fixture_tensor(const std::string& file, const std::string& name) {
  SafetensorsFile f((case_dir() / file).string());
  return f.get(name).clone();
}

class ParallelFlux2Vae : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> ParallelFlux2Vae::world_;

TEST_F(ParallelFlux2Vae, FixtureDecodeEqualsDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto known = xfuser::models::ComponentRegistry::known_classes();
  if (std::find(known.begin(), known.end(), "AutoencoderKLFlux2") == known.end()) {
    xfuser::models::flux2::register_flux2_vae_components();
  }
  auto vae = std::dynamic_pointer_cast<AutoencoderKLFlux2>(
      xfuser::models::load_component(case_dir().string(), at::kFloat));
  ASSERT_NE(vae, nullptr);
  at::Tensor z = fixture_tensor("inputs.safetensors", "z");  // [1, 8, 4, 4]
  at::Tensor got = patch_parallel_decode(*vae, z, *world_);
  at::Tensor want = fixture_tensor("output.safetensors", "decode_sample");
  ASSERT_EQ(got.sizes(), want.sizes());
  const double vs_diffusers = max_rel_error(got, want);
  const double vs_serial = max_rel_error(got, vae->decode(z));
  if (world_rank() == 0)
    std::printf("[flux2 vae] %d ranks: vs diffusers %.2e, vs serial %.2e\n", world_->size(),
                vs_diffusers, vs_serial);
  EXPECT_LE(vs_diffusers, 1e-4);
  EXPECT_LE(vs_serial, 1e-5);
}

TEST_F(ParallelFlux2Vae, UnevenBandsOnARandomModel) {
  nlohmann::json config = {
      {"block_out_channels", {4, 8, 8}},
      {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
      {"latent_channels", 4},
      {"norm_num_groups", 2},
      {"layers_per_block", 1}};
  AutoencoderKLFlux2 vae(AutoencoderKLFlux2Config::from_json(config, "test"));
  vae.init_random(11, 0.3);
  for (int64_t rows : {5, 9}) {
    at::manual_seed(rows);
    at::Tensor z = at::randn({2, 4, rows, 6});
    const double rel = max_rel_error(patch_parallel_decode(vae, z, *world_), vae.decode(z));
    if (world_rank() == 0)
      std::printf("[flux2 vae] %d ranks, %lld latent rows: vs serial %.2e\n", world_->size(),
                  static_cast<long long>(rows), rel);
    EXPECT_LE(rel, 1e-5);
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
