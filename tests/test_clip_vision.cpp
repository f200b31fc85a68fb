// CLIPVisionModel and CLIPVisionModelWithProjection against transformers v4.44.2 fixtures
// (tests/fixtures/transformers-v4.44.2/clip_vision*-tiny-s1), plus input checks and strict
// loading.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/image/clip_vision.h"
#include "models/weights/component_folder.h"
#include "models/weights/tensor_source.h"
#include "tests/test_util.h"

namespace {
using xfuser::models::Component;
using xfuser::models::TensorMap;
using xfuser::models::image::ClipVisionConfig;
using xfuser::models::image::ClipVisionModel;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

// A case of the transformers 4.44.2 fixtures, or "transformers-vX/name" of another release.
std::filesystem::path case_dir(const std::string& name) {
  if (name.find('/') != std::string::npos) return fixtures_dir() / name;
  return fixtures_dir() / "transformers-v4.44.2" / name;
}

std::shared_ptr<Component> load_case(const std::string& name, c10::ScalarType dtype) {
  xfuser::models::register_builtin_components();
  return xfuser::models::load_component(case_dir(name).string(), dtype);
}

TensorMap case_inputs(const std::string& name) {
  TensorMap inputs;
  for (auto& [k, v] : read_tensors(case_dir(name) / "inputs.safetensors")) inputs[k] = v;
  return inputs;
}

// Every output the case lists, vs transformers' fp32 and f64 outputs.
void check_case(const std::string& name, c10::ScalarType dtype, double tol) {
  XF_REQUIRE_FIXTURE(case_dir(name) / "config.json");
  auto model = load_case(name, dtype);
  auto out = model->call("forward", case_inputs(name));
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
    std::printf("  %-26s %-26s %-9s rel err vs f32 %.3e, vs f64 %.3e\n", name.c_str(), key.c_str(),
                c10::toString(dtype), e32, e64);
    EXPECT_LT(e32, tol) << name << " " << key;
    EXPECT_LT(e64, tol) << name << " " << key;
  }
}

TEST(ClipVision, EqualsTransformersFp32) { check_case("clip_vision-tiny-s1", at::kFloat, 1e-4); }

TEST(ClipVision, WithProjectionEqualsTransformersFp32) {
  check_case("clip_vision_proj-tiny-s1", at::kFloat, 1e-4);
}

// transformers 5.24 saves CLIPVisionModel without the "vision_model." prefix.
TEST(ClipVision, Transformers5FoldersEqualTransformers5Fp32) {
  check_case("transformers-v5.24.0/clip_vision-tiny-s1", at::kFloat, 1e-4);
  check_case("transformers-v5.24.0/clip_vision_proj-tiny-s1", at::kFloat, 1e-4);
}

TEST(ClipVision, Bf16IsClose) { check_case("clip_vision-tiny-s1", at::kBFloat16, 5e-2); }

TEST(ClipVision, ReadsConfig) {
  XF_REQUIRE_FIXTURE(case_dir("clip_vision-tiny-s1") / "config.json");
  const auto path = (case_dir("clip_vision-tiny-s1") / "config.json").string();
  auto c = ClipVisionConfig::from_json(read_json(path), path);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.image_size, 32);
  EXPECT_EQ(c.patch_size, 8);
  EXPECT_EQ(c.num_patches(), 16);
  EXPECT_EQ(c.hidden_act, xfuser::models::text_encoders::HiddenAct::kGelu);
  // A full CLIPConfig: the vision tower's settings come from vision_config.
  auto full =
      ClipVisionConfig::from_json(nlohmann::json::parse(R"({"text_config": {"hidden_size": 8},
                               "vision_config": {"hidden_size": 48, "num_attention_heads": 4,
                                                 "patch_size": 14}})"),
                                  "clip/config.json");
  EXPECT_EQ(full.hidden_size, 48);
  EXPECT_EQ(full.patch_size, 14);
  expect_error_containing(
      [] {
        ClipVisionConfig::from_json(
            nlohmann::json::parse(R"({"hidden_size": 30, "num_attention_heads": 4})"), "v.json");
      },
      {"v.json", "not divisible by num_attention_heads"});
  expect_error_containing(
      [] {
        ClipVisionConfig::from_json(nlohmann::json::parse(R"({"hidden_act": "swiglu"})"), "v.json");
      },
      {"v.json", "hidden_act"});
}

TEST(ClipVision, BadPixelValuesAreErrors) {
  XF_REQUIRE_FIXTURE(case_dir("clip_vision-tiny-s1") / "config.json");
  auto model = load_case("clip_vision-tiny-s1", at::kFloat);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({1, 3, 24, 32}, opts)}});
      },
      {"CLIPVisionModel", "pixel_values", "[B, 3, 32, 32]", "[1, 3, 24, 32]"});
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({3, 32, 32}, opts)}});
      },
      {"pixel_values", "[3, 32, 32]"});
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({1, 4, 32, 32}, opts)}});
      },
      {"pixel_values", "[1, 4, 32, 32]"});
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({1, 3, 32, 32}, at::kLong)}});
      },
      {"pixel_values", "floating-point"});
  expect_error_containing([&] { model->call("forward", {}); }, {"pixel_values"});
  expect_error_containing(
      [&] {
        model->call("forward", {{"pixel_values", at::zeros({1, 3, 32, 32}, opts)},
                                {"input_ids", at::zeros({1, 3}, at::kLong)}});
      },
      {"input_ids"});
}

TEST(ClipVision, BatchRowsAreIndependent) {
  XF_REQUIRE_FIXTURE(case_dir("clip_vision-tiny-s1") / "config.json");
  auto model = load_case("clip_vision-tiny-s1", at::kFloat);
  auto px = case_inputs("clip_vision-tiny-s1").at("pixel_values");  // [2, 3, 32, 32]
  auto both = model->call("forward", {{"pixel_values", px}});
  auto second = model->call("forward", {{"pixel_values", px.narrow(0, 1, 1)}});
  for (const auto& key : {"last_hidden_state", "pooler_output", "hidden_states_penultimate"}) {
    EXPECT_LT(max_rel_error(second.at(key), both.at(key).narrow(0, 1, 1)), 1e-5) << key;
  }
}

TEST(ClipVision, StrictLoadNamesMissingTensors) {
  XF_REQUIRE_FIXTURE(case_dir("clip_vision-tiny-s1") / "model.safetensors");
  auto tensors = read_tensors(case_dir("clip_vision-tiny-s1") / "model.safetensors");
  ASSERT_TRUE(tensors.count("vision_model.pre_layrnorm.weight"));
  ASSERT_TRUE(tensors.count("vision_model.embeddings.class_embedding"));
  tensors.erase("vision_model.embeddings.class_embedding");
  // The legacy position_ids buffer is accepted.
  tensors["vision_model.embeddings.position_ids"] = at::arange(17, at::kLong).view({1, 17});
  xfuser::models::TensorMapSource source(tensors);
  const auto path = (case_dir("clip_vision-tiny-s1") / "config.json").string();
  ClipVisionModel model(ClipVisionConfig::from_json(read_json(path), path), false);
  expect_error_containing([&] { model.load(source, at::kFloat); },
                          {"vision_model.embeddings.class_embedding"});
}

}  // namespace
