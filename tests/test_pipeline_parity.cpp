// Whole pipelines against diffusers, image for image: the tiny pipeline folders that
// tests/fixtures/generate.py saved with diffusers (StableDiffusion3Pipeline with and without T5,
// FluxPipeline, WanPipeline) run from the folder alone (the model comes from model_index.json),
// from the same initial latents as diffusers' run (GenerationRequest::latents, what `xfuser-run
// --latents` feeds); the final latents equal diffusers' output_type="latent" result within 1e-4
// relative (fp32) and the decoded image diffusers' output_type="np" within 1/255.
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "models/xfuser_model.h"
#include "runner/image_input.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;

std::vector<std::string> strings(const nlohmann::json& j) {
  if (j.is_null()) return {};
  if (j.is_string()) return {j.get<std::string>()};
  return j.get<std::vector<std::string>>();
}

// Runs every reference case under tests/fixtures/pipelines/<name>.ref/ on pipelines/<name>/.
void check_pipeline(const std::string& name) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const fs::path refs = xfuser::testing::fixtures_dir() / "pipelines" / (name + ".ref");
  XF_REQUIRE_FIXTURE(folder);
  XF_REQUIRE_FIXTURE(refs);
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  model->load(folder, {});  // fp32
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(refs)) {
    const fs::path dir = entry.path();
    SCOPED_TRACE(dir.string());
    std::ifstream in(dir / "case.json");
    const auto c = nlohmann::json::parse(in);
    GenerationRequest r;
    r.prompts = strings(c["prompt"]);
    const auto negatives = strings(c["negative_prompt"]);
    for (size_t i = 0; i < r.prompts.size() && !negatives.empty(); ++i) {
      r.negative_prompts.push_back(negatives.size() == 1 ? negatives[0] : negatives[i]);
    }
    r.height = c["height"];
    r.width = c["width"];
    r.num_inference_steps = c["num_inference_steps"];
    r.guidance_scale = c["guidance_scale"];
    r.true_cfg_scale = c.value("true_cfg_scale", 1.0);
    r.max_sequence_length = c["max_sequence_length"];
    r.num_frames = c.value("num_frames", 0);
    if (c.contains("guidance_scale_2") && !c["guidance_scale_2"].is_null()) {
      r.guidance_scale_2 = c["guidance_scale_2"].get<double>();
    }
    if (c.contains("input_image")) {
      r.input_images = {xfuser::runner::read_image(dir / c["input_image"].get<std::string>())};
    }
    r.seeds.assign(r.prompts.size(), 0);  // unused: the latents are given
    r.latents = xfuser::models::SafetensorsFile((dir / "latents.safetensors").string())
                    .get("latents")
                    .clone();
    const auto out = model->generate(r);
    const at::Tensor want =
        xfuser::models::SafetensorsFile((dir / "final.safetensors").string()).get("latents");
    // The run reports the latents it started from, in the pipeline's own layout.
    EXPECT_TRUE(at::equal(out.initial_latents, r.latents));
    ASSERT_EQ(out.latents.sizes(), want.sizes());
    const double rel = xfuser::testing::max_rel_error(out.latents, want);
    EXPECT_LE(rel, 1e-4) << "final latents vs diffusers";
    std::printf("%s/%s: final latents rel %.2e\n", name.c_str(), dir.filename().string().c_str(),
                rel);
    if (fs::exists(dir / "image.safetensors")) {
      const at::Tensor image =
          xfuser::models::SafetensorsFile((dir / "image.safetensors").string()).get("image");
      const at::Tensor ref = (image * 255).round().to(at::kInt);  // [B, (F,) H, W, 3]
      ASSERT_EQ(out.images.sizes(), ref.sizes());
      const int diff = (out.images.to(at::kInt) - ref).abs().max().item<int>();
      EXPECT_LE(diff, 1) << "decoded image vs diffusers (levels of 255)";
    }
    ++cases;
  }
  EXPECT_GT(cases, 0) << "no reference cases under " << refs;
}

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
TEST(PipelineParity, Wan22ImageToVideoTwoExperts) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "wan22-i2v-tiny";
  XF_REQUIRE_FIXTURE(folder);
  EXPECT_EQ(ModelRegistry::for_pipeline_folder(folder).id, "Wan2.2-I2V");
  check_pipeline("wan22-i2v-tiny");
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
