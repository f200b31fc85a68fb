// tiny-shapes-video, the trained embedded video model (models/wan/tiny_shapes_video, made by
// examples/tiny_shapes_video/train.py): the share of held-out clips that move as captioned (a
// measured criterion, examples/tiny_shapes_video/world.py's check_clip, per frame), against a
// random-weight model of the same architecture, the checker against world.py's, and diffusers'
// WanPipeline on the same folder and initial latents.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "examples/tiny_shapes_video/clip_check.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using xfuser::examples::tiny_shapes_video::check_clip;
using xfuser::examples::tiny_shapes_video::ClipVerdict;

json held_out() {
  return xfuser::testing::read_json(xfuser::testing::source_dir() /
                                    "examples/tiny_shapes_video/heldout.json");
}

fs::path model_dir(const std::string& id) {
  const auto& spec = xfuser::models::ModelRegistry::find(id);
  return spec.embedded_dir();
}

// `folder`'s pipeline, loaded.
std::unique_ptr<xfuser::models::XFuserModel> load_folder(const fs::path& folder) {
  using namespace xfuser::models;
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  model->load(folder, {});
  return model;
}

// The share of `clips` (held-out entries) that `model` makes as captioned, fp32, clip i from
// seed i, printing the failures.
double pass_rate(xfuser::models::XFuserModel& model, const json& held, const json& clips) {
  using namespace xfuser::models;
  const int count = static_cast<int>(clips.size());
  int passed = 0;
  const int batch = 4;
  for (int start = 0; start < count; start += batch) {
    const GenerationRequest r = xfuser::examples::tiny_shapes_video::clip_request(
        clips, start, std::min(count, start + batch), held);
    const auto gen = model.generate(r);
    for (size_t b = 0; b < r.prompts.size(); ++b) {
      const json& c = clips[start + static_cast<int>(b)];
      const ClipVerdict v = check_clip(gen.images[static_cast<int64_t>(b)], c["colour"],
                                       c["background"], c["motion"], held);
      passed += v.pass;
      if (!v.pass) {
        std::printf("  fail: %s: %s\n", c["caption"].get<std::string>().c_str(), v.why.c_str());
      }
    }
  }
  return static_cast<double>(passed) / count;
}

// Every held-out set is checked whole (60 clips each); examples/tiny_shapes_video/README.md
// gives the same numbers through diffusers. A bar sits a few clips below the committed model's
// measured rate, so that another libtorch or BLAS, whose frames differ by a level here and there,
// has some slack, while a change that makes the model worse fails. The goal is 90%. One test per
// set, so that ctest runs the sets side by side (tests/tiny_shapes_video.cmake).
struct SetBar {
  const char* set;
  double pass;
};
constexpr SetBar kBars[] = {
    {"canonical", 0.92},  // "a C K moves from left to right on a B background": 98.3% measured
    {"free", 0.90},       // free phrasings and orders: 96.7%
    {"unknown", 0.88},    // free phrasings with real words the model never saw: 95.0%
};

// GoogleTest names a case by its set.
void PrintTo(const SetBar& bar, std::ostream* os) { *os << bar.set; }

// The trained folder is loaded once per process, whichever sets the process runs.
class HeldOutSet : public ::testing::TestWithParam<SetBar> {
 protected:
  static void SetUpTestSuite() { model_ = load_folder(model_dir("tiny-shapes-video")); }
  static void TearDownTestSuite() { model_.reset(); }
  static std::unique_ptr<xfuser::models::XFuserModel> model_;
};
std::unique_ptr<xfuser::models::XFuserModel> HeldOutSet::model_;

TEST_P(HeldOutSet, MovesAsCaptioned) {
  const SetBar& bar = GetParam();
  const json held = held_out();
  const json& clips = held["sets"][bar.set];
  const double rate = pass_rate(*model_, held, clips);
  std::printf("tiny-shapes-video %s: %.1f%% of %d held-out clips move as captioned\n", bar.set,
              100 * rate, static_cast<int>(clips.size()));
  EXPECT_GE(rate, bar.pass) << bar.set;
}

INSTANTIATE_TEST_SUITE_P(TinyShapesVideo, HeldOutSet, ::testing::ValuesIn(kBars),
                         [](const ::testing::TestParamInfo<SetBar>& info) {
                           return std::string(info.param.set);
                         });

TEST(TinyShapesVideo, RandomWeightsFailTheSameCheck) {
  // The random tiny Wan pipeline (the same architecture, seeded random weights) at the held-out
  // size: noise has no flat background, and nothing moves as captioned.
  const json held = held_out();
  json clips = json::array();
  for (int i = 0; i < 60; i += 5) clips.push_back(held["sets"]["canonical"][i]);
  const double rate = pass_rate(*load_folder(model_dir("tiny-wan")), held, clips);
  std::printf("random tiny-wan: %.1f%% of %d held-out clips\n", 100 * rate,
              static_cast<int>(clips.size()));
  EXPECT_LE(rate, 0.05);
}

TEST(TinyShapesVideo, CheckerAgreesWithWorldPy) {
  // clip_check.h against examples/tiny_shapes_video/world.py on the same clips: held-out clips
  // drawn and then spoiled in seeded ways (tests/fixtures/generate.py --only
  // tiny_shapes_video_checker), 48 verdicts of both outcomes.
  const json held = held_out();
  const fs::path dir = xfuser::testing::fixtures_dir() / "tiny_shapes_video_checker";
  XF_REQUIRE_FIXTURE(dir / "verdicts.json");
  const json rows = xfuser::testing::read_json(dir / "verdicts.json");
  const int frames = held["frames"];
  const int size = held["size"];
  int passing = 0;
  int failing = 0;
  for (const auto& row : rows) {
    const at::Tensor strip = xfuser::runner::read_png(dir / row["clip"].get<std::string>());
    ASSERT_EQ(strip.size(0), frames * size) << row["clip"];
    const at::Tensor clip = strip.reshape({frames, size, size, 3});
    const ClipVerdict v = check_clip(clip, row["colour"], row["background"], row["motion"], held);
    EXPECT_EQ(v.pass, row["pass"].get<bool>())
        << row["clip"] << " (" << row["spoil"] << "): " << v.why;
    EXPECT_EQ(v.background, row["background_ok"].get<bool>()) << row["clip"];
    EXPECT_EQ(v.present, row["present"].get<int>()) << row["clip"];
    if (row.contains("travel")) {
      EXPECT_NEAR(v.travel, row["travel"].get<double>(), 1e-6) << row["clip"];
      EXPECT_EQ(v.back_steps, row["back_steps"].get<int>()) << row["clip"];
    }
    if (row.contains("area_ratio")) {
      EXPECT_NEAR(v.area_ratio, row["area_ratio"].get<double>(), 1e-9) << row["clip"];
    }
    (row["pass"].get<bool>() ? passing : failing) += 1;
  }
  EXPECT_EQ(rows.size(), 48u);
  EXPECT_GT(passing, 5);
  EXPECT_GT(failing, 20);
}

TEST(TinyShapesVideo, EqualsDiffusers) {
  // diffusers' WanPipeline on the same folder and initial latents (tests/fixtures/generate.py
  // --only tiny_shapes_video_pipeline): final latents within 1e-4, frames within 1 level, fp32.
  xfuser::testing::check_pipeline("tiny-shapes-video", model_dir("tiny-shapes-video"));
}

}  // namespace
