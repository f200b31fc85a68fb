// The memory plan (`xfuser-run --dry_run`, and the estimate xfuser-run checks before loading) from
// a pipeline folder's config files alone: for every committed tiny pipeline (all eight contract
// models) the plan of the folder without its weights equals the plan of the folder with them
// (the modules the configs build declare every parameter a load reads), stage by stage, under
// plain, FSDP and fp8 layouts; and the planned weights are the bytes the loaded model holds. The
// activations against measured peaks: bench/run_plan_check. Then the CLI: the plan printed for a
// config-only folder, and the exit code against --device_memory_gib.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "models/common/component.h"
#include "models/registry.h"
#include "models/weights/checkpoint.h"
#include "models/xfuser_model.h"
#include "tests/test_util.h"
#include "tests/tiny_pipelines.h"

namespace {

namespace fs = std::filesystem;

// `from` without its weight files (every *.safetensors and shard index), into `to`.
void copy_configs(const fs::path& from, const fs::path& to) {
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if (name.find(".safetensors") != std::string::npos) continue;
    const fs::path dest = to / fs::relative(e.path(), from);
    fs::create_directories(dest.parent_path());
    fs::copy_file(e.path(), dest);
  }
}

class MemoryPlan : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { xfuser::models::register_builtin_components(); }
};

TEST_P(MemoryPlan, ConfigsAloneGiveThePlanOfTheWeights) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / GetParam();
  const fs::path refs = xfuser::testing::fixtures_dir() / "pipelines" / (GetParam() + ".ref");
  XF_REQUIRE_FIXTURE(folder);
  XF_REQUIRE_FIXTURE(refs);
  const auto& spec = xfuser::models::ModelRegistry::for_pipeline_folder(folder);
  ASSERT_TRUE(spec.check_run) << spec.id;
  xfuser::testing::TempDir tmp;
  const fs::path configs = tmp / "configs";
  copy_configs(folder, configs);
  // The layout of the first reference case.
  fs::path case_dir;
  for (const auto& e : fs::directory_iterator(refs)) {
    if (e.is_directory() && (case_dir.empty() || e.path() < case_dir)) case_dir = e.path();
  }
  const auto request = xfuser::testing::reference_case_request(case_dir);
  xfuser::models::RunLayout layout;
  layout.height = request.height;
  layout.width = request.width;
  layout.num_frames = request.num_frames;
  layout.max_sequence_length = request.max_sequence_length;
  layout.input_images = static_cast<int>(request.input_images.size());
  layout.guidance_scale = request.guidance_scale;
  layout.batch_size = static_cast<int>(request.prompts.size());
  for (int variant = 0; variant < 3; ++variant) {
    auto l = layout;
    if (variant == 1) {  // FSDP over Ulysses 2
      l.ulysses = 2;
      l.fsdp = 2;
    } else if (variant == 2) {  // bf16 weights, fp8 transformer
      l.bytes_per_element = 2;
      l.transformer_bytes_per_element = 1;
    }
    SCOPED_TRACE("variant " + std::to_string(variant));
    const auto with = spec.check_run(folder, l);
    const auto alone = spec.check_run(configs, l);
    EXPECT_EQ(alone.weights, with.weights);
    EXPECT_EQ(alone.text_encoders, with.text_encoders);
    EXPECT_EQ(alone.image_encode, with.image_encode);
    EXPECT_EQ(alone.transformer, with.transformer);
    EXPECT_EQ(alone.vae, with.vae);
    EXPECT_GT(with.text_encoders, 0u);
    EXPECT_GT(with.transformer, 0u);
    EXPECT_GT(with.vae, 0u);
  }
}

// The plan's weights are the bytes the loaded model holds: every parameter each component
// declares, in its load dtype (parameters a family keeps in fp32 included; a checkpoint's
// tensors the module does not read excluded), in fp32 and bf16.
TEST_P(MemoryPlan, WeightsAreWhatTheLoadedModelHolds) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / GetParam();
  XF_REQUIRE_FIXTURE(folder);
  const auto& spec = xfuser::models::ModelRegistry::for_pipeline_folder(folder);
  for (const auto dtype : {c10::kFloat, c10::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    xfuser::models::RunLayout l;
    l.height = l.width = 64;
    l.num_frames = spec.defaults.num_frames > 0 ? 5 : 0;
    l.max_sequence_length = 16;
    l.bytes_per_element = l.transformer_bytes_per_element =
        static_cast<int>(c10::elementSize(dtype));
    const auto plan = spec.check_run(folder, l);
    auto model = spec.create(spec);
    xfuser::models::ModelLoadOptions options;
    options.dtype = dtype;
    model->load(folder, options);
    EXPECT_NEAR(static_cast<double>(plan.weights), static_cast<double>(model->parameter_bytes()),
                0.05 * static_cast<double>(plan.weights));
  }
}

INSTANTIATE_TEST_SUITE_P(Pipelines, MemoryPlan,
                         ::testing::ValuesIn(xfuser::testing::committed_tiny_pipelines()),
                         [](const auto& info) { return xfuser::testing::gtest_name(info.param); });

TEST(MemoryPlanCli, DryRunPrintsThePlanOfAConfigOnlyFolder) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "flux-tiny";
  XF_REQUIRE_FIXTURE(folder);
  xfuser::testing::TempDir tmp;
  copy_configs(folder, tmp / "flux");
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const std::string common = bin + " --model_path " + (tmp / "flux").string() +
                             " --prompt x --height 64 --width 64 --dtype fp32 --dry_run";
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(common, &log), 0) << log;
  EXPECT_NE(log.find("plan: FLUX.1-dev from"), std::string::npos) << log;
  EXPECT_NE(log.find("per rank on cpu: weights"), std::string::npos) << log;
  EXPECT_NE(log.find("activations by stage: text encoders"), std::string::npos) << log;
  // Sharded over 4 ranks the weights per rank are smaller; the plan needs no mpirun.
  ASSERT_EQ(xfuser::testing::run_command(
                common + " --ulysses_degree 2 --use_cfg_parallel --negative_prompt y "
                         "--true_cfg_scale 2 --use_fsdp",
                &log),
            0)
      << log;
  EXPECT_NE(log.find("4 rank(s)"), std::string::npos) << log;
  EXPECT_NE(log.find("--use_fsdp over 4 ranks"), std::string::npos) << log;
  // Against a device memory: "fits" exits 0, "does not fit" exits 1.
  EXPECT_EQ(xfuser::testing::run_command(common + " --device_memory_gib 80", &log), 0) << log;
  EXPECT_NE(log.find("device memory 80 GiB: fits"), std::string::npos) << log;
  EXPECT_EQ(xfuser::testing::run_command(common + " --device_memory_gib 0.0001", &log), 1) << log;
  EXPECT_NE(log.find("does not fit"), std::string::npos) << log;
  // Without --dry_run the device memory is refused by name.
  EXPECT_NE(xfuser::testing::run_command(
                bin + " --model tiny-flux --prompt x --device_memory_gib 80", &log),
            0);
  EXPECT_NE(log.find("--device_memory_gib is read by --dry_run's plan"), std::string::npos) << log;
}

}  // namespace
