// AutoencoderKLFlux2 against diffusers 0.36.0 (fixture flux2-vae-tiny-s1: encode of two 16x32
// images, decode of z [1, 8, 4, 4], the pipeline's bn normalisation of the patchified mode) and
// its own invariants: patchify round trip, bn (de)normalisation inverse, config defaults and
// errors, missing / misshapen weights named, input errors.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux2/flux2_vae.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::ComponentRegistry;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::flux2::AutoencoderKLFlux2;
using xfuser::models::flux2::AutoencoderKLFlux2Config;
using xfuser::testing::expect_error_containing;
using xfuser::testing::max_rel_error;

fs::path case_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / "flux2-vae-tiny-s1";
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto known = ComponentRegistry::known_classes();
    if (std::find(known.begin(), known.end(), "AutoencoderKLFlux2") == known.end()) {
      xfuser::models::flux2::register_flux2_vae_components();
    }
  });
}

// diffusers 0.42.1: a decoder narrower than the encoder (decoder_block_out_channels [2, 2, 4, 4]
// under block_out_channels [4, 4, 8, 8]).
fs::path narrow_decoder_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.42.1" / "flux2-vae-narrow-decoder-s1";
}

std::shared_ptr<AutoencoderKLFlux2> load_fixture(const fs::path& dir = case_dir()) {
  ensure_registered();
  auto component = xfuser::models::load_component(dir.string(), at::kFloat);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLFlux2>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLFlux2";
  return vae;
}

at::Tensor fixture_tensor(const std::string& file, const std::string& name) {
  SafetensorsFile f((case_dir() / file).string());
  return f.get(name).clone();
}

class Flux2Vae : public ::testing::Test {
 protected:
  c10::InferenceMode guard_;
};

TEST_F(Flux2Vae, EncodeEqualsDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  at::Tensor x = fixture_tensor("inputs.safetensors", "sample");
  TensorMap out = vae->call("encode", {{"sample", x}});
  const double mean_err = max_rel_error(out.at("latent_dist_mean"),
                                        fixture_tensor("output.safetensors", "latent_dist_mean"));
  const double std_err = max_rel_error(out.at("latent_dist_std"),
                                       fixture_tensor("output.safetensors", "latent_dist_std"));
  std::printf("[flux2 vae] encode: mean rel %.2e, std rel %.2e\n", mean_err, std_err);
  EXPECT_LE(mean_err, 1e-4);
  EXPECT_LE(std_err, 1e-4);
  EXPECT_TRUE(out.at("sample").equal(out.at("latent_dist_mean")));
  auto post = vae->encode(x);
  EXPECT_LE(max_rel_error(post.logvar, fixture_tensor("output.safetensors", "latent_dist_logvar")),
            1e-4);
}

TEST_F(Flux2Vae, DecodeEqualsDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  TensorMap out = vae->call("decode", {{"z", fixture_tensor("inputs.safetensors", "z")}});
  at::Tensor want = fixture_tensor("output.safetensors", "decode_sample");
  ASSERT_EQ(out.at("sample").sizes(), want.sizes());
  const double err = max_rel_error(out.at("sample"), want);
  std::printf("[flux2 vae] decode: rel %.2e\n", err);
  EXPECT_LE(err, 1e-4);
}

TEST_F(Flux2Vae, NarrowDecoderEqualsDiffusers042) {
  const fs::path dir = narrow_decoder_dir();
  XF_REQUIRE_FIXTURE(dir);
  auto vae = load_fixture(dir);
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->config().decoder_block_out_channels, (std::vector<int64_t>{2, 2, 4, 4}));
  auto tensor = [&](const std::string& file, const std::string& name) {
    return SafetensorsFile((dir / file).string()).get(name).clone();
  };
  TensorMap enc = vae->call("encode", {{"sample", tensor("inputs.safetensors", "sample")}});
  const double enc_err =
      max_rel_error(enc.at("latent_dist_mean"), tensor("output.safetensors", "latent_dist_mean"));
  TensorMap dec = vae->call("decode", {{"z", tensor("inputs.safetensors", "z")}});
  const at::Tensor want = tensor("output.safetensors", "decode_sample");
  ASSERT_EQ(dec.at("sample").sizes(), want.sizes());
  const double dec_err = max_rel_error(dec.at("sample"), want);
  std::printf("[flux2 vae, narrow decoder] encode rel %.2e, decode rel %.2e\n", enc_err, dec_err);
  EXPECT_LE(enc_err, 1e-4);
  EXPECT_LE(dec_err, 1e-4);
  // A decoder list of the wrong length names the key.
  auto config = xfuser::testing::read_json(dir / "config.json");
  config["decoder_block_out_channels"] = {2, 2, 4};
  expect_error_containing(
      [&] { AutoencoderKLFlux2Config::from_json(config, "/m/vae/config.json"); },
      {"/m/vae/config.json", "decoder_block_out_channels", "3 entries"});
  config["decoder_block_out_channels"] = {2, 2, 4, 3};
  expect_error_containing(
      [&] { AutoencoderKLFlux2Config::from_json(config, "/m/vae/config.json"); },
      {"decoder_block_out_channels", "norm_num_groups"});
}

// enable_tiling() with the fixture's sample_size 32: 32-pixel / 4-latent tiles, overlap 0.25.
TEST_F(Flux2Vae, TiledEncodeAndDecodeEqualDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  vae->enable_tiling();
  EXPECT_EQ(vae->tile_sample_min_size(), 32);
  EXPECT_EQ(vae->tile_latent_min_size(), 4);
  at::Tensor mean = vae->encode(fixture_tensor("inputs.safetensors", "tiled_sample")).mean;
  at::Tensor dec = vae->decode(fixture_tensor("inputs.safetensors", "tiled_z"));
  at::Tensor want_mean = fixture_tensor("output.safetensors", "tiled_latent_dist_mean");
  at::Tensor want_dec = fixture_tensor("output.safetensors", "tiled_decode_sample");
  ASSERT_EQ(mean.sizes(), want_mean.sizes());
  ASSERT_EQ(dec.sizes(), want_dec.sizes());
  const double enc_err = max_rel_error(mean, want_mean);
  const double dec_err = max_rel_error(dec, want_dec);
  std::printf("[flux2 vae] tiled: encode rel %.2e, decode rel %.2e\n", enc_err, dec_err);
  EXPECT_LE(enc_err, 1e-4);
  EXPECT_LE(dec_err, 1e-4);
  // Tiling really changed the result (the tiles see different contexts).
  vae->enable_tiling(false);
  EXPECT_GT(max_rel_error(vae->decode(fixture_tensor("inputs.safetensors", "tiled_z")), want_dec),
            1e-3);
}

TEST_F(Flux2Vae, BnNormalisationOfPatchifiedModeEqualsPipeline) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  // The fixture's statistics are perturbed: not BatchNorm's defaults 0 / 1.
  EXPECT_GT(vae->bn_running_mean().abs().max().item<double>(), 0.01);
  EXPECT_GT((vae->bn_running_var() - 1).abs().max().item<double>(), 0.01);
  EXPECT_EQ(vae->bn_running_mean().size(0), 32);
  EXPECT_DOUBLE_EQ(vae->bn_eps(), 1e-4);
  at::Tensor mode = vae->encode(fixture_tensor("inputs.safetensors", "sample")).mode();
  at::Tensor got = vae->normalize_latents(vae->patchify(mode));
  at::Tensor want = fixture_tensor("output.safetensors", "bn_normalized");
  ASSERT_EQ(got.sizes(), want.sizes());
  const double err = max_rel_error(got, want);
  std::printf("[flux2 vae] bn-normalised patchified mode: rel %.2e\n", err);
  EXPECT_LE(err, 1e-4);
  // The pipeline's way back: denormalize, unpatchify -> the mode again.
  EXPECT_LE(max_rel_error(vae->unpatchify(vae->denormalize_latents(got)), mode), 1e-5);
}

TEST_F(Flux2Vae, PatchifyMatchesThePipelineLayout) {
  AutoencoderKLFlux2 vae(
      AutoencoderKLFlux2Config::from_json({{"latent_channels", 2},
                                           {"block_out_channels", {4}},
                                           {"down_block_types", {"DownEncoderBlock2D"}},
                                           {"up_block_types", {"UpDecoderBlock2D"}},
                                           {"norm_num_groups", 2}},
                                          "test"));
  at::Tensor x = at::arange(2 * 4 * 6, at::kFloat).view({1, 2, 4, 6});
  at::Tensor p = vae.patchify(x);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{1, 8, 2, 3}));
  // Channel c*4 + dy*2 + dx at (i, j) holds x[c, 2i + dy, 2j + dx].
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t dy = 0; dy < 2; ++dy)
      for (int64_t dx = 0; dx < 2; ++dx)
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 3; ++j)
            EXPECT_EQ(p[0][c * 4 + dy * 2 + dx][i][j].item<float>(),
                      x[0][c][2 * i + dy][2 * j + dx].item<float>());
  EXPECT_TRUE(vae.unpatchify(p).equal(x));
  expect_error_containing(
      [&] {
        vae.patchify(at::zeros({1, 2, 3, 6}));
      },
      {"patchify", "[1, 2, 3, 6]", "divisible by 2"});
  expect_error_containing([&] { vae.unpatchify(x); }, {"unpatchify", "expected [B, 8, h, w]"});
  expect_error_containing([&] { vae.bn_running_mean(); }, {"bn.running_mean", "before load"});
}

TEST_F(Flux2Vae, ConfigDefaultsAreDiffusers) {
  auto c = AutoencoderKLFlux2Config::from_json(nlohmann::json::object(), "config.json");
  EXPECT_EQ(c.kl.latent_channels, 32);
  EXPECT_EQ(c.kl.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.kl.layers_per_block, 2);
  EXPECT_EQ(c.kl.norm_num_groups, 32);
  EXPECT_EQ(c.kl.sample_size, 1024);
  EXPECT_TRUE(c.kl.use_quant_conv);
  EXPECT_TRUE(c.kl.use_post_quant_conv);
  EXPECT_DOUBLE_EQ(c.batch_norm_eps, 1e-4);
  EXPECT_EQ(c.patch_size, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.bn_channels(), 128);
}

TEST_F(Flux2Vae, ConfigErrorsNameTheFileAndKey) {
  expect_error_containing(
      [] {
        AutoencoderKLFlux2Config::from_json({{"patch_size", {2}}}, "/m/vae/config.json");
      },
      {"/m/vae/config.json", "patch_size"});
  expect_error_containing(
      [] {
        AutoencoderKLFlux2Config::from_json({{"batch_norm_eps", "x"}}, "/m/vae/config.json");
      },
      {"/m/vae/config.json", "batch_norm_eps"});
  expect_error_containing(
      [] {
        AutoencoderKLFlux2Config::from_json({{"latent_channels", "x"}}, "/m/vae/config.json");
      },
      {"/m/vae/config.json", "latent_channels"});
  expect_error_containing(
      [] { AutoencoderKLFlux2Config::from_json(nlohmann::json::array(), "/m/vae/config.json"); },
      {"/m/vae/config.json", "not a JSON object"});
}

// A copy of the fixture folder whose weights lack or reshape one tensor: the error names it.
TEST_F(Flux2Vae, WeightErrorsNameTheTensor) {
  XF_REQUIRE_FIXTURE(case_dir());
  ensure_registered();
  const fs::path dir = fs::temp_directory_path() / ("xf_flux2_vae_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(case_dir() / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  SafetensorsFile f((case_dir() / "diffusion_pytorch_model.safetensors").string());
  auto write_without = [&](const std::string& drop, const std::string& reshape) {
    std::map<std::string, at::Tensor> tensors;
    for (const auto& name : f.names()) {
      if (name == drop) continue;
      at::Tensor t = f.get(name).clone();
      if (name == reshape) t = at::zeros({t.numel() + 1}, t.options());
      tensors[name] = t;
    }
    xfuser::models::save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(),
                                     tensors);
  };
  write_without("bn.running_var", "");
  expect_error_containing([&] { xfuser::models::load_component(dir.string(), at::kFloat); },
                          {"bn.running_var"});
  write_without("", "bn.running_mean");
  expect_error_containing([&] { xfuser::models::load_component(dir.string(), at::kFloat); },
                          {"bn.running_mean", "33"});
  fs::remove_all(dir);
}

TEST_F(Flux2Vae, InputErrors) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->class_name(), "AutoencoderKLFlux2");
  expect_error_containing(
      [&] {
        vae->call("decode", {{"z", at::zeros({1, 4, 2, 2})}});
      },
      {"decode", "'z'", "[1, 4, 2, 2]"});
  expect_error_containing(
      [&] {
        vae->call("encode", {{"x", at::zeros({1, 3, 8, 8})}});
      },
      {"encode", "unknown input 'x'"});
  expect_error_containing([&] { vae->call("upsample", {}); }, {"no method 'upsample'"});
}

}  // namespace
