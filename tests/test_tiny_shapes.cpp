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
#include <ostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "examples/tiny_shapes/scene_check.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "runner/outputs.h"
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

// The verdicts of `folder`'s pipeline on `scenes`, fp32 unless `options` say otherwise, scene i
// generated from seed i, printing the failures.
struct Rates {
  int scenes = 0;
  int colour_place = 0;
  int kind = 0;
  double colour_place_rate() const { return static_cast<double>(colour_place) / scenes; }
  double pass_rate() const { return static_cast<double>(kind) / scenes; }
};

Rates rates(const fs::path& folder, const json& held, const json& scenes,
            const xfuser::models::ModelLoadOptions& options = {}) {
  using namespace xfuser::models;
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  model->load(folder, options);
  Rates out;
  out.scenes = static_cast<int>(scenes.size());
  const int batch = 8;
  for (int start = 0; start < out.scenes; start += batch) {
    const GenerationRequest r = xfuser::examples::tiny_shapes::scene_request(
        scenes, start, std::min(out.scenes, start + batch), held, held["num_inference_steps"]);
    const auto gen = model->generate(r);
    for (size_t b = 0; b < r.prompts.size(); ++b) {
      const auto& scene = scenes[start + static_cast<int>(b)];
      const Verdict v = check_picture(gen.images[static_cast<int64_t>(b)], scene, held);
      out.colour_place += v.colour_place;
      out.kind += v.kind;
      if (!v.pass) {
        std::printf("  fail: %s: %s\n", scene["caption"].get<std::string>().c_str(), v.why.c_str());
      }
    }
  }
  return out;
}

// Scenes per held-out set checked here (spread over each set; examples/tiny_shapes/README.md
// gives the whole sets' numbers, through diffusers and xfuser), and the bars. A bar sits below
// the committed model's measured rate on the same scenes (the README), so that another libtorch
// or BLAS, whose pictures differ by a level here and there, has a few scenes of slack. The
// README's goals are higher where the model falls short of them (counts): a bar records what the
// committed model does, so that a change that makes it worse fails.
struct SetBar {
  const char* set;
  int scenes;
  double colour_place;  // at least: every colour and place right (or colours, places free)
  double kind;          // at least: that and every shape of its kind
};
constexpr SetBar kBars[] = {
    {"single", 100, 0.97, 0.88},  // one shape, everything said: 100% / 93% measured
    {"free", 50, 0.88, 0.70},     // a size, the places or the background left out: 94% / 76%
    {"multi", 50, 0.94, 0.78},    // two or three shapes, places said: 100% / 84%
    {"counts", 24, 0.37, 0.16},   // "two red circles ...", the colours in as many cells: 45.8% /
                                  // 25%
    {"unknown", 24, 0.87, 0.75},  // single scenes with real words the model never saw: 95.8% /
                                  // 83.3%
};
// The random-weight model is checked on 24 one-shape scenes; it passes none (noise has no flat
// background).
constexpr int kRandomScenes = 24;
constexpr double kRandomAtMost = 0.05;

// One test per held-out set, so that ctest runs the sets side by side (tests/tiny_shapes.cmake).
// GoogleTest names a case by its set.
void PrintTo(const SetBar& bar, std::ostream* os) { *os << bar.set; }

class HeldOutSet : public ::testing::TestWithParam<SetBar> {};

TEST_P(HeldOutSet, DrawsHeldOutScenes) {
  const SetBar& bar = GetParam();
  const json held = held_out();
  const json scenes = xfuser::examples::tiny_shapes::spread_scenes(held, bar.scenes, bar.set);
  const Rates r = rates(xfuser::models::flux::tiny_shapes_dir(), held, scenes);
  std::printf("tiny-shapes %s: %d scenes, colour and place %.1f%%, and kind %.1f%%\n", bar.set,
              r.scenes, 100 * r.colour_place_rate(), 100 * r.pass_rate());
  EXPECT_GE(r.colour_place_rate(), bar.colour_place) << bar.set;
  EXPECT_GE(r.pass_rate(), bar.kind) << bar.set;
}

INSTANTIATE_TEST_SUITE_P(TinyShapes, HeldOutSet, ::testing::ValuesIn(kBars),
                         [](const ::testing::TestParamInfo<SetBar>& info) {
                           return std::string(info.param.set);
                         });

// FP8 GEMMs (the blocks' Linear weights in float8_e4m3fn with per-channel scales, activations
// quantized per token) against their compute dtype, on 100 one-shape scenes: the pass rate within
// 7 points. The compute dtype is the CPU's default, xfuser-run's: bf16 where the CPU has
// AVX512-BF16, else fp32 (emulated bf16 takes libtorch 1.13 over ten times as long there, past
// the test's time limit). Measured on the committed model (docs/fp8.md): fp32 93%, FP8 88%, the
// five scenes FP8 loses all squares or triangles whose corners round off; bf16 91%, FP8 88%. A
// broken FP8 path loses far more than 7 points: random weights pass none of these scenes.
TEST(TinyShapes, Fp8GemmsDrawWithinSevenPointsOfTheirComputeDtype) {
  const json held = held_out();
  const json scenes = xfuser::examples::tiny_shapes::spread_scenes(held, 100);
  xfuser::models::ModelLoadOptions plain;
  plain.dtype = xfuser::runner::default_cpu_dtype();
  auto fp8 = plain;
  fp8.transformer_weights.kind = xfuser::models::WeightFormat::Kind::kFp8Scaled;
  const auto dir = xfuser::models::flux::tiny_shapes_dir();
  const double base = rates(dir, held, scenes, plain).pass_rate();
  const double rate = rates(dir, held, scenes, fp8).pass_rate();
  std::printf("tiny-shapes one-shape scenes: %s %.1f%%, FP8 GEMMs %.1f%% of %d\n",
              c10::toString(plain.dtype), 100 * base, 100 * rate, static_cast<int>(scenes.size()));
  EXPECT_GE(rate, base - 0.07);
}

TEST(TinyShapes, RandomWeightsFailTheSameCheck) {
  const json held = held_out();
  // The random tiny FLUX pipeline (same architecture family, seeded random weights).
  const json scenes = xfuser::examples::tiny_shapes::spread_scenes(held, kRandomScenes);
  const double rate =
      rates(xfuser::models::flux::ensure_tiny_flux(0), held, scenes).colour_place_rate();
  std::printf("random tiny-flux: %.1f%% of %d held-out scenes\n", 100 * rate, kRandomScenes);
  EXPECT_LE(rate, kRandomAtMost);
}

// Draws a scene as examples/tiny_shapes/shapes.py does (flat colours, each shape centered in its
// cell, of its size's half extent): circle, square of half side 0.85 r, upright triangle as wide
// as high. `kinds` overrides the shapes' kinds when not empty.
at::Tensor draw(const json& held, const json& scene, const std::vector<std::string>& kinds = {}) {
  static const std::map<std::string, double> half = {
      {"small", 7.0}, {"medium", 10.0}, {"large", 13.0}};
  const int size = held["size"];
  const double cell = static_cast<double>(size) / held["grid"].get<int>();
  at::Tensor pic = at::empty({size, size, 3}, at::kByte);
  auto a = pic.accessor<uint8_t, 3>();
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      json c = held["palette"][scene["background"].get<std::string>()];
      for (size_t i = 0; i < scene["shapes"].size(); ++i) {
        const json& s = scene["shapes"][i];
        const std::string kind = kinds.empty() ? s["kind"].get<std::string>() : kinds[i];
        const double r = half.at(s["size"]);
        const double dx = x + 0.5 - (s["col"].get<int>() + 0.5) * cell;
        const double dy = y + 0.5 - (s["row"].get<int>() + 0.5) * cell;
        bool inside = false;
        if (kind == "circle") inside = dx * dx + dy * dy <= r * r;
        if (kind == "square") inside = std::abs(dx) <= 0.85 * r && std::abs(dy) <= 0.85 * r;
        if (kind == "triangle") {
          inside = dy >= -0.9 * r && dy <= 0.9 * r && std::abs(dx) <= (dy + 0.9 * r) / 1.8;
        }
        if (inside) c = held["palette"][s["colour"].get<std::string>()];
      }
      for (int k = 0; k < 3; ++k) a[y][x][k] = static_cast<uint8_t>(c[k].get<int>());
    }
  }
  return pic;
}

TEST(TinyShapes, CheckerAcceptsDrawnScenesAndRefusesWrongOnes) {
  // The criterion itself, on exact drawings of held-out scenes of every set: each passes; the
  // same drawing fails against another background, with a shape's colour changed to the
  // background's, or with a shape drawn as another kind (for the kind alone: its colour and
  // place stay right).
  const json held = held_out();
  const std::vector<std::string> kinds = {"circle", "square", "triangle"};
  int checked = 0;
  for (const auto& [set, all] : held["sets"].items()) {
    for (const auto& scene : xfuser::examples::tiny_shapes::spread_scenes(held, 12, set)) {
      ++checked;
      const at::Tensor pic = draw(held, scene);
      const Verdict v = check_picture(pic, scene, held);
      EXPECT_TRUE(v.pass) << set << ": " << scene["caption"] << ": " << v.why;
      json other = scene;
      other["background"] = scene["background"] == "white" ? "black" : "white";
      bool uses = false;
      for (const auto& s : scene["shapes"]) uses = uses || s["colour"] == other["background"];
      if (!uses) {
        EXPECT_FALSE(check_picture(pic, other, held).pass) << scene["caption"];
      }
      other = scene;
      other["shapes"][0]["colour"] = scene["background"];
      EXPECT_FALSE(check_picture(pic, other, held).pass) << scene["caption"];
      std::vector<std::string> drawn;
      for (const auto& s : scene["shapes"]) drawn.push_back(s["kind"]);
      const auto at = std::find(kinds.begin(), kinds.end(), drawn[0]) - kinds.begin();
      drawn[0] = kinds[(at + 1) % kinds.size()];
      const Verdict wrong = check_picture(draw(held, scene, drawn), scene, held);
      EXPECT_TRUE(wrong.colour_place) << scene["caption"] << ": " << wrong.why;
      EXPECT_FALSE(wrong.kind) << scene["caption"] << " drawn with a " << drawn[0];
    }
  }
  EXPECT_EQ(checked, 60);
}

TEST(TinyShapes, CheckerAgreesWithScorePy) {
  // scene_check.h against examples/tiny_shapes/score.py on the same pictures: held-out scenes
  // drawn and then spoiled in seeded ways (tests/fixtures/generate.py --only
  // tiny_shapes_checker), 60 verdicts of both outcomes of each part of the check.
  const json held = held_out();
  const fs::path dir = xfuser::testing::fixtures_dir() / "tiny_shapes_checker";
  XF_REQUIRE_FIXTURE(dir / "verdicts.json");
  const json rows = xfuser::testing::read_json(dir / "verdicts.json");
  int passing = 0;
  int failing = 0;
  for (const auto& row : rows) {
    const at::Tensor pic = xfuser::runner::read_png(dir / row["picture"].get<std::string>());
    const Verdict v = check_picture(pic, row["scene"], held);
    EXPECT_EQ(v.colour_place, row["colour_place"].get<bool>())
        << row["picture"] << " (" << row["spoil"] << "): " << v.why;
    EXPECT_EQ(v.kind, row["kind"].get<bool>())
        << row["picture"] << " (" << row["spoil"] << "): " << v.why;
    (row["kind"].get<bool>() ? passing : failing) += 1;
  }
  EXPECT_EQ(rows.size(), 60u);
  EXPECT_GT(passing, 10);
  EXPECT_GT(failing, 10);
}

// A trained LoRA adapter (examples/tiny_shapes/lora_night.safetensors, train_lora.py, written
// by diffusers' save_lora_weights): the captioned shapes on a black background, whatever
// background the caption names. On held-out scenes spread over the list (those with a black shape
// left out: it would vanish), unfused so that one model runs both scales:
//   - at scale 1 the pictures pass the checker's colour and place against the night scene
//     (background black); the adapter changes the background, not the shapes' kinds;
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
  for (const auto& scene : xfuser::examples::tiny_shapes::spread_scenes(held, 60)) {
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
      night_pass += v.colour_place;
      base_night_pass +=
          check_picture(plain.images[static_cast<int64_t>(b)], scene, held).colour_place;
      if (!v.colour_place) {
        std::printf("  night fail: %s: %s\n", scene["caption"].get<std::string>().c_str(),
                    v.why.c_str());
      }
    }
  }
  std::printf(
      "lora_night: %d of %d held-out scenes drawn on black (base model: %d, of which %d "
      "captioned black)\n",
      night_pass, count, base_night_pass, already_black);
  EXPECT_GE(night_pass, 0.85 * count);
  EXPECT_LE(base_night_pass, already_black);
}

TEST(TinyShapes, EqualsDiffusers) {
  // diffusers' FluxPipeline on the same folder and initial latents (tests/fixtures/generate.py
  // --only tiny_shapes): final latents within 1e-4, pictures within 1 level, fp32.
  xfuser::testing::check_pipeline("tiny-shapes", xfuser::models::flux::tiny_shapes_dir());
}

}  // namespace
