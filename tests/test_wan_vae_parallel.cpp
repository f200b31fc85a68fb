// Patch-parallel decode of the Wan video VAE (AutoencoderKLWan) under mpiexec (NP 2 and 4), fp32:
// the 3D causal decoder split into bands of latent rows over the ranks (halo rows on the cached
// frames and the chunk together, gathered mid-block attention keys/values per frame) equals the
// one-rank decode on both diffusers fixtures (wan_vae-tiny-s1, wan_vae-tiny_tests-s1), odd row
// counts, batches with slicing and fewer rows than ranks; every rank holds the whole video; the
// halo bytes are reported. Run as one process (NP 1), it checks end to end that xfuser-run on
// tiny-wan under mpirun -np 2 --ulysses_degree 2 writes the same frames with --use_parallel_vae
// as without.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/vae/patch_parallel.h"
#include "models/wan/wan_vae.h"
#include "models/wan/wan_vae_parallel.h"
#include "models/weights/component_folder.h"
#include "parallel/mpi_communicator.h"
#include "runner/outputs.h"
#include "runner/video.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::wan::AutoencoderKLWan;
using xfuser::models::wan::patch_parallel_decode;
using xfuser::parallel::MpiCommunicator;
using xfuser::testing::max_rel_error;
using xfuser::testing::mpirun_prefix;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

// Started by mpiexec (the NP 2 / NP 4 registrations) rather than as a plain process.
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

std::shared_ptr<AutoencoderKLWan> load_fixture(const std::string& name) {
  xfuser::models::register_builtin_components();
  auto component = xfuser::models::load_component(case_dir(name).string(), at::kFloat);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLWan>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLWan";
  return vae;
}

class ParallelWanVae : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (under_mpi()) world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  void SetUp() override {
    if (world_ == nullptr || world_->size() < 2) GTEST_SKIP() << "needs mpiexec with >= 2 ranks";
  }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> ParallelWanVae::world_;

TEST_F(ParallelWanVae, BandDecodeEqualsSerialDecodeOnBothFixtures) {
  struct Case {
    std::string fixture;
    int64_t batch, frames, rows, cols;
    bool slicing;
  };
  // The fixture's own latent ([1, 4, 3, 4, 4]: 1 row per band on 4 ranks), odd and uneven row
  // counts (5 = 3+2 or 2+1+1+1; 7 = 4+3 or 2+2+2+1), batch 2 with and without slicing, and fewer
  // rows than ranks (every rank decodes the whole latent: no halo exchanged).
  const std::vector<Case> cases = {
      {"wan_vae-tiny-s1", 0, 0, 0, 0, false},       {"wan_vae-tiny-s1", 1, 2, 5, 3, false},
      {"wan_vae-tiny-s1", 1, 2, 1, 4, false},       {"wan_vae-tiny_tests-s1", 2, 2, 7, 2, true},
      {"wan_vae-tiny_tests-s1", 2, 1, 5, 3, false}, {"wan_vae-tiny_tests-s1", 1, 3, 3, 2, false}};
  for (const char* fixture : {"wan_vae-tiny-s1", "wan_vae-tiny_tests-s1"}) {
    XF_REQUIRE_FIXTURE(case_dir(fixture));
  }
  for (const Case& c : cases) {
    auto vae = load_fixture(c.fixture);
    ASSERT_NE(vae, nullptr);
    vae->enable_slicing(c.slicing);
    at::Tensor z;
    if (c.batch == 0) {
      z = xfuser::testing::read_tensors(case_dir(c.fixture) / "inputs.safetensors").at("z");
    } else {
      at::manual_seed(c.rows * 100 + c.cols * 10 + c.frames);  // the same z on every rank
      z = at::randn({c.batch, vae->config().z_dim, c.frames, c.rows, c.cols});
    }
    const at::Tensor want = vae->decode(z);
    world_->reset_stats();
    const at::Tensor got = patch_parallel_decode(*vae, z, *world_);
    const auto& stats = world_->stats();
    const int64_t halo_bytes = stats.count("send") ? stats.at("send").bytes : 0;
    const int64_t halo_calls = stats.count("send") ? stats.at("send").calls : 0;
    ASSERT_EQ(got.sizes(), want.sizes()) << c.fixture;
    const double rel = max_rel_error(got, want);
    std::printf(
        "[wan_vae_parallel] rank %d/%d %s z %s%s: max rel error %.2e; halo sends %lld, "
        "%lld bytes\n",
        world_->rank(), world_->size(), c.fixture.c_str(), xfuser::shape_string(z.sizes()).c_str(),
        c.slicing ? " sliced" : "", rel, static_cast<long long>(halo_calls),
        static_cast<long long>(halo_bytes));
    EXPECT_LE(rel, 1e-5) << c.fixture << " z " << xfuser::shape_string(z.sizes());
    if (z.size(3) < world_->size()) {
      EXPECT_EQ(halo_bytes, 0) << "fewer rows than ranks: every rank decodes the whole latent";
    } else {
      EXPECT_GT(halo_bytes, 0) << "every band has a neighbour";
    }
    // Every rank holds the whole video: rank 0's copy equals everyone's.
    at::Tensor root = got.clone();
    world_->broadcast(root, 0);
    EXPECT_TRUE(at::equal(root, got)) << "rank " << world_->rank() << " holds a different video";
  }
}

TEST_F(ParallelWanVae, EveryLayerUsesTheContextNotJustTheEnds) {
  // A band decode whose context supplies zero halos and no gathered keys (the base
  // SpatialContext) must differ from the serial decode's band: proves the halo exchange matters.
  auto vae = load_fixture("wan_vae-tiny-s1");
  ASSERT_NE(vae, nullptr);
  at::manual_seed(3);
  const at::Tensor z = at::randn({1, vae->config().z_dim, 2, 6, 3});
  const at::Tensor want = vae->decode(z);
  xfuser::models::vae::SpatialContext isolated;
  const at::Tensor top = vae->decode(z.narrow(3, 0, 3), &isolated);  // [1, 3, F, 24, 24]
  const double rel = max_rel_error(top, want.narrow(3, 0, top.size(3)));
  std::printf("[wan_vae_parallel] band decoded without neighbours: max rel error %.2e\n", rel);
  EXPECT_GT(rel, 1e-3);
  // The base context on the whole latent is the serial decode (up to the convolutions'
  // summation order, which libtorch 2.x varies with the call: 2.2e-6 on 2.15, 0 on 1.13).
  EXPECT_LE(max_rel_error(vae->decode(z, &isolated), want), 1e-5);
}

TEST_F(ParallelWanVae, BadLatentsAreClearErrorsOnEveryRank) {
  // Thrown before any exchange, on every rank alike (no rank left waiting for a halo).
  auto vae = load_fixture("wan_vae-tiny-s1");
  ASSERT_NE(vae, nullptr);
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 4, 4, 4}), *world_);
      },
      {"patch-parallel Wan VAE decode expects z [B, z_dim, f, h, w]", "[1, 4, 4, 4]"});
  xfuser::testing::expect_error_containing(
      [&] {
        patch_parallel_decode(*vae, at::zeros({1, 5, 2, 6, 4}), *world_);
      },
      {"latent band z", "z_dim"});
  // The communicator still works afterwards.
  at::manual_seed(5);
  const at::Tensor z = at::randn({1, 4, 1, 4, 3});
  EXPECT_LE(max_rel_error(patch_parallel_decode(*vae, z, *world_), vae->decode(z)), 1e-5);
}

TEST(ParallelWanVaePipeline, TinyWanUlyssesWithParallelVaeWritesTheSameFrames) {
  if (under_mpi()) GTEST_SKIP() << "runs mpirun itself: run as one process";
  setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const std::string base = mpirun_prefix(2) + bin +
                           " --model tiny-wan --prompt 'a cat' --num_inference_steps 2 --dtype "
                           "fp32 --ulysses_degree 2 --save_latents --output_type frames";
  TempDir serial, parallel;
  std::string log;
  ASSERT_EQ(run_command(base + " --output_directory " + serial.path().string(), &log), 0) << log;
  ASSERT_EQ(run_command(base + " --use_parallel_vae --output_directory " + parallel.path().string(),
                        &log),
            0)
      << log;
  int compared = 0, worst = 0;
  for (const auto& entry : fs::directory_iterator(serial.path())) {
    const fs::path name = entry.path().filename();
    const std::string ext = name.extension().string();
    if (ext != ".png" && ext != ".mp4") continue;
    ASSERT_TRUE(fs::exists(parallel / name.string())) << name << " missing with --use_parallel_vae";
    const at::Tensor a = ext == ".png" ? xfuser::runner::read_png(entry.path())
                                       : xfuser::runner::read_video_frames(entry.path());
    const at::Tensor b = ext == ".png"
                             ? xfuser::runner::read_png(parallel / name.string())
                             : xfuser::runner::read_video_frames(parallel / name.string());
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const int diff = (a.to(at::kInt) - b.to(at::kInt)).abs().max().item<int>();
    worst = std::max(worst, diff);
    EXPECT_LE(diff, 1) << name;
    ++compared;
  }
  std::printf("[wan_vae_parallel] xfuser-run tiny-wan: %d files, max |diff| %d levels\n", compared,
              worst);
  EXPECT_GE(compared, 2) << "the MP4 and its PNG frames";
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
