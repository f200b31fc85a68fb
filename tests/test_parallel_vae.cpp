// Patch-parallel VAE decode and encode under mpiexec (NP 2 and 4), fp32: the decoder (encoder)
// split into horizontal bands over the ranks (halo rows, the downsamplers' row from the band
// below, all-reduced group-norm statistics, gathered attention keys) equals the one-rank decode
// (encode), for odd and uneven row counts, batches with slicing, more ranks than rows, and over
// the replica group of a data-parallel layout.
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/patch_parallel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::vae::AutoencoderKL;
using xfuser::models::vae::AutoencoderKLConfig;
using xfuser::models::vae::band_rows;
using xfuser::models::vae::patch_parallel_decode;
using xfuser::models::vae::patch_parallel_encode;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Three resolution levels (two upsamplers), the mid-block attention, groups of 2 channels.
std::shared_ptr<AutoencoderKL> random_vae() {
  nlohmann::json config = {
      {"block_out_channels", {4, 8, 8}},
      {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
      {"latent_channels", 4},
      {"norm_num_groups", 2},
      {"layers_per_block", 1}};
  auto vae = std::make_shared<AutoencoderKL>(AutoencoderKLConfig::from_json(config, "test"));
  vae->init_random(7, 0.3);
  return vae;
}

class ParallelVae : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> ParallelVae::world_;

TEST(BandRows, EvenAsPossibleFirstBandsLonger) {
  EXPECT_EQ(band_rows(9, 4), (std::vector<int64_t>{3, 2, 2, 2}));
  EXPECT_EQ(band_rows(9, 2), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(band_rows(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
}

TEST_F(ParallelVae, BandDecodeEqualsSerialDecode) {
  auto vae = random_vae();
  struct Case {
    int64_t batch, rows, cols;
    bool slicing;
  };
  // Odd and uneven row counts (9 = 5+4 or 3+2+2+2; 5 = 3+2 or 2+1+1+1), a batch with slicing,
  // and fewer rows than 4 ranks (every rank decodes the whole latent).
  for (const Case& c :
       {Case{1, 9, 7, false}, Case{2, 5, 6, true}, Case{2, 5, 6, false}, Case{1, 3, 4, false}}) {
    at::manual_seed(c.rows * 100 + c.cols);
    at::Tensor z = at::randn({c.batch, 4, c.rows, c.cols});
    vae->enable_slicing(c.slicing);
    at::Tensor want = vae->decode(z);
    at::Tensor got = patch_parallel_decode(*vae, z, *world_);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double rel = max_rel_error(got, want);
    if (world_rank() == 0)
      std::printf("[vae] %d ranks, z [%lld, 4, %lld, %lld]%s: max rel error %.2e\n", world_->size(),
                  static_cast<long long>(c.batch), static_cast<long long>(c.rows),
                  static_cast<long long>(c.cols), c.slicing ? " sliced" : "", rel);
    EXPECT_LE(rel, 1e-5);
  }
  vae->enable_slicing(false);
}

TEST_F(ParallelVae, BandEncodeEqualsSerialEncode) {
  auto vae = random_vae();  // scale 4: bands of 4-pixel-row multiples
  struct Case {
    int64_t batch, height, width;
    bool slicing;
  };
  // 9 latent rows (5+4, 3+2+2+2), a batch of 5 rows with and without slicing, 3 rows (fewer than
  // 4 ranks: whole picture everywhere), and 30 pixel rows (not a multiple of 4: whole picture).
  for (const Case& c : {Case{1, 36, 28, false}, Case{2, 20, 24, true}, Case{2, 20, 24, false},
                        Case{1, 12, 16, false}, Case{1, 30, 20, false}}) {
    at::manual_seed(c.height * 100 + c.width);
    at::Tensor x = at::rand({c.batch, 3, c.height, c.width}) * 2 - 1;
    vae->enable_slicing(c.slicing);
    const auto want = vae->encode(x);
    const auto got = patch_parallel_encode(*vae, x, *world_);
    ASSERT_EQ(got.mean.sizes(), want.mean.sizes());
    const double rel =
        std::max(max_rel_error(got.mean, want.mean), max_rel_error(got.std, want.std));
    if (world_rank() == 0)
      std::printf("[vae] %d ranks, encode x [%lld, 3, %lld, %lld]%s: max rel error %.2e\n",
                  world_->size(), static_cast<long long>(c.batch), static_cast<long long>(c.height),
                  static_cast<long long>(c.width), c.slicing ? " sliced" : "", rel);
    EXPECT_LE(rel, 1e-5);
  }
  vae->enable_slicing(false);
}

TEST_F(ParallelVae, OverTheReplicaGroupOfADataParallelLayout) {
  if (world_->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto groups =
      std::make_shared<ProcessGroups>(WorldConfig::from_degrees(4, 2, 1, 1, 2, 1, 1), world_);
  EXPECT_EQ(groups->replica().size(), 2);
  EXPECT_EQ(groups->replica().name(), groups->coords().dp == 0 ? "replica[0,1]" : "replica[2,3]");
  auto vae = random_vae();
  // Each replica decodes its own latent (dp rank d draws seed d).
  at::manual_seed(40 + groups->coords().dp);
  at::Tensor z = at::randn({1, 4, 7, 5});
  const double rel =
      max_rel_error(patch_parallel_decode(*vae, z, groups->replica()), vae->decode(z));
  EXPECT_LE(rel, 1e-5);
  at::Tensor x = at::rand({1, 3, 28, 20}) * 2 - 1;
  EXPECT_LE(
      max_rel_error(patch_parallel_encode(*vae, x, groups->replica()).mean, vae->encode(x).mean),
      1e-5);
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
