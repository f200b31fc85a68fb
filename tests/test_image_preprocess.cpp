// PIL Image.resize (Pillow 13, every resampling filter on L / RGB / RGBA uint8 images) byte for
// byte, transformers' center_crop, and CLIPImageProcessor.preprocess (transformers v4.44.2)
// against tests/fixtures/image_preprocess (made by tests/fixtures/generate.py).
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/image/clip_image_processor.h"
#include "models/image/pil_resize.h"
#include "tests/test_util.h"

namespace {
using xfuser::models::image::center_crop;
using xfuser::models::image::clip_resize_output_size;
using xfuser::models::image::ClipImageProcessorConfig;
using xfuser::models::image::pil_filter_from_int;
using xfuser::models::image::pil_resize;
using xfuser::models::image::PilFilter;
using xfuser::models::image::preprocess;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

std::filesystem::path dir() { return fixtures_dir() / "image_preprocess"; }

struct Fixture {
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json cases;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.tensors = read_tensors(dir() / "fixture.safetensors");
    x.cases = read_json(dir() / "cases.json");
    return x;
  }();
  return f;
}

at::Tensor image(const std::string& name) { return fixture().tensors.at("image/" + name); }

int64_t max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kLong) - b.to(at::kLong)).abs().max().item<int64_t>();
}

TEST(PilResize, EqualsPillowByteForByte) {
  XF_REQUIRE_FIXTURE(dir() / "fixture.safetensors");
  const auto& cases = fixture().cases["resize"];
  ASSERT_GE(cases.size(), 50u);
  int exact = 0;
  for (const auto& c : cases) {
    const std::string key = c["key"];
    const at::Tensor& ref = fixture().tensors.at(key);
    const auto filter = pil_filter_from_int(c["resample"].get<int64_t>(), key);
    auto got = pil_resize(image(c["image"]), c["width"], c["height"], filter);
    const std::string what =
        key + " " + c["image"].get<std::string>() + " -> " + std::to_string(c["width"].get<int>()) +
        "x" + std::to_string(c["height"].get<int>()) + " " + c["filter"].get<std::string>();
    ASSERT_EQ(got.sizes(), ref.sizes()) << what;
    ASSERT_EQ(got.scalar_type(), at::kByte) << what;
    const int64_t diff = max_abs_diff(got, ref);
    EXPECT_EQ(diff, 0) << what << ": " << at::ne(got, ref).sum().item<int64_t>() << " bytes differ";
    exact += diff == 0;
  }
  std::printf("  pil_resize: %d / %zu cases byte-exact (max abs diff 0)\n", exact, cases.size());
}

TEST(PilResize, SameSizeIsACopyAndChecksInputs) {
  auto im = image("rgb_37x53");
  auto same = pil_resize(im, 53, 37, PilFilter::kLanczos);
  EXPECT_TRUE(at::equal(same, im));
  EXPECT_NE(same.data_ptr(), im.data_ptr());
  expect_error_containing([&] { pil_resize(im.to(at::kFloat), 10, 10, PilFilter::kBicubic); },
                          {"pil_resize", "uint8 [H, W, C]", "Float"});
  expect_error_containing(
      [&] {
        pil_resize(at::zeros({5, 5, 2}, im.options()), 10, 10, PilFilter::kBicubic);
      },
      {"pil_resize", "C = 1, 3 or 4", "[5, 5, 2]"});
  expect_error_containing([&] { pil_resize(im, 0, 10, PilFilter::kBicubic); },
                          {"height and width must be > 0"});
  expect_error_containing([&] { pil_filter_from_int(7, "cfg.json \"resample\""); },
                          {"cfg.json \"resample\"", "unsupported PIL resample filter 7"});
}

TEST(CenterCrop, EqualsTransformers) {
  XF_REQUIRE_FIXTURE(dir() / "fixture.safetensors");
  const auto& cases = fixture().cases["crop"];
  ASSERT_GE(cases.size(), 4u);
  for (const auto& c : cases) {
    const std::string key = c["key"];
    const at::Tensor& ref = fixture().tensors.at(key);
    auto got = center_crop(image(c["image"]), c["crop_height"], c["crop_width"]);
    ASSERT_EQ(got.sizes(), ref.sizes()) << key;
    EXPECT_EQ(max_abs_diff(got, ref), 0) << key;
  }
  // Any dtype; a bad rank is an error.
  auto f = image("rgb_37x53").to(at::kFloat);
  EXPECT_TRUE(
      at::equal(center_crop(f, 20, 31), center_crop(image("rgb_37x53"), 20, 31).to(at::kFloat)));
  expect_error_containing([&] { center_crop(f[0], 3, 3); }, {"center_crop", "[H, W, C]"});
}

TEST(ClipImageProcessor, ReadsConfigs) {
  XF_REQUIRE_FIXTURE(dir() / "clip_tiny" / "preprocessor_config.json");
  auto c = ClipImageProcessorConfig::from_file(
      (dir() / "clip_tiny" / "preprocessor_config.json").string());
  EXPECT_EQ(c.shortest_edge, 24);
  EXPECT_EQ(c.crop_height, 24);
  EXPECT_EQ(c.crop_width, 24);
  EXPECT_EQ(c.resample, PilFilter::kBicubic);
  EXPECT_DOUBLE_EQ(c.image_mean[0], 0.48145466);
  // transformers' int(s * long / short): 24 * 41 / 30 = 32.8 -> 32 (portrait: long side is H).
  EXPECT_EQ(clip_resize_output_size(c, 41, 30), (std::pair<int64_t, int64_t>{32, 24}));
  EXPECT_EQ(clip_resize_output_size(c, 27, 50), (std::pair<int64_t, int64_t>{24, 44}));
  auto hw = ClipImageProcessorConfig::from_file(
      (dir() / "clip_hw_pad" / "preprocessor_config.json").string());
  EXPECT_EQ(hw.shortest_edge, 0);
  EXPECT_EQ(hw.size_height, 20);
  EXPECT_EQ(hw.size_width, 22);
  EXPECT_EQ(hw.resample, PilFilter::kBilinear);

  // Wan2.1-I2V's image_processor/preprocessor_config.json as published.
  auto wan = ClipImageProcessorConfig::from_json(
      nlohmann::json::parse(R"({"crop_size": {"height": 224, "width": 224}, "do_center_crop": true,
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 224}})"),
      "wan/preprocessor_config.json");
  EXPECT_EQ(wan.shortest_edge, 224);
  EXPECT_EQ(clip_resize_output_size(wan, 480, 832), (std::pair<int64_t, int64_t>{224, 388}));

  expect_error_containing(
      [] {
        ClipImageProcessorConfig::from_json(nlohmann::json::parse(R"({"size": {"longest": 3}})"),
                                            "p.json");
      },
      {"p.json", "shortest_edge"});
  expect_error_containing(
      [] {
        ClipImageProcessorConfig::from_json(
            nlohmann::json::parse(R"({"image_processor_type": "BlipImageProcessor"})"), "p.json");
      },
      {"p.json", "BlipImageProcessor"});
  expect_error_containing(
      [] {
        ClipImageProcessorConfig::from_json(nlohmann::json::parse(R"({"image_mean": [0.5, 0.5]})"),
                                            "p.json");
      },
      {"p.json", "image_mean"});
}

TEST(ClipImageProcessor, EqualsTransformers) {
  XF_REQUIRE_FIXTURE(dir() / "fixture.safetensors");
  const auto& cases = fixture().cases["processor"];
  ASSERT_GE(cases.size(), 4u);
  for (const auto& c : cases) {
    const std::string key = c["key"];
    const at::Tensor& ref = fixture().tensors.at(key);
    auto config = ClipImageProcessorConfig::from_file(
        (dir() / c["processor"].get<std::string>() / "preprocessor_config.json").string());
    std::vector<at::Tensor> images;
    for (const auto& name : c["images"]) images.push_back(image(name));
    auto got = xfuser::models::image::ClipImageProcessor(config).preprocess(images);
    ASSERT_EQ(got.sizes(), ref.sizes()) << key;
    ASSERT_EQ(got.scalar_type(), at::kFloat) << key;
    const double diff = (got.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    std::printf("  %s (%s, %zu images): max abs diff %.3g\n", key.c_str(),
                c["processor"].get<std::string>().c_str(), images.size(), diff);
    EXPECT_LE(diff, 1e-6) << key;
  }
}

TEST(ClipImageProcessor, RejectsBadImages) {
  ClipImageProcessorConfig c;
  expect_error_containing([&] { preprocess(c, {}); }, {"no images"});
  expect_error_containing([&] { preprocess(c, {image("rgba_19x23")}); },
                          {"images[0]", "uint8 [H, W, 3]", "[19, 23, 4]"});
  expect_error_containing([&] { preprocess(c, {image("rgb_37x53").to(at::kFloat)}); },
                          {"images[0]", "Float"});
  c.do_center_crop = false;
  expect_error_containing(
      [&] {
        preprocess(c, {image("portrait_41x30"), image("landscape_27x50")});
      },
      {"images[1]", "same size"});
}

}  // namespace
