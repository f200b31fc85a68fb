// Patch-parallel decode of the HunyuanVideo-1.5 VAE (AutoencoderKLHunyuanVideo15) under mpiexec
// (NP 2 and 4), fp32: the causal 3D decoder split into bands of latent rows over the ranks (halo
// rows with replicate padding only at the picture's top and bottom, per-voxel RMS norms and
// channel-to-space upsamplers local, the mid-block attention's keys/values gathered per frame
// under the causal frame mask) equals the one-rank decode and diffusers' fixture
// (hunyuan_video15-vae-tiny-s1), on random latents with uneven bands, single-row bands, batch 2
// with and without slicing, and fewer rows than ranks; every rank holds the whole video.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/hunyuan_video15/hunyuan_video15_vae_parallel.h"
#include "models/vae/patch_parallel.h"
#include "models/weights/component_folder.h"
#include "parallel/mpi_communicator.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::hunyuan_video15::AutoencoderKLHunyuanVideo15;
using xfuser::models::hunyuan_video15::HunyuanVideo15VAEConfig;
using xfuser::models::hunyuan_video15::HunyuanVideoBand;
using xfuser::models::hunyuan_video15::patch_parallel_decode;
using xfuser::parallel::MpiCommunicator;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_tensors;

bool under_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int world_rank() {
  int rank = 0;
  if (under_mpi()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

fs::path case_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / "hunyuan_video15-vae-tiny-s1";
}

std::shared_ptr<AutoencoderKLHunyuanVideo15> load_fixture() {
  xfuser::models::register_builtin_components();
  xfuser::models::hunyuan_video15::register_hunyuan_video15_vae_components();
  auto component = xfuser::models::load_component(case_dir().string(), at::kFloat);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo15>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLHunyuanVideo15";
  return vae;
}

// The same random weights on every rank (seeded): 3 blocks at 4x (both upsamplers also in time).
std::shared_ptr<AutoencoderKLHunyuanVideo15> random_vae(uint64_t seed = 7) {
  const nlohmann::json config = {{"latent_channels", 4},
                                 {"block_out_channels", {8, 16, 16}},
                                 {"layers_per_block", 1},
                                 {"spatial_compression_ratio", 4},
                                 {"temporal_compression_ratio", 4}};
  auto vae = std::make_shared<AutoencoderKLHunyuanVideo15>(
      HunyuanVideo15VAEConfig::from_json(config, "test"));
  vae->init_random(seed, 0.2);
  return vae;
}

class ParallelHunyuanVideo15Vae : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (under_mpi()) world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  void SetUp() override {
    if (world_ == nullptr || world_->size() < 2) GTEST_SKIP() << "needs mpiexec with >= 2 ranks";
  }

  // Decodes z both ways, checks equality (and that every rank holds the same video), prints the
  // error and the halo bytes; returns the parallel result.
  at::Tensor check(const AutoencoderKLHunyuanVideo15& vae, const at::Tensor& z,
                   const std::string& what) {
    const at::Tensor want = vae.decode(z);
    world_->reset_stats();
    const at::Tensor got = patch_parallel_decode(vae, z, *world_);
    const auto& stats = world_->stats();
    const int64_t halo_bytes = stats.count("send") ? stats.at("send").bytes : 0;
    EXPECT_EQ(got.sizes(), want.sizes()) << what;
    if (got.sizes() != want.sizes()) return got;
    const double rel = max_rel_error(got, want);
    std::printf(
        "[hunyuan_video15_vae_parallel] rank %d/%d %s z %s%s: max rel error %.2e vs one rank; "
        "halo bytes sent %lld\n",
        world_->rank(), world_->size(), what.c_str(), xfuser::shape_string(z.sizes()).c_str(),
        vae.slicing() ? " sliced" : "", rel, static_cast<long long>(halo_bytes));
    EXPECT_LE(rel, 1e-5) << what << " z " << xfuser::shape_string(z.sizes());
    if (z.size(3) < world_->size()) {
      EXPECT_EQ(halo_bytes, 0) << "fewer rows than ranks: every rank decodes the whole latent";
    } else {
      EXPECT_GT(halo_bytes, 0) << "every band has a neighbour";
    }
    at::Tensor root = got.clone();
    world_->broadcast(root, 0);
    EXPECT_TRUE(at::equal(root, got)) << "rank " << world_->rank() << " holds a different video";
    return got;
  }

  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> ParallelHunyuanVideo15Vae::world_;

TEST_F(ParallelHunyuanVideo15Vae, FixtureEqualsOneRankAndDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  auto inputs = read_tensors(case_dir() / "inputs.safetensors");
  auto ref = read_tensors(case_dir() / "output.safetensors");
  // tiled_z has 5 latent rows: uneven bands at NP 2 and 4 (and the fixture's 3-row z at NP 2).
  const std::map<std::string, std::string> refs = {{"z", "decode_sample"},
                                                   {"z3", "decode_z3_sample"}};
  for (const char* name : {"z", "z3", "tiled_z"}) {
    const at::Tensor got = check(*vae, inputs.at(name), name);
    const std::string want = refs.count(name) ? refs.at(name) : "";
    if (!want.empty()) {
      const double rel = max_rel_error(got, ref.at(want));
      std::printf("[hunyuan_video15_vae_parallel] rank %d fixture %s vs diffusers: %.2e\n",
                  world_->rank(), name, rel);
      EXPECT_LE(rel, 1e-4);
    }
  }
}

TEST_F(ParallelHunyuanVideo15Vae, RandomLatentsUnevenAndSingleRowBands) {
  auto vae = random_vae();
  const int64_t p = world_->size();
  at::manual_seed(11);
  check(*vae, at::randn({1, 4, 3, 2 * p + 1, 5}), "uneven bands");
  check(*vae, at::randn({1, 4, 2, p, 3}), "single-row bands");
  check(*vae, at::randn({1, 4, 2, p - 1, 3}), "fewer rows than ranks");
  const at::Tensor z2 = at::randn({2, 4, 2, p + 1, 4});
  const at::Tensor whole = check(*vae, z2, "batch 2");
  vae->enable_slicing();
  // One item at a time against the batch of 2: libtorch 2.x's convolutions sum in a
  // batch-size-dependent order (1.1e-6 on 2.15).
  EXPECT_LE(max_rel_error(check(*vae, z2, "batch 2"), whole), 1e-5);
}

// The band edges: without the neighbours' halo rows (each band replicating its own edge rows) the
// result is wrong, so the test can tell a broken halo exchange.
TEST_F(ParallelHunyuanVideo15Vae, TheHaloMatters) {
  auto vae = random_vae();
  const int64_t p = world_->size();
  at::manual_seed(13);
  const at::Tensor z = at::randn({1, 4, 2, 2 * p, 3});
  const auto rows = xfuser::models::vae::band_rows(z.size(3), static_cast<int>(p));
  int64_t start = 0;
  for (int r = 0; r < world_->rank(); ++r) start += rows[r];
  const at::Tensor want = vae->decode(z).narrow(3, start * vae->spatial_scale(),
                                                rows[world_->rank()] * vae->spatial_scale());
  xfuser::models::vae::CommSpatialContext ctx(*world_, rows);
  HunyuanVideoBand band;
  band.ctx = &ctx;
  band.top = band.bottom = true;  // every band replicates its own edges: no halo used
  const at::Tensor band_z = z.narrow(3, start, rows[world_->rank()]);
  EXPECT_GT(max_rel_error(vae->decode(band_z, &band), want), 1e-3);
  band.top = world_->rank() == 0;
  band.bottom = world_->rank() + 1 == world_->size();
  EXPECT_LE(max_rel_error(vae->decode(band_z, &band), want), 1e-5);
}

TEST_F(ParallelHunyuanVideo15Vae, BadInputsAreClearErrorsOnEveryRank) {
  auto vae = random_vae();
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 4, 4, 4}), *world_);
      },
      {"patch-parallel HunyuanVideo-1.5 VAE decode expects z [B, latent_channels, f, h, w]",
       "[1, 4, 4, 4]"});
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 5, 2, 6, 4}), *world_);
      },
      {"latent z", "latent_channels"});
  vae->enable_tiling(true);
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 4, 2, 6, 4}), *world_);
      },
      {"--use_parallel_vae", "--enable_tiling"});
  vae->enable_tiling(false);
  // The communicator still works afterwards.
  at::manual_seed(5);
  const at::Tensor z = at::randn({1, 4, 1, 4, 3});
  EXPECT_LE(max_rel_error(patch_parallel_decode(*vae, z, *world_), vae->decode(z)), 1e-5);
}

}  // namespace

int main(int argc, char** argv) {
  if (under_mpi()) MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  xfuser::set_process_rank(world_rank());
  const int result = RUN_ALL_TESTS();
  if (under_mpi()) MPI_Finalize();
  return result;
}
