// CPU offload under Ulysses 2 for every committed tiny pipeline (all eight contract models): each
// rank offloads what it holds, so the two-rank run with offload equals the one-rank run without
// it (final latents within 1e-6 relative to their max, pixels within 1 level), from diffusers'
// initial latents of each reference case. Sequential offload, which also offloads the text
// encoders and the VAE as model offload does; model offload under Ulysses, CFG, PipeFusion and
// tensor parallelism is test_parallel_dit's.
#include <memory>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "models/common/component.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"
#include "tests/tiny_pipelines.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::OffloadMode;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;

class OffloadUlysses : public ::testing::TestWithParam<std::tuple<std::string, OffloadMode>> {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(120));
    xfuser::models::register_builtin_components();
  }
  static void TearDownTestSuite() { world_.reset(); }
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> OffloadUlysses::world_;

TEST_P(OffloadUlysses, EqualsOneRankWithoutOffload) {
  const auto& [name, mode] = GetParam();
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const fs::path refs = xfuser::testing::fixtures_dir() / "pipelines" / (name + ".ref");
  XF_REQUIRE_FIXTURE(folder);
  XF_REQUIRE_FIXTURE(refs);
  const auto& spec = xfuser::models::ModelRegistry::for_pipeline_folder(folder);
  auto serial = spec.create(spec);
  serial->load(folder, {});
  const int world = world_->size();
  auto groups = std::make_shared<ProcessGroups>(
      WorldConfig::from_degrees(world, 1, 1, 1, world, 1, 1), world_);
  auto model = spec.create(spec);
  model->set_process_groups(groups);
  xfuser::models::ModelLoadOptions options;
  options.offload = mode;
  model->load(folder, options);
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(refs)) {
    if (!entry.is_directory()) continue;
    SCOPED_TRACE(entry.path().string());
    const auto request = xfuser::testing::reference_case_request(entry.path());
    const auto ref = serial->generate(request);
    const auto out = model->generate(request);
    const double rel = xfuser::testing::max_rel_error(out.latents, ref.latents);
    EXPECT_LE(rel, 1e-6);
    const int pixel = (out.images.to(at::kInt) - ref.images.to(at::kInt)).abs().max().item<int>();
    EXPECT_LE(pixel, 1);
    const auto s = model->offloader()->stats();
    EXPECT_LE(s.peak_resident_bytes, s.bound_bytes);
    EXPECT_EQ(s.resident_bytes, 0);
    if (world_->rank() == 0) {
      std::printf("%s/%s ulysses %d, %s offload: latents rel %.2e, max pixel diff %d\n",
                  name.c_str(), entry.path().filename().string().c_str(), world,
                  xfuser::models::offload_mode_name(mode), rel, pixel);
    }
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Pipelines, OffloadUlysses,
    ::testing::Combine(::testing::ValuesIn(xfuser::testing::committed_tiny_pipelines()),
                       ::testing::Values(OffloadMode::kSequential)),
    [](const auto& info) {
      return xfuser::testing::gtest_name(
          std::get<0>(info.param) + "_" +
          xfuser::models::offload_mode_name(std::get<1>(info.param)));
    });

}  // namespace
