// AutoencoderKLHunyuanVideo15 against diffusers 0.36.0 (fixture hunyuan_video15-vae-tiny-s1: 4
// blocks at spatial ratio 8 / temporal 4, so both the space-only and the space-and-time
// resamplers appear; encode of a [1, 3, 5, 16, 24] clip and of one image, decode of an odd
// [1, 4, 2, 3, 3] latent, of one frame and of three, enable_tiling with 32-pixel / 4-latent
// tiles: tiled encode and decode) and its own invariants: slicing, forward = decode(encode mode),
// the registry, bf16, config, tiling and input errors.
#include <unistd.h>

#include <iostream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::TensorMap;
using xfuser::models::hunyuan_video15::AutoencoderKLHunyuanVideo15;
using xfuser::models::hunyuan_video15::HunyuanVideo15VAEConfig;
using xfuser::models::hunyuan_video15::HunyuanVideo15VAETiling;
using xfuser::testing::expect_error_containing;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_tensors;

fs::path case_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / "hunyuan_video15-vae-tiny-s1";
}

std::shared_ptr<AutoencoderKLHunyuanVideo15> load_fixture(c10::ScalarType dtype = at::kFloat) {
  xfuser::models::register_builtin_components();
  xfuser::models::hunyuan_video15::register_hunyuan_video15_vae_components();
  auto component = xfuser::models::load_component(case_dir().string(), dtype);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo15>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLHunyuanVideo15";
  return vae;
}

// The fixture's enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
// tile_latent_min_height=4, tile_latent_min_width=4).
HunyuanVideo15VAETiling fixture_tiles() {
  HunyuanVideo15VAETiling t;
  t.use_tiling = true;
  t.tile_sample_min_height = t.tile_sample_min_width = 32;
  t.tile_latent_min_height = t.tile_latent_min_width = 4;
  return t;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double bound = 1e-4) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = max_rel_error(got, want);
  std::cout << "[hunyuan_video15_vae] " << what << ": max rel error " << err << "\n";
  EXPECT_LT(err, bound) << what;
}

class HunyuanVideo15Vae : public ::testing::Test {
 protected:
  void SetUp() override {
    XF_REQUIRE_FIXTURE(case_dir());
    inputs_ = read_tensors(case_dir() / "inputs.safetensors");
    ref_ = read_tensors(case_dir() / "output.safetensors");
  }
  c10::InferenceMode guard_;
  std::map<std::string, at::Tensor> inputs_, ref_;
};

// ---- fixture parity -------------------------------------------------------------------------

TEST_F(HunyuanVideo15Vae, EncodeEqualsDiffusers) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  auto post = vae->encode(inputs_.at("sample"));
  EXPECT_EQ(post.mean.sizes(), (std::vector<int64_t>{1, 4, 2, 2, 3}));
  expect_close(post.mean, ref_.at("latent_dist_mean"), "encode mean");
  expect_close(post.logvar, ref_.at("latent_dist_logvar"), "encode logvar");
  expect_close(post.std, ref_.at("latent_dist_std"), "encode std");
  TensorMap enc = vae->call("encode", {{"sample", inputs_.at("sample")}});
  EXPECT_TRUE(at::equal(enc.at("latent_dist_mean"), post.mean));
  EXPECT_TRUE(at::equal(enc.at("latent_dist_std"), post.std));
  EXPECT_TRUE(at::equal(enc.at("sample"), post.mean));  // the mode
  // One image (the i2v condition: retrieve_latents(..., "argmax")).
  auto image = vae->encode(inputs_.at("image"));
  expect_close(image.mode(), ref_.at("image_latent_mode"), "encode image mode");
  expect_close(image.std, ref_.at("image_latent_dist_std"), "encode image std");
  // sample() draws around the mean with the posterior's std.
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor draw = post.sample(gen);
  EXPECT_GT((draw - post.mean).abs().max().item<double>(), 1e-3);
  EXPECT_LT(((draw - post.mean) / post.std).abs().max().item<double>(), 6.0);
}

TEST_F(HunyuanVideo15Vae, DecodeEqualsDiffusers) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  TensorMap out = vae->call("decode", {{"z", inputs_.at("z")}});
  EXPECT_EQ(out.at("sample").sizes(), (std::vector<int64_t>{1, 3, 5, 24, 24}));
  expect_close(out.at("sample"), ref_.at("decode_sample"), "decode [1, 4, 2, 3, 3]");
  expect_close(vae->decode(inputs_.at("z_frame")), ref_.at("decode_frame_sample"),
               "decode one frame [1, 4, 1, 2, 3]");
  // Three latent frames: the upsamplers' (frame, time-factor) order of the later frames.
  const at::Tensor z3 = vae->decode(inputs_.at("z3"));
  EXPECT_EQ(z3.sizes(), (std::vector<int64_t>{1, 3, 9, 16, 16}));
  expect_close(z3, ref_.at("decode_z3_sample"), "decode three frames [1, 4, 3, 2, 2]");
}

TEST_F(HunyuanVideo15Vae, TiledEncodeAndDecodeEqualDiffusers) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  const at::Tensor& x = inputs_.at("tiled_sample");
  const at::Tensor& z = inputs_.at("tiled_z");
  // Tiles 32 pixels / 4 latents: default 256-pixel tiles would not split these.
  EXPECT_EQ(vae->tiling().tile_latent_min_height, 256 / 8);
  vae->set_tiling(fixture_tiles());
  const at::Tensor mean = vae->encode(x).mean;
  const at::Tensor dec = vae->decode(z);
  expect_close(mean, ref_.at("tiled_latent_dist_mean"), "tiled encode mean [1, 3, 1, 40, 40]");
  expect_close(dec, ref_.at("tiled_decode_sample"), "tiled decode [1, 4, 1, 5, 5]");
  // The tiles matter: without tiling the results differ.
  vae->enable_tiling(false);
  EXPECT_GT(max_rel_error(vae->encode(x).mean, ref_.at("tiled_latent_dist_mean")), 1e-3);
  EXPECT_GT(max_rel_error(vae->decode(z), ref_.at("tiled_decode_sample")), 1e-3);
}

TEST_F(HunyuanVideo15Vae, SlicingAndForward) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  const at::Tensor z1 = inputs_.at("z");
  const at::Tensor z = at::cat({z1, z1.flip(4)});
  const at::Tensor whole = vae->decode(z);
  expect_close(whole.narrow(0, 0, 1), ref_.at("decode_sample"), "batch-2 decode, element 0");
  vae->enable_slicing();
  EXPECT_LE(max_rel_error(vae->decode(z), whole), 1e-5);  // batch-1 kernels round differently
  const at::Tensor x = at::cat({inputs_.at("sample"), inputs_.at("sample").flip(3)});
  const at::Tensor sliced_mean = vae->encode(x).mean;
  vae->enable_slicing(false);
  EXPECT_LE(max_rel_error(vae->encode(x).mean, sliced_mean), 1e-5);
  expect_close(sliced_mean.narrow(0, 0, 1), ref_.at("latent_dist_mean"), "sliced encode");
  // forward = decode(encode(x).mode).
  TensorMap fwd = vae->call("forward", {{"sample", inputs_.at("sample")}});
  EXPECT_TRUE(at::equal(fwd.at("sample"), vae->decode(vae->encode(inputs_.at("sample")).mean)));
}

TEST_F(HunyuanVideo15Vae, Bf16StaysClose) {
  auto vae = load_fixture(at::kBFloat16);
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->dtype(), at::kBFloat16);
  const at::Tensor dec = vae->decode(inputs_.at("z"));
  EXPECT_EQ(dec.scalar_type(), at::kBFloat16);
  const double err = max_rel_error(dec.to(at::kFloat), ref_.at("decode_sample"));
  std::cout << "[hunyuan_video15_vae] bf16 decode: max rel error " << err << "\n";
  EXPECT_LT(err, 0.1);
}

// ---- config ----------------------------------------------------------------------------------

TEST(HunyuanVideo15VaeConfig, DefaultsAreDiffusers) {
  const auto c = HunyuanVideo15VAEConfig::from_json(nlohmann::json::object(), "cfg.json");
  EXPECT_EQ(c.latent_channels, 32);
  EXPECT_EQ(c.block_out_channels, (std::vector<int64_t>{128, 256, 512, 1024, 1024}));
  EXPECT_EQ(c.spatial_compression_ratio, 16);
  EXPECT_EQ(c.temporal_compression_ratio, 4);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 1.03682);
  // The real model: encoder blocks 0-3 downsample (2 and 3 also in time), decoder blocks 0-3
  // upsample (0 and 1 also in time), block 4 neither.
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(c.down_spatial(i), i < 4) << i;
    EXPECT_EQ(c.down_temporal(i), i == 2 || i == 3) << i;
    EXPECT_EQ(c.up_spatial(i), i < 4) << i;
    EXPECT_EQ(c.up_temporal(i), i < 2) << i;
  }
  // The real model builds (the parameter count of HunyuanVideo-1.5's VAE layout).
  AutoencoderKLHunyuanVideo15 vae(c);
  EXPECT_GT(vae.num_parameters(), 100000000);
}

TEST(HunyuanVideo15VaeConfig, ErrorsNameTheFileAndKey) {
  const std::string f = "/m/vae/config.json";
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"latent_channels", "x"}}, f);
      },
      {f, "latent_channels"});
  expect_error_containing([&] { HunyuanVideo15VAEConfig::from_json(nlohmann::json::array(), f); },
                          {f, "not a JSON object"});
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"spatial_compression_ratio", 12}}, f);
      },
      {f, "spatial_compression_ratio (12)", "powers of two"});
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json(
            {{"spatial_compression_ratio", 4}, {"temporal_compression_ratio", 8}}, f);
      },
      {f, "temporal one at most the spatial one"});
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"block_out_channels", {8, 8, 8}}}, f);
      },
      {f, "spatial_compression_ratio 16 needs 5 or more block_out_channels entries"});
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"block_out_channels", {4, 4, 8, 12}},
                                            {"latent_channels", 4},
                                            {"spatial_compression_ratio", 8}},
                                           f);
      },
      {f, "block_out_channels[-1] (12)", "2 * latent_channels (8)"});
  // Block 1 packs 4 channels by 8 (space and time) into 4: 4 / 8 channels of conv output.
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"block_out_channels", {4, 4, 4, 8}},
                                            {"latent_channels", 4},
                                            {"spatial_compression_ratio", 8}},
                                           f);
      },
      {f, "encoder down block 1", "cannot pack"});
  expect_error_containing(
      [&] {
        HunyuanVideo15VAEConfig::from_json({{"layers_per_block", 0}}, f);
      },
      {f, "layers_per_block (0)"});
}

// ---- errors ----------------------------------------------------------------------------------

TEST_F(HunyuanVideo15Vae, InputErrorsNameTheShape) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  expect_error_containing(
      [&] {
        vae->encode(at::zeros({1, 4, 5, 16, 16}));
      },
      {"input video", "[1, 4, 5, 16, 16]", "in_channels"});
  expect_error_containing(
      [&] {
        vae->encode(at::zeros({1, 3, 4, 16, 16}));
      },
      {"input video", "4 frames", "1 + 4k"});
  expect_error_containing(
      [&] {
        vae->encode(at::zeros({1, 3, 5, 12, 16}));
      },
      {"12 x 16", "spatial_compression_ratio 8"});
  expect_error_containing(
      [&] {
        vae->decode(at::zeros({1, 4, 2, 3}));
      },
      {"latent z", "[1, 4, 2, 3]", "latent_channels"});
  expect_error_containing(
      [&] {
        vae->decode(at::zeros({1, 5, 2, 3, 3}));
      },
      {"latent z", "[1, 5, 2, 3, 3]"});
  expect_error_containing(
      [&] {
        vae->decode(at::zeros({1, 4, 2, 3, 3}, at::kLong));
      },
      {"latent z", "floating-point"});
  expect_error_containing([&] { vae->call("sample", {}); }, {"no method 'sample'"});
  expect_error_containing(
      [&] {
        vae->call("decode", {{"latents", at::zeros({1})}});
      },
      {"unknown input 'latents'", "z"});
  expect_error_containing([&] { vae->call("encode", {}); }, {"missing input 'sample'"});
  // A tiled encode whose tiles are not multiples of the compression ratio.
  HunyuanVideo15VAETiling t = fixture_tiles();
  t.tile_sample_min_height = t.tile_sample_min_width = 20;
  vae->set_tiling(t);
  expect_error_containing(
      [&] {
        vae->encode(at::zeros({1, 3, 1, 40, 40}));
      },
      {"tiled encode", "spatial_compression_ratio 8"});
}

TEST_F(HunyuanVideo15Vae, TilingErrorsNameTheField) {
  auto vae = load_fixture();
  ASSERT_NE(vae, nullptr);
  HunyuanVideo15VAETiling t = fixture_tiles();
  t.tile_overlap_factor = 1.0;
  expect_error_containing([&] { vae->set_tiling(t); }, {"tile_overlap_factor (1)"});
  t = fixture_tiles();
  t.tile_latent_min_width = 1;  // int(1 * 0.75) = 0: diffusers' range() would not step
  expect_error_containing([&] { vae->set_tiling(t); }, {"tile_latent_min_width (1)"});
  t = fixture_tiles();
  t.tile_sample_min_height = 0;
  expect_error_containing([&] { vae->set_tiling(t); }, {"tile_sample_min_height (0)"});
  EXPECT_FALSE(vae->tiling().use_tiling);  // unchanged by the failed calls
}

// A copy of the fixture folder whose weights lack one tensor: the error names it.
TEST_F(HunyuanVideo15Vae, RegistryBuildsItAndMissingWeightsAreNamed) {
  xfuser::models::register_builtin_components();
  xfuser::models::hunyuan_video15::register_hunyuan_video15_vae_components();
  xfuser::models::hunyuan_video15::register_hunyuan_video15_vae_components();  // idempotent
  auto made = xfuser::models::ComponentRegistry::create(
      "AutoencoderKLHunyuanVideo15", xfuser::testing::read_json(case_dir() / "config.json"),
      "config.json");
  ASSERT_NE(std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo15>(made), nullptr);
  const fs::path dir =
      fs::temp_directory_path() / ("xf_hv15_vae_missing_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(case_dir() / "config.json", dir / "config.json");
  auto weights = read_tensors(case_dir() / "diffusion_pytorch_model.safetensors");
  const std::string gone = "decoder.up_blocks.1.upsamplers.0.conv.conv.weight";
  ASSERT_EQ(weights.erase(gone), 1u);
  xfuser::models::save_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), weights);
  expect_error_containing([&] { xfuser::models::load_component(dir.string(), at::kFloat); },
                          {gone});
  fs::remove_all(dir);
}

}  // namespace
