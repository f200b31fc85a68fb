// Whole pipelines against diffusers, image for image: the tiny pipeline folders that
// tests/fixtures/generate.py saved with diffusers (StableDiffusion3Pipeline with and without T5,
// FluxPipeline, WanPipeline) run from the folder alone (the model comes from model_index.json),
// from the same initial latents as diffusers' run (GenerationRequest::latents, what `xfuser-run
// --latents` feeds); the final latents equal diffusers' output_type="latent" result within 1e-4
// relative (fp32) and the decoded image diffusers' output_type="np" within 1/255.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/flux/flux_pipeline.h"
#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "models/xfuser_model.h"
#include "runner/image_input.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;

using xfuser::testing::check_pipeline;

TEST(PipelineParity, StableDiffusion3) { check_pipeline("sd3-tiny"); }
TEST(PipelineParity, StableDiffusion3WithoutT5) { check_pipeline("sd3-tiny-no-t5"); }
TEST(PipelineParity, Flux) { check_pipeline("flux-tiny"); }
// WanPipeline (Wan 2.1 T2V): UMT5 with prompt_clean, UniPC, the causal video VAE; frames
// [B, F, H, W, 3].
TEST(PipelineParity, WanTextToVideo) { check_pipeline("wan-t2v-tiny"); }
// WanImageToVideoPipeline (Wan 2.1 I2V): the picture through CLIPImageProcessor + CLIPVisionModel
// and, resized with PIL's Lanczos, VAE-encoded as the condition.
TEST(PipelineParity, WanImageToVideo) { check_pipeline("wan-i2v-tiny"); }
// Wan 2.2 A14B layouts (diffusers 0.35.2): two experts switched at boundary_ratio, each with its
// guidance scale; I2V conditions on the VAE-encoded picture without CLIP. The folder (a
// transformer_2) picks Wan2.2-T2V / Wan2.2-I2V.
TEST(PipelineParity, Wan22TextToVideoTwoExperts) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "wan22-t2v-tiny";
  XF_REQUIRE_FIXTURE(folder);
  EXPECT_EQ(ModelRegistry::for_pipeline_folder(folder).id, "Wan2.2-T2V");
  check_pipeline("wan22-t2v-tiny");
}
// A boundary_ratio without the transformer_2 it hands the low-noise steps to is refused, naming
// the key (diffusers would fail at the first low-noise step).
TEST(PipelineParity, WanBoundaryRatioWithoutSecondExpertIsNamed) {
  const fs::path src = xfuser::testing::fixtures_dir() / "pipelines" / "wan-t2v-tiny";
  XF_REQUIRE_FIXTURE(src);
  xfuser::testing::TempDir tmp("xfuser-wan-boundary");
  const fs::path folder = tmp / "wan";
  fs::copy(src, folder, fs::copy_options::recursive);
  auto index = xfuser::testing::read_json(folder / "model_index.json");
  index["boundary_ratio"] = 0.875;
  std::ofstream(folder / "model_index.json") << index.dump(2);
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  xfuser::testing::expect_error_containing(
      [&] { model->load(folder, xfuser::models::ModelLoadOptions{}); },
      {"model_index.json", "boundary_ratio = 0.875 without a transformer_2"});
}
TEST(PipelineParity, Wan22ImageToVideoTwoExperts) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "wan22-i2v-tiny";
  XF_REQUIRE_FIXTURE(folder);
  EXPECT_EQ(ModelRegistry::for_pipeline_folder(folder).id, "Wan2.2-I2V");
  check_pipeline("wan22-i2v-tiny");
}

// FluxKontextPipeline (diffusers 0.35.2): the picture auto-resized to 1456x720, VAE-encoded,
// its tokens joined to the generated ones; one and two prompts, distilled guidance and true CFG.
TEST(PipelineParity, FluxKontext) { check_pipeline("kontext-tiny"); }

// Every tiny pipeline loaded and saved again by diffusers 0.42.1 / transformers 5.24 (configs of
// today's releases, CLIP and T5 tokenizers as tokenizer.json alone, CLIPTextModel weights without
// their text_model. prefix, Wan's scheduler now from_one) against that release's final latents.
class ResavedByDiffusers0421 : public ::testing::TestWithParam<std::string> {};
TEST_P(ResavedByDiffusers0421, EqualsItsFinalLatents) {
  xfuser::testing::check_resaved_pipeline(GetParam(), "0.42.1");
}
INSTANTIATE_TEST_SUITE_P(Pipelines, ResavedByDiffusers0421,
                         ::testing::Values("flux-tiny", "kontext-tiny", "sd3-tiny",
                                           "sd3-tiny-no-t5", "wan-t2v-tiny", "wan-i2v-tiny",
                                           "wan22-t2v-tiny", "wan22-i2v-tiny", "hunyuan-video-tiny",
                                           "hunyuan_video15-tiny", "hunyuan_video15-i2v-tiny",
                                           "flux2-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param;
                           for (char& c : id) {
                             if (c == '-') c = '_';
                           }
                           return id;
                         });

// Step caching against diffusers 0.42.1's cache hooks (FirstBlockCacheConfig, MagCacheConfig,
// TaylorSeerCacheConfig in lite mode; TeaCache's reference formula on MagCache's machinery, with
// the published polynomial, for FLUX.1 and HunyuanVideo) on every transformer of the pipeline:
// cache-v0.42.1/<pipeline>/<method>/ holds a committed case run at 8 steps with the hook, every
// transformer call's decision in order, and the final latents. The same calls must run in full or
// be served from the cache (per guidance branch, per expert), and the final latents equal
// diffusers' within 1e-4 relative (fp32). MagCache's calibration run gives each call's magnitude
// ratio as diffusers' does.
class CacheParity : public ::testing::TestWithParam<std::string> {};
TEST_P(CacheParity, SameSkipsAndFinalLatentsAsDiffusers) {
  namespace models = xfuser::models;
  const std::string name = GetParam();
  const fs::path root = xfuser::testing::fixtures_dir() / "cache-v0.42.1" / name;
  XF_REQUIRE_FIXTURE(root);
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  // TeaCache's published polynomials exist for FLUX.1 and HunyuanVideo only.
  const bool teacache = name == "flux-tiny" || name == "hunyuan-video-tiny";
  int methods = 0;
  for (const char* method :
       {"fbcache", "magcache", "taylorseer", "teacache", "magcache_calibrate"}) {
    if (std::string(method) == "teacache" && !teacache) continue;
    const fs::path dir = root / method;
    SCOPED_TRACE(dir.string());
    XF_REQUIRE_FIXTURE(dir);
    const auto c = xfuser::testing::read_json(dir / "case.json");
    const auto& k = c["cache"];
    models::ModelLoadOptions options;  // fp32
    options.cache.method = models::parse_cache_method(k["method"]);
    if (k.contains("threshold")) options.cache.threshold = k["threshold"].get<double>();
    options.cache.max_skip_steps = k.value("max_skip_steps", 3);
    options.cache.retention_ratio = k.value("retention_ratio", 0.2);
    if (k.contains("mag_ratios")) {
      options.cache.mag_ratios = k["mag_ratios"].get<std::vector<double>>();
    }
    if (k.contains("teacache_coefficients")) {
      options.cache.teacache_coefficients = k["teacache_coefficients"].get<std::vector<double>>();
    }
    options.cache.cache_interval = k.value("cache_interval", 5);
    options.cache.disable_cache_before_step = k.value("disable_cache_before_step", 3);
    options.cache.max_order = k.value("max_order", 1);
    options.cache.calibrate = k.value("calibrate", false);
    if (k.contains("factors_dtype")) options.cache.factors_dtype = at::kFloat;
    auto model = spec.create(spec);
    model->load(folder, options);
    GenerationRequest r = xfuser::testing::reference_case_request(dir);
    // diffusers 0.42's UniPC takes its flow sigmas from one, whatever the folder's version.
    if (name.rfind("wan", 0) == 0) r.flow_sigmas = "from_one";
    const auto out = model->generate(r);
    std::string want, got;
    for (const auto& d : c["decisions"]) want += d["computed"].get<bool>() ? 'C' : '.';
    for (const auto& d : out.cache.decisions) got += d.computed ? 'C' : '.';
    EXPECT_EQ(got, want) << "transformer calls run in full (C) or served from the cache (.)";
    EXPECT_EQ(out.cache.skipped, static_cast<int>(std::count(want.begin(), want.end(), '.')));
    const at::Tensor final_latents =
        xfuser::models::SafetensorsFile((dir / "final.safetensors").string()).get("latents");
    ASSERT_EQ(out.latents.sizes(), final_latents.sizes());
    const double rel = xfuser::testing::max_rel_error(out.latents, final_latents);
    EXPECT_LE(rel, 1e-4) << "final latents vs diffusers";
    if (options.cache.calibrate) {
      // Each call's magnitude ratio, in call order, from the per-branch lists of the report.
      std::map<std::string, std::vector<double>> lists(out.cache.calibration.begin(),
                                                       out.cache.calibration.end());
      std::map<std::string, size_t> next;
      double worst = 0.0;
      ASSERT_EQ(out.cache.decisions.size(), c["decisions"].size());
      for (size_t i = 0; i < out.cache.decisions.size(); ++i) {
        const auto& d = out.cache.decisions[i];
        const std::string key = d.model + "/" + d.branch;
        ASSERT_LT(next[key], lists[key].size()) << key;
        const double mine = lists[key][next[key]++];
        const double theirs = c["decisions"][i]["calibration_ratio"].get<double>();
        worst = std::max(worst, std::fabs(mine - theirs) / std::fabs(theirs));
      }
      EXPECT_LE(worst, 1e-4) << "magnitude ratios vs diffusers' calibration";
      std::printf("%s %s: ratios rel %.2e\n", name.c_str(), method, worst);
    }
    std::printf("%s %s: %s, final latents rel %.2e\n", name.c_str(), method, got.c_str(), rel);
    ++methods;
  }
  EXPECT_EQ(methods, teacache ? 5 : 4);
}
INSTANTIATE_TEST_SUITE_P(Pipelines, CacheParity,
                         ::testing::Values("flux-tiny", "wan-t2v-tiny", "wan22-t2v-tiny",
                                           "hunyuan-video-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param;
                           for (char& c : id) {
                             if (c == '-') c = '_';
                           }
                           return id;
                         });

TEST(PipelineParity, KontextPreferredResolutionsAndOutputSizeAsDiffusers) {
  using xfuser::models::flux::FluxModel;
  using Size = std::pair<int64_t, int64_t>;
  // (height, width) of the picture -> the preferred resolution (height, width), computed by
  // diffusers 0.35.2's min((abs(aspect - w / h), w, h) for w, h in PREFERRED_...) after
  // get_default_height_width's multiples of 16.
  EXPECT_EQ(FluxModel::kontext_resolution(45, 70), Size(720, 1456));
  EXPECT_EQ(FluxModel::kontext_resolution(1000, 1000), Size(1024, 1024));
  EXPECT_EQ(FluxModel::kontext_resolution(1920, 1080), Size(1392, 752));
  EXPECT_EQ(FluxModel::kontext_resolution(100, 700), Size(672, 1568));
  EXPECT_EQ(FluxModel::kontext_output_size(48, 80, 48 * 80), Size(48, 80));
  EXPECT_EQ(FluxModel::kontext_output_size(768, 1360, 1024 * 1024), Size(768, 1360));
}

TEST(PipelineParity, WrongLatentShapeNamesTheLayout) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "sd3-tiny";
  XF_REQUIRE_FIXTURE(folder);
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  model->load(folder, {});
  GenerationRequest r;
  r.prompts = {"a cat"};
  r.height = r.width = 64;
  r.num_inference_steps = 1;
  r.guidance_scale = 1.0;
  r.max_sequence_length = 8;
  r.seeds = {0};
  r.latents = at::zeros({1, 16, 4, 4});
  try {
    model->generate(r);
    FAIL() << "a wrong --latents shape must be an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--latents holds a tensor of [1, 16, 4, 4]"), std::string::npos) << what;
    EXPECT_NE(what.find("[1, 16, 8, 8]"), std::string::npos) << what;
  }
}

}  // namespace
