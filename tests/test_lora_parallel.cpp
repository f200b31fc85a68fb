// LoRA adapters under every parallel layout, against one rank with the same adapters (mpiexec,
// 2 ranks): tensor parallel (each rank's slices of the adapter, as of its weight), Ulysses, ring,
// CFG parallel, PipeFusion (a stage's blocks only; exact with every step synchronous) and FSDP
// (fused into each rank's rows, or run beside the gathered weight), adapters fused and unfused.
// The layouts run one after another on the same request, whose initial latents stay untouched.
// Final latents (fp32) within 1e-5 of the one-rank ones relative to their max.
#include <cstdio>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/lora_case.h"
#include "tests/mpi_test_main.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace models = xfuser::models;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;

struct Layout {
  const char* name;
  int cfg, pp, ulysses, ring, tp;
  bool fsdp;
};

const auto& adapters = xfuser::testing::lora_case_adapters;

std::unique_ptr<models::XFuserModel> load(const fs::path& folder,
                                          std::vector<models::LoraSpec> lora, bool fused,
                                          std::shared_ptr<ProcessGroups> groups, bool fsdp) {
  const auto& spec = models::ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  if (groups && fsdp) groups->create_fsdp_group();
  model->set_process_groups(std::move(groups));
  models::ModelLoadOptions options;
  options.lora = std::move(lora);
  options.lora_fused = fused;
  options.fsdp = fsdp;
  model->load(folder, options);
  return model;
}

// (pipeline, case of lora-v0.42.1/<pipeline>/).
class LoraParallel : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(LoraParallel, EveryLayoutEqualsOneRank) {
  const auto& world = xfuser::testing::g_world;
  ASSERT_EQ(world->size(), 2);
  const auto& [name, case_name] = GetParam();
  const fs::path root = xfuser::testing::lora_root(name);
  const fs::path dir = root / case_name;
  XF_REQUIRE_FIXTURE(dir);
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const auto c = xfuser::testing::read_json(dir / "case.json");
  models::GenerationRequest r = xfuser::testing::reference_case_request(dir);
  if (name.rfind("wan", 0) == 0) r.flow_sigmas = "from_one";
  r.pipefusion_warmup_steps = r.num_inference_steps;  // PipeFusion exact
  // True CFG, so that CFG parallelism has two branches to split.
  models::GenerationRequest cfg = r;
  if (cfg.negative_prompts.empty()) cfg.negative_prompts = {"blurry, low quality"};
  if (name.rfind("flux", 0) == 0) cfg.true_cfg_scale = 2.0;
  if (name.rfind("wan", 0) == 0 && cfg.guidance_scale <= 1.0) cfg.guidance_scale = 5.0;
  const std::vector<Layout> layouts = {
      {"pipefusion 2", 1, 2, 1, 1, 1, false},
      {"fsdp 2 (ulysses 2)", 1, 1, 2, 1, 1, true},
      {"tensor parallel 2", 1, 1, 1, 1, 2, false},
      {"ulysses 2", 1, 1, 2, 1, 1, false},
      {"ring 2", 1, 1, 1, 2, 1, false},
      {"cfg parallel 2", 2, 1, 1, 1, 1, false},
  };
  for (const bool fused : {true, false}) {
    auto serial = load(folder, adapters(root, c), fused, nullptr, false);
    const auto want = serial->generate(r);
    const auto want_cfg = serial->generate(cfg);
    const at::Tensor initial = r.latents.clone();
    for (const Layout& l : layouts) {
      // Wan 2.2's two experts refuse PipeFusion (each would need its own stale K/V).
      if (l.pp > 1 && name.rfind("wan22", 0) == 0) continue;
      const std::string what =
          name + "/" + case_name + " " + (fused ? "fused" : "unfused") + " " + l.name;
      SCOPED_TRACE(what);
      auto config = WorldConfig::from_degrees(2, 1, l.cfg, l.pp, l.ulysses, l.ring, l.tp);
      auto groups = std::make_shared<ProcessGroups>(config, world);
      auto model = load(folder, adapters(root, c), fused, groups, l.fsdp);
      const bool use_cfg = l.cfg == 2;
      const auto got = model->generate(use_cfg ? cfg : r);
      const double rel =
          xfuser::testing::max_rel_error(got.latents, use_cfg ? want_cfg.latents : want.latents);
      EXPECT_LE(rel, 1e-5);
      // The request's initial latents are the caller's: no layout writes into them.
      EXPECT_TRUE(at::equal(r.latents, initial));
      EXPECT_TRUE(at::equal(cfg.latents, initial));
      if (world->rank() == 0) std::printf("%-60s latents rel %.2e\n", what.c_str(), rel);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pipelines, LoraParallel,
    ::testing::Values(std::make_pair(std::string("flux-tiny"), std::string("ab")),
                      std::make_pair(std::string("flux-tiny"), std::string("kohya")),
                      std::make_pair(std::string("wan22-t2v-tiny"), std::string("experts")),
                      std::make_pair(std::string("wan-t2v-tiny"), std::string("wan_original"))),
    [](const auto& info) {
      std::string n = info.param.first + "_" + info.param.second;
      for (char& ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });

}  // namespace
