// Every parallel strategy of the FLUX pipeline against the one-rank result, under mpiexec:
// final latents (fp32) within 1e-5 of the serial ones relative to their max, images within 1/255.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/flux/flux_pipeline.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::GenerationOutput;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;

struct Layout {
  int ulysses, ring, cfg;
};

class ParallelFlux : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
    // Every rank builds (or finds) the same tiny pipeline; the cache is lock-protected.
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
    dir_ = new std::filesystem::path(xfuser::models::flux::ensure_tiny_flux(0));
  }
  static void TearDownTestSuite() {
    delete dir_;
    world_.reset();
  }
  static std::unique_ptr<xfuser::models::XFuserModel> load(std::shared_ptr<ProcessGroups> groups) {
    const auto& spec = ModelRegistry::find("tiny-flux");
    auto model = spec.create(spec);
    model->set_process_groups(std::move(groups));
    model->load(*dir_, {});
    return model;
  }
  static GenerationRequest request(int height, int width, int text_len, bool cfg) {
    GenerationRequest r;
    r.prompts = {"a cat on a sofa", "an owl at night"};
    r.height = height;
    r.width = width;
    r.num_inference_steps = 2;
    r.guidance_scale = 3.5;
    r.max_sequence_length = text_len;
    r.seeds = {11, 12};
    if (cfg) {
      r.negative_prompts = {"blurry", "dark"};
      r.true_cfg_scale = 3.0;
    }
    return r;
  }
  static void expect_same(const GenerationOutput& par, const GenerationOutput& ref,
                          const std::string& what) {
    const double rel = xfuser::testing::max_rel_error(par.latents, ref.latents);
    EXPECT_LE(rel, 1e-5) << what;
    const int pixel = (par.images.to(at::kInt) - ref.images.to(at::kInt)).abs().max().item<int>();
    EXPECT_LE(pixel, 1) << what;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::printf("%-40s latents rel %.2e, max pixel diff %d\n", what.c_str(), rel, pixel);
  }
  static std::shared_ptr<MpiCommunicator> world_;
  static std::filesystem::path* dir_;
};
std::shared_ptr<MpiCommunicator> ParallelFlux::world_;
std::filesystem::path* ParallelFlux::dir_ = nullptr;

TEST_F(ParallelFlux, EveryLayoutEqualsOneRank) {
  const int world = world_->size();
  std::vector<Layout> layouts;
  for (int u = 1; u <= world; ++u)
    for (int r = 1; r <= world; ++r)
      for (int c = 1; c <= 2; ++c)
        if (u * r * c == world) layouts.push_back({u, r, c});
  ASSERT_FALSE(layouts.empty());
  auto serial = load(nullptr);
  // 64x48 -> 4x3 = 12 image tokens; 48x32 -> 3x2 = 6 (uneven over 4 ranks). Text 8 splits over
  // 2 and 4 ranks; text 7 is replicated.
  struct Case {
    int h, w, text;
  };
  for (const Case& k : {Case{64, 48, 8}, Case{48, 32, 7}}) {
    for (const Layout& l : layouts) {
      auto config = WorldConfig::from_degrees(world, 1, l.cfg, 1, l.ulysses, l.ring, 1);
      auto groups = std::make_shared<ProcessGroups>(config, world_);
      auto model = load(groups);
      const bool cfg = l.cfg == 2;
      const auto req = request(k.h, k.w, k.text, cfg);
      const std::string what = "u" + std::to_string(l.ulysses) + " r" + std::to_string(l.ring) +
                               " cfg" + std::to_string(l.cfg) + " " + std::to_string(k.h) + "x" +
                               std::to_string(k.w) + " text " + std::to_string(k.text);
      expect_same(model->generate(req), serial->generate(req), what);
      // Without CFG parallel the same layout also runs true CFG serially per rank.
      if (!cfg)
        expect_same(model->generate(request(k.h, k.w, k.text, true)),
                    serial->generate(request(k.h, k.w, k.text, true)), what + " +cfg");
    }
  }
}

TEST_F(ParallelFlux, CfgParallelWithoutNegativePromptIsAClearError) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto groups =
      std::make_shared<ProcessGroups>(WorldConfig::from_degrees(2, 1, 2, 1, 1, 1, 1), world_);
  auto model = load(groups);
  try {
    model->generate(request(64, 48, 8, false));
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--use_cfg_parallel needs true CFG"), std::string::npos);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  xfuser::set_process_rank(rank);
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
