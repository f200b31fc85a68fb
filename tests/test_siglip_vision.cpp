// SiglipVisionModel (with and without the attention-pooling head) and SiglipImageProcessor
// against transformers v4.44.2 fixtures (tests/fixtures/transformers-v4.44.2/siglip_*), plus
// config and input checks.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/image/clip_image_processor.h"
#include "models/image/siglip_vision.h"
#include "models/weights/component_folder.h"
#include "tests/test_util.h"

namespace {
using xfuser::models::Component;
using xfuser::models::TensorMap;
using xfuser::models::image::ClipImageProcessorConfig;
using xfuser::models::image::SiglipVisionConfig;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

std::filesystem::path case_dir(const std::string& name) {
  return fixtures_dir() / "transformers-v4.44.2" / name;
}

std::shared_ptr<Component> load_case(const std::string& name, c10::ScalarType dtype) {
  xfuser::models::register_builtin_components();
  return xfuser::models::load_component(case_dir(name).string(), dtype);
}

// Every output the case lists, vs transformers' fp32 and f64 outputs.
void check_case(const std::string& name, c10::ScalarType dtype, double tol) {
  XF_REQUIRE_FIXTURE(case_dir(name) / "config.json");
  auto model = load_case(name, dtype);
  EXPECT_EQ(model->class_name(), "SiglipVisionModel");
  TensorMap inputs;
  for (auto& [k, v] : read_tensors(case_dir(name) / "inputs.safetensors")) inputs[k] = v;
  auto out = model->call("forward", inputs);
  auto ref = read_tensors(case_dir(name) / "output.safetensors");
  auto spec = read_json(case_dir(name) / "inputs.json")["outputs"];
  EXPECT_EQ(out.size(), spec.size()) << name << ": number of outputs";
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    const std::string key = it.key();
    ASSERT_TRUE(out.count(key)) << name << ": missing output " << key;
    const auto& got = out.at(key);
    ASSERT_EQ(got.sizes(), ref.at(key).sizes()) << name << " " << key;
    EXPECT_EQ(got.scalar_type(), dtype) << name << " " << key;
    const double e32 = max_rel_error(got.to(at::kFloat), ref.at(key));
    const double e64 = max_rel_error(got.to(at::kDouble), ref.at(key + "_f64"));
    std::printf("  %-30s %-26s %-9s rel err vs f32 %.3e, vs f64 %.3e\n", name.c_str(), key.c_str(),
                c10::toString(dtype), e32, e64);
    EXPECT_LT(e32, tol) << name << " " << key;
    EXPECT_LT(e64, tol) << name << " " << key;
  }
}

TEST(SiglipVision, EqualsTransformersFp32) {
  check_case("siglip_vision-tiny-s1", at::kFloat, 1e-4);
  check_case("siglip_vision_nohead-tiny-s1", at::kFloat, 1e-4);
}

TEST(SiglipVision, Bf16IsClose) { check_case("siglip_vision-tiny-s1", at::kBFloat16, 5e-2); }

TEST(SiglipVision, ConfigAndInputErrorsAreNamed) {
  XF_REQUIRE_FIXTURE(case_dir("siglip_vision-tiny-s1") / "config.json");
  expect_error_containing(
      [] {
        SiglipVisionConfig::from_json(
            nlohmann::json::parse(R"({"hidden_size": 30, "num_attention_heads": 4})"), "c.json");
      },
      {"c.json", "num_attention_heads"});
  expect_error_containing(
      [] {
        SiglipVisionConfig::from_json(nlohmann::json::parse(R"({"hidden_act": "tanh"})"), "c.json");
      },
      {"c.json", "hidden_act", "tanh"});
  auto model = load_case("siglip_vision-tiny-s1", at::kFloat);
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({1, 3, 30, 32})}});
      },
      {"pixel_values", "[B, 3, 32, 32]"});
  expect_error_containing([&] { model->call("forward", {}); }, {"pixel_values"});
}

TEST(SiglipImageProcessor, EqualsTransformers) {
  const auto dir = case_dir("siglip_processor-s1");
  XF_REQUIRE_FIXTURE(dir / "fixture.safetensors");
  const auto config =
      ClipImageProcessorConfig::from_file((dir / "preprocessor_config.json").string());
  EXPECT_FALSE(config.do_center_crop);
  EXPECT_EQ(config.size_height, 24);
  EXPECT_EQ(config.size_width, 20);
  const auto tensors = read_tensors(dir / "fixture.safetensors");
  std::vector<at::Tensor> images;
  const auto case_json = read_json(dir / "case.json");
  for (const auto& name : case_json["images"]) {
    images.push_back(tensors.at("image/" + name.get<std::string>()));
  }
  const at::Tensor got = xfuser::models::image::ClipImageProcessor(config).preprocess(images);
  const at::Tensor& want = tensors.at("pixel_values");
  ASSERT_EQ(got.sizes(), want.sizes());
  const double diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  std::printf("  SiglipImageProcessor (%zu images): max abs diff %.3g\n", images.size(), diff);
  EXPECT_LE(diff, 1e-6);
  // SiglipImageProcessor's defaults: 224 x 224, mean / std 0.5, no crop.
  const auto defaults = ClipImageProcessorConfig::from_json(
      nlohmann::json::parse(R"({"image_processor_type": "SiglipImageProcessor",
                                "crop_size": {"height": 7, "width": 7}})"),
      "p.json");
  EXPECT_EQ(defaults.size_height, 224);
  EXPECT_EQ(defaults.size_width, 224);
  EXPECT_FALSE(defaults.do_center_crop);
  EXPECT_EQ(defaults.image_mean, (std::vector<double>{0.5, 0.5, 0.5}));
}

}  // namespace
