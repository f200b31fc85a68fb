// AutoencoderKLHunyuanVideo against diffusers v0.33.1 (fixtures hunyuan_vae-tiny-s1: HunyuanVideo's
// 4-block topology at 2-4 channels, batch-2 encode of [2, 3, 5, 16, 16] and decode of
// [2, 4, 2, 2, 2]; hunyuan_vae-tiles-s1: 3 blocks at 4x, diffusers' default framewise (temporal
// tile) encode / decode and enable_tiling with tiny tiles, spatial alone and inside temporal tiles)
// and its own invariants: parameter names, slicing, forward = decode(encode mode), the registry
// and `xfuser forward`, bf16, config, tiling and input errors.
#include <algorithm>
#include <iostream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/hunyuan_video/hunyuan_video_vae.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::hunyuan_video::AutoencoderKLHunyuanVideo;
using xfuser::models::hunyuan_video::HunyuanVideoVAEConfig;
using xfuser::models::hunyuan_video::HunyuanVideoVAETiling;
using xfuser::testing::expect_error_containing;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_tensors;

const std::string kTiny = "hunyuan_vae-tiny-s1";
const std::string kTiles = "hunyuan_vae-tiles-s1";

fs::path case_dir(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

std::shared_ptr<AutoencoderKLHunyuanVideo> load_fixture(c10::ScalarType dtype,
                                                        const std::string& name) {
  xfuser::models::register_builtin_components();
  auto component = xfuser::models::load_component(case_dir(name).string(), dtype);
  auto vae = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKLHunyuanVideo";
  return vae;
}

nlohmann::json tiny_config() {
  return {{"latent_channels", 4},
          {"block_out_channels", {2, 4, 4, 4}},
          {"layers_per_block", 1},
          {"norm_num_groups", 2}};
}

std::shared_ptr<AutoencoderKLHunyuanVideo> random_vae(const nlohmann::json& config = tiny_config(),
                                                      uint64_t seed = 7) {
  auto vae =
      std::make_shared<AutoencoderKLHunyuanVideo>(HunyuanVideoVAEConfig::from_json(config, "test"));
  vae->init_random(seed, 0.2);
  at::manual_seed(seed);
  return vae;
}

// The fixture's enable_tiling(...) of the tiled runs.
HunyuanVideoVAETiling fixture_tiles() {
  HunyuanVideoVAETiling t;
  t.use_tiling = true;
  t.tile_sample_min_height = t.tile_sample_min_width = 8;
  t.tile_sample_min_num_frames = 8;
  t.tile_sample_stride_height = t.tile_sample_stride_width = 4;
  t.tile_sample_stride_num_frames = 4;
  return t;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double bound = 1e-4) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = max_rel_error(got, want);
  std::cout << "[hunyuan_vae] " << what << ": max rel error " << err << "\n";
  EXPECT_LT(err, bound) << what;
}

// ---- fixture parity -------------------------------------------------------------------------

TEST(AutoencoderKLHunyuanVideoFixture, EncodeFp32MatchesDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir(kTiny));
  auto vae = load_fixture(at::kFloat, kTiny);
  ASSERT_NE(vae, nullptr);
  auto inputs = read_tensors(case_dir(kTiny) / "inputs.safetensors");
  auto ref = read_tensors(case_dir(kTiny) / "output.safetensors");
  const at::Tensor& x = inputs.at("sample");
  ASSERT_EQ(x.size(0), 2);
  TensorMap enc = vae->call("encode", {{"sample", x}});
  auto [mean, logvar] = vae->encode(x);
  const std::vector<std::pair<std::string, at::Tensor>> checks = {
      {"encode_mean", enc.at("latent_dist_mean")},
      {"encode_std", enc.at("latent_dist_std")},
      {"encode_logvar", logvar}};
  for (const auto& [what, got] : checks) {
    EXPECT_EQ(got.scalar_type(), at::kFloat) << what;
    expect_close(got, ref.at(what), "fp32 " + what + " vs diffusers fp32");
    expect_close(got, ref.at(what + "_f64"), "fp32 " + what + " vs diffusers fp64");
  }
  EXPECT_TRUE(at::equal(enc.at("sample"), enc.at("latent_dist_mean")));  // the mode
  EXPECT_TRUE(at::equal(mean, enc.at("latent_dist_mean")));
  EXPECT_EQ(mean.sizes(), (std::vector<int64_t>{2, 4, 2, 2, 2}));
  // Slicing the batch changes nothing; the two batch elements differ.
  vae->enable_slicing();
  expect_close(vae->encode(x).first, ref.at("encode_mean"), "fp32 encode_mean sliced");
  EXPECT_GT((mean[0] - mean[1]).abs().max().item<double>(), 1e-3);
}

TEST(AutoencoderKLHunyuanVideoFixture, DecodeFp32MatchesDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir(kTiny));
  auto vae = load_fixture(at::kFloat, kTiny);
  ASSERT_NE(vae, nullptr);
  auto inputs = read_tensors(case_dir(kTiny) / "inputs.safetensors");
  auto ref = read_tensors(case_dir(kTiny) / "output.safetensors");
  const at::Tensor& z = inputs.at("z");
  at::Tensor out = vae->call("decode", {{"z", z}}).at("sample");
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 5, 16, 16}));
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  expect_close(out, ref.at("decode"), "fp32 decode vs diffusers fp32");
  expect_close(out, ref.at("decode_f64"), "fp32 decode vs diffusers fp64");
  EXPECT_TRUE(at::equal(vae->decode(z), out));
  vae->enable_slicing();
  expect_close(vae->decode(z), ref.at("decode"), "fp32 decode sliced");
}

TEST(AutoencoderKLHunyuanVideoFixture, FramewiseAndTiledMatchDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir(kTiles));
  auto vae = load_fixture(at::kFloat, kTiles);
  ASSERT_NE(vae, nullptr);
  auto inputs = read_tensors(case_dir(kTiles) / "inputs.safetensors");
  auto ref = read_tensors(case_dir(kTiles) / "output.safetensors");
  struct Run {
    std::string out, input;
    bool encode, tiled;
  };
  const std::vector<Run> runs = {{"encode_framewise", "sample_long", true, false},
                                 {"decode_framewise", "z_long", false, false},
                                 {"encode_tiled", "sample_tiled", true, true},
                                 {"decode_tiled", "z_tiled", false, true},
                                 {"encode_tiled_long", "sample_tiled_long", true, true},
                                 {"decode_tiled_long", "z_tiled_long", false, true}};
  for (const auto& r : runs) {
    SCOPED_TRACE(r.out);
    vae->set_tiling(r.tiled ? fixture_tiles() : HunyuanVideoVAETiling{});
    const at::Tensor& in = inputs.at(r.input);
    if (r.encode) {
      auto [mean, logvar] = vae->encode(in);
      expect_close(mean, ref.at(r.out + "_mean"), "fp32 " + r.out + " mean");
      expect_close(logvar, ref.at(r.out + "_logvar"), "fp32 " + r.out + " logvar");
      // The tiles change the result (the test exercises the tiled path): without any tiling the
      // encoder sees the whole clip at once.
      HunyuanVideoVAETiling none;
      none.use_framewise_encoding = false;
      vae->set_tiling(none);
      EXPECT_GT(max_rel_error(vae->encode(in).first, ref.at(r.out + "_mean")), 1e-3);
    } else {
      at::Tensor out = vae->call("decode", {{"z", in}}).at("sample");
      EXPECT_EQ(out.size(2), 1 + 4 * (in.size(2) - 1));
      EXPECT_EQ(out.size(3), 4 * in.size(3));
      expect_close(out, ref.at(r.out), "fp32 " + r.out);
      HunyuanVideoVAETiling none;
      none.use_framewise_decoding = false;
      vae->set_tiling(none);
      EXPECT_GT(max_rel_error(vae->decode(in), ref.at(r.out)), 1e-3);
    }
  }
}

// bf16 keeps 8 significant bits through ~40 convolutions. diffusers v0.33.1 itself, run in bf16 on
// hunyuan_vae-tiny-s1, is 4.4e-2 (decode) and 1.0e-2 (encode mean) relative l2 off its fp64
// output; here 5.8e-2 and 1.6e-2 (libtorch 1.13's CPU rounding order differs). A wiring mistake
// is O(1) (e.g. the mid-block attention without its causal frame mask moves the fp32 decode by
// 0.69 max relative). Measured values are printed.
TEST(AutoencoderKLHunyuanVideoFixture, Bf16RunsFiniteAndClose) {
  XF_REQUIRE_FIXTURE(case_dir(kTiny));
  auto vae = load_fixture(at::kBFloat16, kTiny);
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->dtype(), at::kBFloat16);
  auto inputs = read_tensors(case_dir(kTiny) / "inputs.safetensors");
  auto ref = read_tensors(case_dir(kTiny) / "output.safetensors");
  at::Tensor dec = vae->call("decode", {{"z", inputs.at("z")}}).at("sample");
  at::Tensor mean = vae->call("encode", {{"sample", inputs.at("sample")}}).at("latent_dist_mean");
  EXPECT_EQ(dec.scalar_type(), at::kBFloat16);
  EXPECT_EQ(mean.scalar_type(), at::kBFloat16);
  for (const auto& [what, got] :
       std::vector<std::pair<std::string, at::Tensor>>{{"decode", dec}, {"encode_mean", mean}}) {
    const at::Tensor want = ref.at(what + "_f64");
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    EXPECT_TRUE(at::isfinite(got).all().item<bool>()) << what;
    const at::Tensor d = got.to(at::kDouble) - want;
    const double rel_l2 = (d.norm() / want.norm()).item<double>();
    std::cout << "[hunyuan_vae] bf16 " << what << ": max rel error vs diffusers fp64 "
              << max_rel_error(got, want) << ", relative l2 " << rel_l2 << "\n";
    EXPECT_LT(rel_l2, 1e-1) << what;
  }
  // The tiled path in bf16 too.
  auto tiles = load_fixture(at::kBFloat16, kTiles);
  ASSERT_NE(tiles, nullptr);
  tiles->set_tiling(fixture_tiles());
  auto tin = read_tensors(case_dir(kTiles) / "inputs.safetensors");
  at::Tensor tdec = tiles->decode(tin.at("z_tiled_long"));
  EXPECT_TRUE(at::isfinite(tdec).all().item<bool>());
  const at::Tensor twant =
      read_tensors(case_dir(kTiles) / "output.safetensors").at("decode_tiled_long");
  EXPECT_LT(((tdec.to(at::kDouble) - twant.to(at::kDouble)).norm() / twant.to(at::kDouble).norm())
                .item<double>(),
            1e-1);
}

TEST(AutoencoderKLHunyuanVideoFixture, ParameterNamesAreDiffusers) {
  for (const auto& name : {kTiny, kTiles}) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    auto vae = load_fixture(at::kFloat, name);
    ASSERT_NE(vae, nullptr);
    std::vector<std::string> ours;
    for (const auto& [n, slot] : vae->named_parameters()) ours.push_back(n);
    std::sort(ours.begin(), ours.end());
    EXPECT_EQ(
        ours,
        SafetensorsFile((case_dir(name) / "diffusion_pytorch_model.safetensors").string()).names())
        << name;
    const auto c = xfuser::testing::read_json(case_dir(name) / "case.json");
    EXPECT_EQ(vae->num_parameters(), c.at("num_parameters").get<int64_t>()) << name;
    EXPECT_EQ(vae->class_name(), "AutoencoderKLHunyuanVideo");
    EXPECT_DOUBLE_EQ(vae->config().scaling_factor, 0.476986);
  }
}

TEST(AutoencoderKLHunyuanVideoFixture, XfuserForwardTool) {
  XF_REQUIRE_FIXTURE(case_dir(kTiny));
  const fs::path bin = xfuser::testing::binary_dir() / "bin" / "xfuser";
  ASSERT_TRUE(fs::exists(bin)) << "xfuser binary not built: " << bin;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  xfuser::testing::TempDir tmp("xfuser-hunyuan-vae");
  auto inputs = read_tensors(case_dir(kTiny) / "inputs.safetensors");
  auto ref = read_tensors(case_dir(kTiny) / "output.safetensors");
  xfuser::models::save_safetensors((tmp / "z.safetensors").string(), {{"z", inputs.at("z")}});
  xfuser::models::save_safetensors((tmp / "x.safetensors").string(),
                                   {{"sample", inputs.at("sample")}});
  for (const auto& [method, in, out_name, want] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"decode", "z", "sample", "decode"},
           {"encode", "x", "latent_dist_mean", "encode_mean"}}) {
    std::string log;
    const fs::path out = tmp / (method + ".safetensors");
    const int rc = xfuser::testing::run_command(
        q(bin) + " forward --model-dir " + q(case_dir(kTiny)) + " --inputs " +
            q(tmp / (in + ".safetensors")) + " --output " + q(out) + " --method " + method,
        &log);
    ASSERT_EQ(rc, 0) << log;
    auto got = read_tensors(out);
    ASSERT_TRUE(got.count(out_name)) << log;
    expect_close(got.at(out_name), ref.at(want), "xfuser forward --method " + method);
  }
}

// ---- behaviour --------------------------------------------------------------------------------

TEST(AutoencoderKLHunyuanVideo, ForwardIsDecodeOfEncodeMode) {
  auto vae = random_vae();
  at::Tensor x = at::rand({1, 3, 5, 16, 16}) * 2 - 1;
  TensorMap enc = vae->call("encode", {{"sample", x}});
  ASSERT_EQ(enc.size(), 3u);
  EXPECT_GT(enc.at("latent_dist_std").min().item<double>(), 0.0);
  at::Tensor rt = vae->call("forward", {{"sample", x}}).at("sample");
  EXPECT_EQ(rt.sizes(), x.sizes());
  EXPECT_TRUE(at::equal(rt, vae->call("decode", {{"z", enc.at("sample")}}).at("sample")));
  EXPECT_TRUE(at::equal(vae->call("forward", {{"sample", x}}).at("sample"), rt));
}

TEST(AutoencoderKLHunyuanVideo, WithoutMidBlockAttention) {
  nlohmann::json c = tiny_config();
  c["mid_block_add_attention"] = false;
  auto vae = random_vae(c);
  for (const auto& [name, slot] : vae->named_parameters()) {
    EXPECT_EQ(name.find("attentions"), std::string::npos) << name;
  }
  auto with = random_vae();
  EXPECT_EQ(with->num_parameters() - vae->num_parameters(), 2 * (4 * (4 * 4 + 4) + 2 * 4));
  c10::InferenceMode guard;
  at::Tensor out = vae->decode(at::randn({1, 4, 2, 2, 3}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 5, 16, 24}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
}

// diffusers' default tile sizes; set_tiling's checks; a tiled decode of a random latent.
TEST(AutoencoderKLHunyuanVideo, TilingDefaultsAndErrors) {
  auto vae = random_vae();
  const HunyuanVideoVAETiling& d = vae->tiling();
  EXPECT_FALSE(d.use_tiling);
  EXPECT_TRUE(d.use_framewise_encoding);
  EXPECT_TRUE(d.use_framewise_decoding);
  EXPECT_EQ(d.tile_sample_min_height, 256);
  EXPECT_EQ(d.tile_sample_min_width, 256);
  EXPECT_EQ(d.tile_sample_min_num_frames, 16);
  EXPECT_EQ(d.tile_sample_stride_height, 192);
  EXPECT_EQ(d.tile_sample_stride_width, 192);
  EXPECT_EQ(d.tile_sample_stride_num_frames, 12);
  vae->enable_tiling();
  EXPECT_TRUE(vae->tiling().use_tiling);
  HunyuanVideoVAETiling t;
  t.tile_sample_stride_height = 4;  // less than the 8x compression: no latent step
  expect_error_containing([&] { vae->set_tiling(t); },
                          {"tile_sample_stride_height (4)", "at least 8"});
  t = HunyuanVideoVAETiling{};
  t.tile_sample_stride_width = 320;  // larger than the tile: gaps
  expect_error_containing([&] { vae->set_tiling(t); },
                          {"tile_sample_min_width (256)", "tile_sample_stride_width (320)"});
  t = HunyuanVideoVAETiling{};
  t.tile_sample_stride_num_frames = 2;
  expect_error_containing([&] { vae->set_tiling(t); }, {"tile_sample_stride_num_frames (2)"});
  // Shapes and finiteness here; the values are held against diffusers by the fixtures.
  c10::InferenceMode guard;
  HunyuanVideoVAETiling small;
  small.use_tiling = true;
  small.tile_sample_min_height = small.tile_sample_min_width = 16;
  small.tile_sample_stride_height = small.tile_sample_stride_width = 8;
  vae->set_tiling(small);
  at::Tensor out = vae->decode(at::randn({1, 4, 2, 3, 5}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 5, 24, 40}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
}

TEST(AutoencoderKLHunyuanVideo, BadInputsAreClearErrors) {
  auto vae = random_vae();
  expect_error_containing(
      [&] {
        vae->call("encode", {{"sample", at::zeros({1, 3, 4, 16, 16})}});
      },
      {"input video", "[1, 3, 4, 16, 16]", "1 + 4k"});
  expect_error_containing(
      [&] {
        vae->call("encode", {{"sample", at::zeros({1, 3, 16, 16})}});
      },
      {"input video", "[1, 3, 16, 16]", "in_channels"});
  expect_error_containing(
      [&] {
        vae->call("encode", {{"sample", at::zeros({1, 4, 5, 16, 16})}});
      },
      {"input video", "[1, 4, 5, 16, 16]", "[B, 3 (in_channels), F, H, W]"});
  expect_error_containing(
      [&] {
        vae->call("decode", {{"z", at::zeros({1, 16, 2, 2, 2})}});
      },
      {"latent z", "[1, 16, 2, 2, 2]", "[B, 4 (latent_channels), f, h, w]"});
  expect_error_containing(
      [&] {
        vae->decode(at::zeros({4, 2, 2, 2}));
      },
      {"latent z", "[4, 2, 2, 2]"});
  expect_error_containing(
      [&] {
        vae->call("decode", {{"sample", at::zeros({1, 4, 1, 2, 2})}});
      },
      {"unknown input 'sample'"});
  expect_error_containing([&] { vae->call("decode", {}); }, {"missing input 'z'"});
  expect_error_containing([&] { vae->call("tiled_decode", {}); }, {"no method 'tiled_decode'"});
  expect_error_containing(
      [&] {
        vae->call("decode", {{"z", at::zeros({1, 4, 1, 2, 2}, at::kLong)}});
      },
      {"floating-point"});
  AutoencoderKLHunyuanVideo fresh(HunyuanVideoVAEConfig::from_json(tiny_config()));
  expect_error_containing([&] { fresh.decode(at::zeros({1, 4, 1, 2, 2})); }, {"loaded"});
}

TEST(AutoencoderKLHunyuanVideo, ConfigErrorsAndDefaults) {
  HunyuanVideoVAEConfig d = HunyuanVideoVAEConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(d.latent_channels, 16);
  EXPECT_EQ(d.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(d.layers_per_block, 2);
  EXPECT_EQ(d.norm_num_groups, 32);
  EXPECT_EQ(d.spatial_compression_ratio, 8);
  EXPECT_EQ(d.temporal_compression_ratio, 4);
  EXPECT_TRUE(d.mid_block_add_attention);
  // HunyuanVideo's placement: spatial on blocks 0-2, temporal on blocks 1-2.
  EXPECT_TRUE(d.spatial_resample(0) && d.spatial_resample(2) && !d.spatial_resample(3));
  EXPECT_TRUE(!d.temporal_resample(0) && d.temporal_resample(1) && d.temporal_resample(2) &&
              !d.temporal_resample(3));
  auto bad = [](nlohmann::json patch, const std::vector<std::string>& needles) {
    nlohmann::json c = tiny_config();
    c.merge_patch(patch);
    expect_error_containing([&] { HunyuanVideoVAEConfig::from_json(c, "vae/config.json"); },
                            needles);
  };
  bad({{"down_block_types",
        {"DownEncoderBlock2D", "HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D",
         "HunyuanVideoDownBlock3D"}}},
      {"vae/config.json", "unsupported down_block_type 'DownEncoderBlock2D'"});
  bad({{"up_block_types", {"HunyuanVideoUpBlock3D"}}}, {"up_block_types (1)"});
  bad({{"temporal_compression_ratio", 8}}, {"temporal_compression_ratio 8"});
  bad({{"spatial_compression_ratio", 6}}, {"spatial_compression_ratio 6", "power of two"});
  bad({{"spatial_compression_ratio", 32}}, {"spatial_compression_ratio 32", "at most 2^4"});
  bad({{"block_out_channels", {4, 4}},
       {"down_block_types", {"HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D"}},
       {"up_block_types", {"HunyuanVideoUpBlock3D", "HunyuanVideoUpBlock3D"}},
       {"spatial_compression_ratio", 4}},
      {"2 blocks give only 1 temporal downsamplers", "at least 3 blocks"});
  bad({{"norm_num_groups", 4}}, {"block_out_channels entry 2", "norm_num_groups (4)"});
  bad({{"block_out_channels", {3, 4, 4, 4}}}, {"entry 3", "norm_num_groups (2)"});
  bad({{"act_fn", "tanh"}}, {"vae/config.json", "unsupported act_fn 'tanh'"});
  bad({{"layers_per_block", 0}}, {"layers_per_block (0)"});
  bad({{"latent_channels", "4"}}, {"vae/config.json", "latent_channels"});
}

}  // namespace
