// `xfuser forward` end to end: the built binary on the diffusers FLUX fixture (fp32, bf16), on a
// random guidance-embedding model folder written by the test, and its error exits.
#include <fstream>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/flux/flux_transformer.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::read_tensors;

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::save_safetensors;
using xfuser::models::TensorMap;
using xfuser::testing::binary_dir;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

fs::path fixture_case() { return fixtures_dir() / "diffusers-v0.33.1" / "flux-tiny-s1"; }
fs::path xfuser_bin() { return binary_dir() / "bin" / "xfuser"; }

std::string quote(const fs::path& p) { return "'" + p.string() + "'"; }

int run_forward(const fs::path& model, const fs::path& inputs, const fs::path& output,
                const std::string& extra, std::string* log) {
  std::string cmd = quote(xfuser_bin()) + " forward --model-dir " + quote(model) + " --inputs " +
                    quote(inputs) + " --output " + quote(output) + " " + extra;
  return run_command(cmd, log);
}

class ForwardTool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(xfuser_bin())) GTEST_SKIP() << "xfuser binary not built: " << xfuser_bin();
  }
  c10::InferenceMode guard_;
};

TEST_F(ForwardTool, FixtureFloat32AndBfloat16) {
  XF_REQUIRE_FIXTURE(fixture_case());
  TempDir tmp("xfuser-forward");
  auto expected = read_tensors(fixture_case() / "output.safetensors").at("sample");
  for (const std::string dtype : {"fp32", "bf16"}) {
    std::string log;
    auto out_path = tmp / ("out-" + dtype + ".safetensors");
    int rc = run_forward(fixture_case(), fixture_case() / "inputs.safetensors", out_path,
                         "--dtype " + dtype, &log);
    ASSERT_EQ(rc, 0) << log;
    auto out = read_tensors(out_path);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out.count("sample")) << log;
    EXPECT_EQ(out["sample"].scalar_type(), at::kFloat);
    ASSERT_EQ(out["sample"].sizes(), expected.sizes());
    const double err = max_rel_error(out["sample"], expected);
    std::cout << "[ xfuser forward " << dtype << " ] max|out - sample|/max|sample| = " << err
              << std::endl;
    EXPECT_LE(err, dtype == "fp32" ? 1e-4 : 2e-2);
  }
}

TEST_F(ForwardTool, RandomGuidanceModelFolderMatchesTheApi) {
  TempDir tmp("xfuser-forward");
  xfuser::models::flux::FluxConfig cfg;
  cfg.in_channels = 8;
  cfg.num_layers = 2;
  cfg.num_single_layers = 2;
  cfg.attention_head_dim = 16;
  cfg.num_attention_heads = 2;
  cfg.joint_attention_dim = 24;
  cfg.pooled_projection_dim = 12;
  cfg.guidance_embeds = true;
  cfg.axes_dims_rope = {4, 4, 8};
  auto model = std::make_shared<xfuser::models::flux::FluxTransformer2DModel>(cfg);
  model->init_random(5, 0.2);
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, slot] : model->named_parameters()) state[name] = slot->tensor;
  auto dir = tmp / "transformer";
  fs::create_directories(dir);
  save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), state);
  nlohmann::json config = {{"_class_name", "FluxTransformer2DModel"},
                           {"in_channels", 8},
                           {"num_layers", 2},
                           {"num_single_layers", 2},
                           {"attention_head_dim", 16},
                           {"num_attention_heads", 2},
                           {"joint_attention_dim", 24},
                           {"pooled_projection_dim", 12},
                           {"guidance_embeds", true},
                           {"axes_dims_rope", {4, 4, 8}},
                           {"out_channels", nullptr}};
  std::ofstream(dir / "config.json") << config.dump(2);

  at::manual_seed(6);
  TensorMap in = {{"hidden_states", at::randn({2, 6, 8})},
                  {"encoder_hidden_states", at::randn({2, 4, 24})},
                  {"pooled_projections", at::randn({2, 12})},
                  {"timestep", at::rand({2})},
                  {"guidance", at::full({2}, 3.5)},
                  {"img_ids", at::randn({6, 3})},
                  {"txt_ids", at::zeros({4, 3})}};
  save_safetensors((tmp / "in.safetensors").string(), in);
  std::string log;
  ASSERT_EQ(run_forward(dir, tmp / "in.safetensors", tmp / "out.safetensors", "", &log), 0) << log;
  auto want = model->call("forward", in).at("sample");
  auto got = read_tensors(tmp / "out.safetensors").at("sample");
  EXPECT_LE(max_rel_error(got, want), 1e-6);

  // Missing guidance on a guidance model: exit 1 naming it.
  in.erase("guidance");
  save_safetensors((tmp / "in-noguide.safetensors").string(), in);
  EXPECT_EQ(run_forward(dir, tmp / "in-noguide.safetensors", tmp / "o.safetensors", "", &log), 1);
  EXPECT_NE(log.find("guidance"), std::string::npos) << log;
}

TEST_F(ForwardTool, ErrorsExitOneWithAClearMessage) {
  XF_REQUIRE_FIXTURE(fixture_case());
  TempDir tmp("xfuser-forward");
  auto inputs = read_tensors(fixture_case() / "inputs.safetensors");
  auto out = tmp / "out.safetensors";
  std::string log;

  auto extra = inputs;
  extra["return_dict"] = at::zeros({1});
  save_safetensors((tmp / "extra.safetensors").string(), extra);
  EXPECT_EQ(run_forward(fixture_case(), tmp / "extra.safetensors", out, "", &log), 1);
  EXPECT_NE(log.find("unknown input(s) return_dict"), std::string::npos) << log;
  EXPECT_NE(log.find("pooled_projections"), std::string::npos) << log;

  auto missing = inputs;
  missing.erase("timestep");
  save_safetensors((tmp / "missing.safetensors").string(), missing);
  EXPECT_EQ(run_forward(fixture_case(), tmp / "missing.safetensors", out, "", &log), 1);
  EXPECT_NE(log.find("missing required input 'timestep'"), std::string::npos) << log;

  auto wrong = inputs;
  wrong["hidden_states"] = at::randn({1, 16, 5});
  save_safetensors((tmp / "wrong.safetensors").string(), wrong);
  EXPECT_EQ(run_forward(fixture_case(), tmp / "wrong.safetensors", out, "", &log), 1);
  EXPECT_NE(log.find("hidden_states must be [B, N, 4]"), std::string::npos) << log;

  EXPECT_EQ(run_forward(fixture_case(), fixture_case() / "inputs.safetensors", out,
                        "--method decode", &log),
            1);
  EXPECT_NE(log.find("decode"), std::string::npos) << log;
  EXPECT_NE(log.find("forward"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out));

  EXPECT_NE(
      run_forward(fixture_case(), fixture_case() / "inputs.safetensors", out, "--dtype fp64", &log),
      0);
  EXPECT_EQ(run_forward(tmp / "nowhere", fixture_case() / "inputs.safetensors", out, "", &log), 1);
  EXPECT_NE(log.find("nowhere"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
