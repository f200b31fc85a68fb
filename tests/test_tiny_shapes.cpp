// tiny-shapes, the trained embedded model (models/flux/tiny_shapes, made by
// examples/tiny_shapes/train.py): the share of held-out scenes it draws as captioned (a measured
// criterion, examples/tiny_shapes/score.py), against a random-weight model of the same
// architecture, and diffusers' FluxPipeline on the same folder and initial latents.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "examples/tiny_shapes/scene_check.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "runner/runner.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using xfuser::examples::tiny_shapes::check_picture;
using xfuser::examples::tiny_shapes::Verdict;

json held_out() {
  const fs::path file = xfuser::testing::source_dir() / "examples/tiny_shapes/heldout.json";
  return xfuser::testing::read_json(file);
}

// The pass rate of `folder`'s pipeline on `count` held-out scenes spread evenly over the list
// (which is sorted by background: of its first 48, 37 are on red), fp32 unless `options` say
// otherwise, one seed per scene, printing the failures.
double pass_rate(const fs::path& folder, const json& held, int count,
                 const xfuser::models::ModelLoadOptions& options = {}) {
  using namespace xfuser::models;
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  model->load(folder, options);
  const json scenes = xfuser::examples::tiny_shapes::spread_scenes(held, count);
  int passed = 0;
  const int batch = 8;
  for (int start = 0; start < count; start += batch) {
    const GenerationRequest r = xfuser::examples::tiny_shapes::scene_request(
        scenes, start, std::min(count, start + batch), held, held["num_inference_steps"]);
    const auto out = model->generate(r);
    for (size_t b = 0; b < r.prompts.size(); ++b) {
      const auto& scene = scenes[start + static_cast<int>(b)];
      const Verdict v = check_picture(out.images[static_cast<int64_t>(b)], scene, held);
      passed += v.pass;
      if (!v.pass) {
        std::printf("  fail: %s: %s\n", scene["caption"].get<std::string>().c_str(), v.why.c_str());
      }
    }
  }
  return static_cast<double>(passed) / count;
}

// The random-weight model is checked on 48 of the held-out scenes spread over the list; the
// trained one on all 300.
constexpr int kScenes = 48;
// The bar: 90%. The committed model passes 284 of the 300 held-out scenes in xfuser (94.7%;
// diffusers 97 of 100), so another libtorch or BLAS has 14 scenes of slack; its failures are
// small triangles and small shapes of a colour close to the background's
// (examples/tiny_shapes/README.md).
constexpr double kTrainedAtLeast = 0.9;
// The random-weight model passes none (noise has no flat background).
constexpr double kRandomAtMost = 0.05;

TEST(TinyShapes, DrawsHeldOutCaptions) {
  const json held = held_out();
  const int count = static_cast<int>(held["scenes"].size());
  const double rate = pass_rate(xfuser::models::flux::tiny_shapes_dir(), held, count);
  std::printf("tiny-shapes: %.1f%% of %d held-out scenes drawn as captioned\n", 100 * rate, count);
  EXPECT_GE(rate, kTrainedAtLeast);
}

// FP8 GEMMs (the blocks' Linear weights in float8_e4m3fn with per-channel scales, activations
// quantized per token) against their compute dtype, on all 300 held-out scenes: the pass rate
// within 2 points. The compute dtype is the CPU's default, xfuser-run's: bf16 where the CPU has
// AVX512-BF16, else fp32 (emulated bf16 takes libtorch 1.13 over ten times as long there, past
// the test's time limit). docs/fp8.md quotes the bf16 numbers.
TEST(TinyShapes, Fp8GemmsDrawWithinTwoPointsOfTheirComputeDtype) {
  const json held = held_out();
  const int count = static_cast<int>(held["scenes"].size());
  xfuser::models::ModelLoadOptions plain;
  plain.dtype = xfuser::runner::default_cpu_dtype();
  auto fp8 = plain;
  fp8.transformer_weights.kind = xfuser::models::WeightFormat::Kind::kFp8Scaled;
  const auto dir = xfuser::models::flux::tiny_shapes_dir();
  const double base = pass_rate(dir, held, count, plain);
  const double rate = pass_rate(dir, held, count, fp8);
  std::printf("tiny-shapes held-out scenes: %s %.1f%%, FP8 GEMMs %.1f%% of %d\n",
              c10::toString(plain.dtype), 100 * base, 100 * rate, count);
  EXPECT_GE(rate, base - 0.02);
}

TEST(TinyShapes, RandomWeightsFailTheSameCheck) {
  const json held = held_out();
  // The random tiny FLUX pipeline (same architecture family, seeded random weights).
  const double rate = pass_rate(xfuser::models::flux::ensure_tiny_flux(0), held, kScenes);
  std::printf("random tiny-flux: %.1f%% of %d held-out scenes\n", 100 * rate, kScenes);
  EXPECT_LE(rate, kRandomAtMost);
}

TEST(TinyShapes, CheckerAcceptsDrawnScenes) {
  // The criterion itself: an exact drawing of each scene (flat colours, shapes of the named size
  // centered in their cells) passes, and the same drawing checked against another background or
  // another colour does not.
  const json held = held_out();
  const int size = held["size"];
  const double cell = static_cast<double>(size) / held["grid"].get<int>();
  for (int i = 0; i < 20; ++i) {
    json scene = held["scenes"][i];
    auto rgb = [&](const std::string& name) { return held["palette"][name]; };
    at::Tensor pic = at::empty({size, size, 3}, at::kByte);
    auto a = pic.accessor<uint8_t, 3>();
    for (int y = 0; y < size; ++y) {
      for (int x = 0; x < size; ++x) {
        json c = rgb(scene["background"]);
        for (const auto& s : scene["shapes"]) {
          const double cx = (s["col"].get<int>() + 0.5) * cell;
          const double cy = (s["row"].get<int>() + 0.5) * cell;
          if (std::abs(x + 0.5 - cx) < 12 && std::abs(y + 0.5 - cy) < 12) c = rgb(s["colour"]);
        }
        for (int k = 0; k < 3; ++k) a[y][x][k] = static_cast<uint8_t>(c[k].get<int>());
      }
    }
    EXPECT_TRUE(check_picture(pic, scene, held).pass) << scene["caption"];
    json other = scene;
    other["background"] = scene["shapes"][0]["colour"] == "white" ? "black" : "white";
    if (other["background"] != scene["background"]) {
      EXPECT_FALSE(check_picture(pic, other, held).pass) << scene["caption"];
    }
    other = scene;
    other["shapes"][0]["colour"] = scene["background"];
    EXPECT_FALSE(check_picture(pic, other, held).pass) << scene["caption"];
  }
}

// A trained LoRA adapter (examples/tiny_shapes/lora_night.safetensors, train_lora.py, written
// by diffusers' save_lora_weights): the captioned shapes on a black background, whatever
// background the caption names. On held-out scenes spread over the list (those with a black shape
// left out: it would vanish), unfused so that one model runs both scales:
//   - at scale 1 the pictures pass the checker against the night scene (background black);
//   - the base model's pictures pass against the night scene only where the caption's background
//     was black already, so the change is the adapter's;
//   - at scale 0 the pictures equal the base model's bit for bit.
TEST(TinyShapes, TrainedLoraAdapterPaintsTheNight) {
  using namespace xfuser::models;
  const json held = held_out();
  const fs::path adapter =
      xfuser::testing::source_dir() / "examples/tiny_shapes/lora_night.safetensors";
  XF_REQUIRE_FIXTURE(adapter);
  const fs::path dir = flux::tiny_shapes_dir();
  const auto& spec = ModelRegistry::for_pipeline_folder(dir);
  auto base = spec.create(spec);
  base->load(dir, {});
  ModelLoadOptions options;
  LoraSpec night;
  night.path = adapter.string();
  options.lora = {night};
  options.lora_fused = false;
  auto model = spec.create(spec);
  model->load(dir, options);
  json scenes = json::array();
  for (const auto& scene : xfuser::examples::tiny_shapes::spread_scenes(held, 100)) {
    bool black_shape = false;
    for (const auto& s : scene["shapes"]) black_shape = black_shape || s["colour"] == "black";
    if (!black_shape) scenes.push_back(scene);
  }
  const int count = static_cast<int>(scenes.size());
  int night_pass = 0, base_night_pass = 0, already_black = 0;
  const int batch = 8;
  for (int start = 0; start < count; start += batch) {
    GenerationRequest r = xfuser::examples::tiny_shapes::scene_request(
        scenes, start, std::min(count, start + batch), held, held["num_inference_steps"]);
    const auto with = model->generate(r);
    const auto plain = base->generate(r);
    if (start == 0) {
      GenerationRequest off = r;
      off.lora_scales["lora_night"] = 0.0;
      const auto zero = model->generate(off);
      EXPECT_TRUE(at::equal(zero.images, plain.images)) << "scale 0 vs the base model";
    }
    for (size_t b = 0; b < r.prompts.size(); ++b) {
      json scene = scenes[start + static_cast<int>(b)];
      already_black += scene["background"] == "black";
      scene["background"] = "black";
      const Verdict v = check_picture(with.images[static_cast<int64_t>(b)], scene, held);
      night_pass += v.pass;
      base_night_pass += check_picture(plain.images[static_cast<int64_t>(b)], scene, held).pass;
      if (!v.pass) {
        std::printf("  night fail: %s: %s\n", scene["caption"].get<std::string>().c_str(),
                    v.why.c_str());
      }
    }
  }
  std::printf(
      "lora_night: %d of %d held-out scenes drawn on black (base model: %d, of which %d "
      "captioned black)\n",
      night_pass, count, base_night_pass, already_black);
  EXPECT_GE(night_pass, 0.75 * count);
  EXPECT_LE(base_night_pass, already_black);
}

TEST(TinyShapes, EqualsDiffusers) {
  // diffusers' FluxPipeline on the same folder and initial latents (tests/fixtures/generate.py
  // --only tiny_shapes): final latents within 1e-4, pictures within 1 level, fp32.
  xfuser::testing::check_pipeline("tiny-shapes", xfuser::models::flux::tiny_shapes_dir());
}

}  // namespace
