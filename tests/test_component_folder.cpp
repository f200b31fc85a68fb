// Component folders (config.json + weights), typed config readers and the component registry.
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using xfuser::models::cfg;
using xfuser::models::cfg_required;
using xfuser::models::Component;
using xfuser::models::ComponentRegistry;
using xfuser::models::load_component;
using xfuser::models::open_component_folder;
using xfuser::models::save_safetensors;
using xfuser::models::TensorMap;
using xfuser::testing::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an xfuser::Error";
  return "";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A tiny component: y = x W^T + b under diffusers-style names.
class TestLinear : public Component {
 public:
  TestLinear(int64_t in, int64_t out) {
    weight_ = &param("proj.weight", {out, in});
    bias_ = &param("proj.bias", {out});
  }
  std::string class_name() const override { return "XfTestLinear"; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override {
    XF_CHECK(method == "forward", "XfTestLinear has no method '", method, "'");
    auto it = inputs.find("x");
    XF_CHECK(it != inputs.end(), "XfTestLinear.forward needs input 'x'");
    return {{"sample", at::linear(it->second, weight_->tensor, bias_->tensor)}};
  }

 private:
  xfuser::models::ParamSlot* weight_;
  xfuser::models::ParamSlot* bias_;
};

void register_test_classes() {
  static std::once_flag once;
  std::call_once(once, [] {
    ComponentRegistry::add("XfTestLinear", [](const json& config, const std::string& path) {
      return std::make_shared<TestLinear>(cfg<int64_t>(config, "in_features", 3, path),
                                          cfg_required<int64_t>(config, "out_features", path));
    });
  });
}

// A diffusers-style folder holding an XfTestLinear (in 3, out 2).
struct LinearFolder {
  LinearFolder() {
    at::manual_seed(11);
    weight = at::randn({2, 3});
    bias = at::randn({2});
    write_text(dir / "config.json",
               R"({"_class_name": "XfTestLinear", "_diffusers_version": "0.33.1",)"
               R"( "in_features": 3, "out_features": 2})");
    save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(),
                     {{"proj.weight", weight}, {"proj.bias", bias}}, {{"format", "pt"}});
  }
  std::string path() const { return dir.path().string(); }
  std::string config_path() const { return (dir / "config.json").string(); }
  TempDir dir;
  at::Tensor weight, bias;
};

// ---- registry ----------------------------------------------------------------------------------

TEST(ComponentRegistry, UnknownClassListsTheKnownOnes) {
  register_test_classes();
  EXPECT_THAT(
      error_of([] { ComponentRegistry::create("NoSuchModel", json::object(), "x/c.json"); }),
      HasSubstr("unknown component class 'NoSuchModel' (from x/c.json); known: "));
  const auto known = ComponentRegistry::known_classes();
  EXPECT_NE(std::find(known.begin(), known.end(), "XfTestLinear"), known.end());
  EXPECT_THAT(error_of([] { ComponentRegistry::create("NoSuchModel", json::object(), "x"); }),
              HasSubstr("XfTestLinear"));
}

TEST(ComponentRegistry, CreatesFromConfigAndRejectsDuplicates) {
  register_test_classes();
  auto c = ComponentRegistry::create("XfTestLinear", {{"in_features", 5}, {"out_features", 4}},
                                     "cfg.json");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->class_name(), "XfTestLinear");
  EXPECT_EQ(c->num_parameters(), 4 * 5 + 4);
  EXPECT_THAT(error_of([] { ComponentRegistry::add("XfTestLinear", nullptr); }),
              HasSubstr("registered without a factory"));
  EXPECT_THAT(error_of([] {
                ComponentRegistry::add("XfTestLinear", [](const json&, const std::string&) {
                  return std::shared_ptr<Component>();
                });
              }),
              HasSubstr("component class 'XfTestLinear' is registered twice"));
  // The factory's own config errors name the file and key.
  EXPECT_THAT(error_of([] { ComponentRegistry::create("XfTestLinear", json::object(), "c.json"); }),
              HasSubstr("c.json: required config key 'out_features' is missing"));
}

// ---- folders -----------------------------------------------------------------------------------

TEST(ComponentFolder, OpensADiffusersFolder) {
  LinearFolder f;
  auto folder = open_component_folder(f.path());
  EXPECT_EQ(folder.class_name, "XfTestLinear");
  EXPECT_EQ(folder.config_path, f.config_path());
  EXPECT_EQ(folder.config.at("out_features"), 2);
  ASSERT_NE(folder.weights, nullptr);
  EXPECT_EQ(folder.weights->names(), (std::vector<std::string>{"proj.bias", "proj.weight"}));
}

TEST(ComponentFolder, OpensATransformersFolder) {
  TempDir dir;
  write_text(dir / "config.json", R"({"architectures": ["CLIPTextModel"], "hidden_size": 32})");
  save_safetensors((dir / "model.safetensors").string(), {{"w", at::ones({2})}});
  auto folder = open_component_folder(dir.path().string());
  EXPECT_EQ(folder.class_name, "CLIPTextModel");
  EXPECT_TRUE(folder.weights->contains("w"));
}

TEST(ComponentFolder, MissingConfigJson) {
  TempDir dir;
  const auto config = (dir / "config.json").string();
  EXPECT_THAT(error_of([&] { open_component_folder(dir.path().string()); }),
              HasSubstr("missing " + config + " (a component folder needs its config.json)"));
  EXPECT_THAT(error_of([&] { open_component_folder((dir / "nope").string()); }),
              HasSubstr("component folder not found: " + (dir / "nope").string()));
}

TEST(ComponentFolder, BadConfigJson) {
  TempDir dir;
  const auto config = (dir / "config.json").string();
  write_text(config, R"({"_class_name": "X",)");
  EXPECT_THAT(error_of([&] { open_component_folder(dir.path().string()); }),
              HasSubstr(config + ": not valid JSON"));
  write_text(config, R"(["X"])");
  EXPECT_THAT(error_of([&] { open_component_folder(dir.path().string()); }),
              HasSubstr(config + ": config must be a JSON object, got array"));
}

TEST(ComponentFolder, ConfigWithoutClassName) {
  TempDir dir;
  write_text(dir / "config.json", R"({"num_layers": 2})");
  EXPECT_THAT(error_of([&] { open_component_folder(dir.path().string()); }),
              HasSubstr((dir / "config.json").string() + ": no class name"));
  write_text(dir / "config.json", R"({"architectures": []})");
  EXPECT_THAT(error_of([&] { open_component_folder(dir.path().string()); }),
              HasSubstr("\"architectures\" must be a non-empty array of strings, got []"));
}

TEST(ComponentFolder, MissingWeightsListWhatWasLookedFor) {
  TempDir dir;
  write_text(dir / "config.json", R"({"_class_name": "XfTestLinear"})");
  const auto msg = error_of([&] { open_component_folder(dir.path().string()); });
  EXPECT_THAT(msg, HasSubstr("looked for diffusion_pytorch_model.safetensors, "
                             "diffusion_pytorch_model.safetensors.index.json, model.safetensors, "
                             "model.safetensors.index.json"));
  EXPECT_THAT(msg, HasSubstr("while opening component folder " + dir.path().string()));
}

TEST(ComponentFolder, LoadComponentBuildsLoadsAndRuns) {
  register_test_classes();
  LinearFolder f;
  auto c = load_component(f.path(), at::kFloat);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->class_name(), "XfTestLinear");
  const at::Tensor x = at::randn({4, 3});
  const at::Tensor y = c->call("forward", {{"x", x}}).at("sample");
  EXPECT_TRUE(at::allclose(y, at::linear(x, f.weight, f.bias)));

  auto half = load_component(f.path(), at::kBFloat16);
  for (const auto& [name, slot] : half->named_parameters())
    EXPECT_EQ(slot->tensor.scalar_type(), at::kBFloat16) << name;
}

TEST(ComponentFolder, LoadComponentErrors) {
  register_test_classes();
  TempDir dir;
  write_text(dir / "config.json", R"({"_class_name": "FancyNet"})");
  save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {{"w", at::ones({1})}});
  const auto unknown = error_of([&] { load_component(dir.path().string(), at::kFloat); });
  EXPECT_THAT(unknown, HasSubstr("unknown component class 'FancyNet' (from " +
                                 (dir / "config.json").string() + "); known: "));
  EXPECT_THAT(unknown, HasSubstr("XfTestLinear"));

  // Strict loading: a weight file without proj.bias fails naming it.
  write_text(dir / "config.json", R"({"_class_name": "XfTestLinear", "out_features": 2})");
  save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(),
                   {{"proj.weight", at::ones({2, 3})}});
  EXPECT_THAT(error_of([&] { load_component(dir.path().string(), at::kFloat); }),
              HasSubstr("proj.bias"));
  // A wrongly typed config value names the file and key.
  write_text(dir / "config.json", R"({"_class_name": "XfTestLinear", "out_features": "2"})");
  EXPECT_THAT(error_of([&] { load_component(dir.path().string(), at::kFloat); }),
              HasSubstr((dir / "config.json").string() +
                        ": config key 'out_features' must be an integer, got string "
                        "\"2\""));
}

TEST(ComponentFolder, OpensTheFluxFixture) {
  const auto dir = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1/flux-tiny-s1";
  XF_REQUIRE_FIXTURE(dir);
  auto folder = open_component_folder(dir.string());
  EXPECT_EQ(folder.class_name, "FluxTransformer2DModel");
  EXPECT_EQ(cfg<int>(folder.config, "num_layers", 19, folder.config_path), 1);
  EXPECT_EQ(
      cfg<std::vector<int>>(folder.config, "axes_dims_rope", {16, 56, 56}, folder.config_path),
      (std::vector<int>{4, 4, 8}));
  // "out_channels": null takes the default.
  EXPECT_EQ(
      cfg<std::optional<int>>(folder.config, "out_channels", std::nullopt, folder.config_path),
      std::nullopt);
  EXPECT_FALSE(cfg<bool>(folder.config, "guidance_embeds", true, folder.config_path));
  EXPECT_EQ(folder.weights->info("context_embedder.weight").shape, (std::vector<int64_t>{32, 32}));
}

// ---- typed config readers ----------------------------------------------------------------------

TEST(Cfg, MissingOrNullKeysTakeTheDefault) {
  const json j = {{"a", nullptr}, {"n", 3}};
  EXPECT_EQ(cfg<int>(j, "a", 7, "c.json"), 7);
  EXPECT_EQ(cfg<int>(j, "missing", 8, "c.json"), 8);
  EXPECT_EQ(cfg<std::string>(j, "missing", "gelu", "c.json"), "gelu");
  EXPECT_EQ(cfg<int>(j, "n", 0, "c.json"), 3);
  EXPECT_EQ(cfg<double>(j, "n", 0.5, "c.json"), 3.0);
  EXPECT_EQ(cfg<std::optional<double>>(j, "a", 1.5, "c.json"), 1.5);
  EXPECT_EQ(cfg<std::optional<double>>(j, "n", std::nullopt, "c.json"), 3.0);
}

TEST(Cfg, WrongTypesNameFileKeyAndExpectedType) {
  const json j = {{"layers", "two"}, {"eps", "1e-6"},    {"flag", 1}, {"dims", {4, 4.5}},
                  {"frac", 2.5},     {"big", 1ll << 40}, {"neg", -1}, {"act", 3}};
  EXPECT_THAT(error_of([&] { cfg<int>(j, "layers", 1, "t/config.json"); }),
              HasSubstr("t/config.json: config key 'layers' must be an integer, got "
                        "string \"two\""));
  EXPECT_THAT(error_of([&] { cfg<double>(j, "eps", 1e-6, "t/config.json"); }),
              HasSubstr("t/config.json: config key 'eps' must be a number, got string"));
  EXPECT_THAT(error_of([&] { cfg<bool>(j, "flag", false, "t/config.json"); }),
              HasSubstr("config key 'flag' must be a boolean, got number 1"));
  EXPECT_THAT(error_of([&] { cfg<int>(j, "frac", 1, "t/config.json"); }),
              HasSubstr("config key 'frac' must be an integer, got number 2.5"));
  EXPECT_THAT(error_of([&] { cfg<int>(j, "big", 1, "t/config.json"); }),
              HasSubstr("config key 'big' must be an integer from -2147483648 to 2147483647, got "
                        "number 1099511627776"));
  EXPECT_EQ(cfg<int64_t>(j, "big", 1, "t/config.json"), int64_t{1} << 40);
  EXPECT_THAT(error_of([&] { cfg<uint32_t>(j, "neg", 1, "t/config.json"); }),
              HasSubstr("config key 'neg' must be an integer from 0 to 4294967295, got number -1"));
  EXPECT_EQ(cfg<int>(j, "neg", 1, "t/config.json"), -1);
  EXPECT_THAT(error_of([&] { cfg<std::string>(j, "act", "gelu", "t/config.json"); }),
              HasSubstr("config key 'act' must be a string, got number 3"));
  EXPECT_THAT(error_of([&] { cfg<std::vector<int>>(j, "dims", {}, "t/config.json"); }),
              HasSubstr("config key 'dims[1]' must be an integer, got number 4.5"));
  EXPECT_THAT(
      error_of([&] { cfg<std::vector<int>>(j, "layers", {}, "t/config.json"); }),
      HasSubstr("config key 'layers' must be an array (each element an integer), got string"));
}

TEST(Cfg, RequiredKeys) {
  const json j = {{"n", 3}, {"z", nullptr}};
  EXPECT_EQ(cfg_required<int>(j, "n", "c.json"), 3);
  EXPECT_THAT(error_of([&] { cfg_required<int>(j, "m", "c.json"); }),
              HasSubstr("c.json: required config key 'm' is missing"));
  EXPECT_THAT(error_of([&] { cfg_required<int>(j, "z", "c.json"); }),
              HasSubstr("c.json: config key 'z' must be an integer, got null"));
  EXPECT_EQ(cfg_required<std::optional<int>>(j, "z", "c.json"), std::nullopt);
}

}  // namespace
