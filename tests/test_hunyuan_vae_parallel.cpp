// Patch-parallel decode of the HunyuanVideo VAE (AutoencoderKLHunyuanVideo) under mpiexec (NP 2 and
// 4), fp32: the causal 3D decoder split into bands of latent rows over the ranks (halo rows with
// replicate padding only at the picture's top and bottom, GroupNorm moments all-reduced over the
// whole clip, the mid-block attention's keys/values gathered per frame under the causal frame
// mask, diffusers' framewise temporal tiling kept) equals the one-rank decode and diffusers'
// fixtures (hunyuan_vae-tiny-s1, hunyuan_vae-tiles-s1's framewise decode), on random latents with
// uneven bands, single-row bands, batch 2 with and without slicing, and fewer rows than ranks;
// every rank holds the whole video; the halo bytes are reported.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/hunyuan_video/hunyuan_video_vae.h"
#include "models/hunyuan_video/hunyuan_video_vae_parallel.h"
#include "models/vae/patch_parallel.h"
#include "models/vae/vae_blocks.h"
#include "models/weights/component_folder.h"
#include "parallel/mpi_communicator.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::hunyuan_video::AutoencoderKLHunyuanVideo;
using xfuser::models::hunyuan_video::HunyuanVideoBand;
using xfuser::models::hunyuan_video::HunyuanVideoVAEConfig;
using xfuser::models::hunyuan_video::HunyuanVideoVAETiling;
using xfuser::models::hunyuan_video::patch_parallel_decode;
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

fs::path case_dir(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

std::shared_ptr<AutoencoderKLHunyuanVideo> load_fixture(const std::string& name) {
  xfuser::models::register_builtin_components();
  auto component = xfuser::models::load_component(case_dir(name).string(), at::kFloat);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLHunyuanVideo";
  return vae;
}

// The same random weights on every rank (seeded).
std::shared_ptr<AutoencoderKLHunyuanVideo> random_vae(uint64_t seed = 7) {
  const nlohmann::json config = {{"latent_channels", 4},
                                 {"block_out_channels", {4, 8, 8, 8}},
                                 {"layers_per_block", 1},
                                 {"norm_num_groups", 2}};
  auto vae =
      std::make_shared<AutoencoderKLHunyuanVideo>(HunyuanVideoVAEConfig::from_json(config, "test"));
  vae->init_random(seed, 0.2);
  return vae;
}

class ParallelHunyuanVae : public ::testing::Test {
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
  at::Tensor check(const AutoencoderKLHunyuanVideo& vae, const at::Tensor& z,
                   const std::string& what) {
    const at::Tensor want = vae.decode(z);
    world_->reset_stats();
    const at::Tensor got = patch_parallel_decode(vae, z, *world_);
    const auto& stats = world_->stats();
    const int64_t halo_bytes = stats.count("send") ? stats.at("send").bytes : 0;
    const int64_t halo_calls = stats.count("send") ? stats.at("send").calls : 0;
    EXPECT_EQ(got.sizes(), want.sizes()) << what;
    if (got.sizes() != want.sizes()) return got;
    const double rel = max_rel_error(got, want);
    std::printf(
        "[hunyuan_vae_parallel] rank %d/%d %s z %s%s: max rel error %.2e vs one rank; halo sends "
        "%lld, %lld bytes\n",
        world_->rank(), world_->size(), what.c_str(), xfuser::shape_string(z.sizes()).c_str(),
        vae.slicing() ? " sliced" : "", rel, static_cast<long long>(halo_calls),
        static_cast<long long>(halo_bytes));
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
std::shared_ptr<MpiCommunicator> ParallelHunyuanVae::world_;

TEST_F(ParallelHunyuanVae, FixturesEqualOneRankAndDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir("hunyuan_vae-tiny-s1"));
  XF_REQUIRE_FIXTURE(case_dir("hunyuan_vae-tiles-s1"));
  {
    auto vae = load_fixture("hunyuan_vae-tiny-s1");
    ASSERT_NE(vae, nullptr);
    const at::Tensor z =
        read_tensors(case_dir("hunyuan_vae-tiny-s1") / "inputs.safetensors").at("z");
    const at::Tensor ref =
        read_tensors(case_dir("hunyuan_vae-tiny-s1") / "output.safetensors").at("decode");
    const at::Tensor got = check(*vae, z, "hunyuan_vae-tiny-s1");
    const double rel = max_rel_error(got, ref);
    std::printf(
        "[hunyuan_vae_parallel] rank %d hunyuan_vae-tiny-s1: max rel error %.2e vs "
        "diffusers\n",
        world_->rank(), rel);
    EXPECT_LT(rel, 1e-4);
  }
  {
    // z_long: more latent frames than a temporal tile, so diffusers' framewise tiling (its
    // default) runs, each tile band-parallel.
    auto vae = load_fixture("hunyuan_vae-tiles-s1");
    ASSERT_NE(vae, nullptr);
    const at::Tensor z =
        read_tensors(case_dir("hunyuan_vae-tiles-s1") / "inputs.safetensors").at("z_long");
    const at::Tensor ref = read_tensors(case_dir("hunyuan_vae-tiles-s1") / "output.safetensors")
                               .at("decode_framewise");
    const at::Tensor got = check(*vae, z, "hunyuan_vae-tiles-s1 framewise");
    const double rel = max_rel_error(got, ref);
    std::printf(
        "[hunyuan_vae_parallel] rank %d hunyuan_vae-tiles-s1 framewise: max rel error "
        "%.2e vs diffusers\n",
        world_->rank(), rel);
    EXPECT_LT(rel, 1e-4);
  }
}

TEST_F(ParallelHunyuanVae, RandomLatentsUnevenAndSingleRowBands) {
  auto vae = random_vae();
  const int64_t p = world_->size();
  struct Case {
    int64_t batch, frames, rows, cols;
    bool slicing;
  };
  // p rows: one latent row per band; 5 and 7 rows: uneven bands (3+2, 4+3; 2+1+1+1, 2+2+2+1);
  // 6 frames: framewise temporal tiles (5 frames at a stride of 3, blended); fewer rows than ranks.
  const std::vector<Case> cases = {{2, 2, p, 3, false}, {2, 2, 5, 4, true},
                                   {1, 6, 7, 3, false}, {2, 6, p, 2, true},
                                   {1, 1, 5, 5, false}, {1, 2, p - 1, 3, false}};
  for (const Case& c : cases) {
    vae->enable_slicing(c.slicing);
    at::manual_seed(c.rows * 100 + c.cols * 10 + c.frames);  // the same z on every rank
    const at::Tensor z = at::randn({c.batch, 4, c.frames, c.rows, c.cols});
    check(*vae, z, "random");
  }
}

TEST_F(ParallelHunyuanVae, TheHaloAndTheEdgePaddingMatter) {
  // A band decoded with the base SpatialContext (zero halos, nothing gathered) differs from the
  // serial decode's rows: the exchange is exercised. Marking a middle band as the picture's top
  // (replicated instead of exchanged rows) also differs.
  auto vae = random_vae();
  at::manual_seed(3);
  const at::Tensor z = at::randn({1, 4, 2, 6, 3});
  const at::Tensor want = vae->decode(z);
  xfuser::models::vae::SpatialContext isolated;
  HunyuanVideoBand band;
  band.ctx = &isolated;
  band.top = true;
  band.bottom = false;
  const at::Tensor top = vae->decode(z.narrow(3, 0, 3), &band);
  const double rel = max_rel_error(top, want.narrow(3, 0, top.size(3)));
  std::printf("[hunyuan_vae_parallel] band decoded without neighbours: max rel error %.2e\n", rel);
  EXPECT_GT(rel, 1e-3);
  // The base context on the whole latent (both edges) is the serial decode.
  band.bottom = true;
  EXPECT_LE(max_rel_error(vae->decode(z, &band), want), 1e-6);
  // Zero padding at the edges instead of replicate is wrong.
  band.top = band.bottom = false;
  EXPECT_GT(max_rel_error(vae->decode(z, &band), want), 1e-3);
}

TEST_F(ParallelHunyuanVae, BadInputsAreClearErrorsOnEveryRank) {
  auto vae = random_vae();
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 4, 4, 4}), *world_);
      },
      {"patch-parallel HunyuanVideo VAE decode expects z [B, latent_channels, f, h, w]",
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
