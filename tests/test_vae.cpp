// AutoencoderKL against diffusers v0.33.1 (fixture vae-tiny-s1: decode of z [4, 16, 16, 16]) and
// its own invariants: encode shapes, round trip, batching, slicing, tiling, odd sizes, band
// decoding through a SpatialContext (the patch-parallel structure), config and input errors.
#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/register.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::ComponentRegistry;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::vae::AutoencoderKL;
using xfuser::models::vae::AutoencoderKLConfig;
using xfuser::models::vae::SpatialContext;
using xfuser::testing::max_rel_error;

fs::path case_dir() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "vae-tiny-s1";
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto known = ComponentRegistry::known_classes();
    if (std::find(known.begin(), known.end(), "AutoencoderKL") == known.end()) {
      xfuser::models::register_vae();
    }
  });
}

std::shared_ptr<AutoencoderKL> load_fixture(c10::ScalarType dtype) {
  ensure_registered();
  auto component = xfuser::models::load_component(case_dir().string(), dtype);
  auto vae = std::dynamic_pointer_cast<AutoencoderKL>(component);
  EXPECT_NE(vae, nullptr) << "load_component did not build an AutoencoderKL";
  return vae;
}

at::Tensor fixture_tensor(const std::string& file, const std::string& name) {
  SafetensorsFile f((case_dir() / file).string());
  return f.get(name).clone();
}

// The fixture's config (block_out_channels [2, 4], latent 16, groups 2), optionally edited,
// with seeded random weights: for tests that need no reference output.
std::shared_ptr<AutoencoderKL> random_vae(const nlohmann::json& edits = nlohmann::json::object(),
                                          uint64_t seed = 7) {
  nlohmann::json config = {{"block_out_channels", {2, 4}},
                           {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
                           {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}},
                           {"latent_channels", 16},
                           {"norm_num_groups", 2},
                           {"use_quant_conv", false},
                           {"use_post_quant_conv", false}};
  config.update(edits);
  at::manual_seed(seed);  // the inputs the test draws next are reproducible too
  auto vae = std::make_shared<AutoencoderKL>(AutoencoderKLConfig::from_json(config, "test"));
  vae->init_random(seed, 0.3);
  return vae;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

// ---- fixture parity -------------------------------------------------------------------------

TEST(AutoencoderKLFixture, DecodeFp32MatchesDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture(at::kFloat);
  ASSERT_NE(vae, nullptr);
  at::Tensor z = fixture_tensor("inputs.safetensors", "z");
  at::Tensor ref = fixture_tensor("output.safetensors", "sample");
  at::Tensor ref64 = fixture_tensor("output.safetensors", "sample_f64");
  at::Tensor out = vae->call("decode", {{"z", z}}).at("sample");
  ASSERT_EQ(out.sizes(), ref.sizes());
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  const double err = max_rel_error(out, ref);
  const double err64 = max_rel_error(out, ref64);
  std::cout << "[vae] fp32 decode: max rel error vs diffusers fp32 " << err << ", vs fp64 " << err64
            << "\n";
  EXPECT_LT(err, 1e-4);
  EXPECT_LT(err64, 1e-4);
}

// bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3); weights, activations and every conv
// output are rounded to it through ~20 layers, so errors of a few 1e-2 of max|ref| are expected.
// A wiring mistake (wrong block order, missing residual, norm in bf16 statistics...) moves the
// output by O(1) relative. The bound is 5e-2; the measured value is printed.
TEST(AutoencoderKLFixture, DecodeBf16AndFp16WithinBound) {
  XF_REQUIRE_FIXTURE(case_dir());
  at::Tensor z = fixture_tensor("inputs.safetensors", "z");
  at::Tensor ref64 = fixture_tensor("output.safetensors", "sample_f64");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto vae = load_fixture(dtype);
    ASSERT_NE(vae, nullptr);
    at::Tensor out = vae->call("decode", {{"z", z}}).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    ASSERT_EQ(out.sizes(), ref64.sizes());
    const double err = max_rel_error(out, ref64);
    std::cout << "[vae] " << dtype << " decode: max rel error vs diffusers fp64 " << err << "\n";
    // fp16 has 11 significant bits: 8x tighter than bf16.
    EXPECT_LT(err, dtype == at::kHalf ? 1e-2 : 5e-2) << dtype;
  }
}

TEST(AutoencoderKLFixture, ParameterNamesAreDiffusers) {
  XF_REQUIRE_FIXTURE(case_dir());
  auto vae = load_fixture(at::kFloat);
  ASSERT_NE(vae, nullptr);
  SafetensorsFile weights((case_dir() / "diffusion_pytorch_model.safetensors").string());
  std::vector<std::string> ours;
  for (const auto& [name, slot] : vae->named_parameters()) ours.push_back(name);
  auto theirs = weights.names();
  std::sort(ours.begin(), ours.end());
  EXPECT_EQ(ours, theirs);
  EXPECT_EQ(vae->num_parameters(), 4673);  // case.json num_parameters
  // Group norms stay fp32 in a bf16 model.
  auto bf = load_fixture(at::kBFloat16);
  for (const auto& [name, slot] : bf->named_parameters()) {
    const bool norm = name.find("norm") != std::string::npos;
    EXPECT_EQ(slot->tensor.scalar_type(), norm ? at::kFloat : at::kBFloat16) << name;
  }
}

// ---- behaviour --------------------------------------------------------------------------------

TEST(AutoencoderKL, EncodeShapesAndRoundTrip) {
  auto vae = random_vae();
  at::Tensor x = at::rand({2, 3, 32, 32}) * 2 - 1;
  TensorMap enc = vae->call("encode", {{"sample", x}});
  ASSERT_EQ(enc.size(), 3u);
  EXPECT_EQ(enc.at("latent_dist_mean").sizes(), (std::vector<int64_t>{2, 16, 16, 16}));
  EXPECT_EQ(enc.at("latent_dist_std").sizes(), (std::vector<int64_t>{2, 16, 16, 16}));
  EXPECT_TRUE(at::equal(enc.at("sample"), enc.at("latent_dist_mean")));  // mode = mean
  EXPECT_GT(enc.at("latent_dist_std").min().item<double>(), 0.0);
  // std = exp(0.5 * clamp(logvar)) with logvar the second half of the encoder's moments.
  auto post = vae->encode(x);
  EXPECT_TRUE(at::allclose(post.std, at::exp(0.5 * post.logvar)));
  EXPECT_LE(post.logvar.max().item<double>(), 20.0);

  at::Tensor rt = vae->call("forward", {{"sample", x}}).at("sample");
  EXPECT_EQ(rt.sizes(), x.sizes());
  EXPECT_TRUE(at::isfinite(rt).all().item<bool>());
  // forward == decode(encode(x).mode)
  at::Tensor manual = vae->call("decode", {{"z", enc.at("sample")}}).at("sample");
  EXPECT_TRUE(at::equal(rt, manual));
}

TEST(AutoencoderKL, QuantConvsAndNoAttentionFollowConfig) {
  auto with = random_vae({{"use_quant_conv", true}, {"use_post_quant_conv", true}});
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, slot] : with->named_parameters()) shapes[name] = slot->shape;
  EXPECT_EQ(shapes.at("quant_conv.weight"), (std::vector<int64_t>{32, 32, 1, 1}));
  EXPECT_EQ(shapes.at("post_quant_conv.weight"), (std::vector<int64_t>{16, 16, 1, 1}));
  EXPECT_EQ(shapes.at("decoder.mid_block.attentions.0.to_out.0.weight"),
            (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(shapes.at("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"),
            (std::vector<int64_t>{4, 2, 1, 1}));
  EXPECT_EQ(shapes.at("decoder.up_blocks.0.upsamplers.0.conv.weight"),
            (std::vector<int64_t>{4, 4, 3, 3}));
  EXPECT_EQ(shapes.count("decoder.up_blocks.1.upsamplers.0.conv.weight"), 0u);
  EXPECT_EQ(shapes.count("decoder.up_blocks.0.resnets.1.norm1.weight"), 1u);  // layers + 1
  // The post-quant conv acts: outputs differ from a model without it (same other weights).
  at::Tensor z = at::randn({1, 16, 8, 8});
  at::Tensor a = with->call("decode", {{"z", z}}).at("sample");
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{1, 3, 16, 16}));

  auto plain = random_vae({{"mid_block_add_attention", false}});
  for (const auto& [name, slot] : plain->named_parameters()) {
    EXPECT_EQ(name.find("attentions"), std::string::npos) << name;
  }
  EXPECT_EQ(plain->call("decode", {{"z", z}}).at("sample").sizes(), a.sizes());
}

TEST(AutoencoderKL, BatchOfTwoEqualsTwoSingleDecodes) {
  auto vae = random_vae();
  at::Tensor z = at::randn({2, 16, 12, 12});
  at::Tensor both = vae->call("decode", {{"z", z}}).at("sample");
  at::Tensor a = vae->call("decode", {{"z", z.slice(0, 0, 1)}}).at("sample");
  at::Tensor b = vae->call("decode", {{"z", z.slice(0, 1, 2)}}).at("sample");
  const double err = max_rel_error(both, at::cat({a, b}));
  EXPECT_LT(err, 1e-6);
  // The two images differ (the batch dimension is not mixed up or broadcast).
  EXPECT_GT(max_rel_error(a, b), 1e-2);
}

// Slicing runs each batch element as an unsliced batch-1 call: bitwise equal to those. Against
// one batched call it differs only by libtorch picking other conv/norm kernels for batch 3
// (measured ~4e-7 relative on one CPU, 1.2e-6 on another: oneDNN's blocking depends on the ISA),
// so that comparison has a float tolerance of fp32 accumulation over these convolutions.
TEST(AutoencoderKL, SlicingEqualsUnslicedExactly) {
  auto vae = random_vae();
  at::Tensor z = at::randn({3, 16, 10, 10});
  at::Tensor x = at::rand({3, 3, 24, 24});
  at::Tensor batched = vae->decode(z);
  auto enc_batched = vae->encode(x);
  std::vector<at::Tensor> one_by_one, means, stds;
  for (int64_t i = 0; i < 3; ++i) {
    one_by_one.push_back(vae->decode(z.slice(0, i, i + 1)));
    auto post = vae->encode(x.slice(0, i, i + 1));
    means.push_back(post.mean);
    stds.push_back(post.std);
  }
  vae->enable_slicing();
  EXPECT_TRUE(vae->slicing());
  at::Tensor sliced = vae->decode(z);
  auto enc_sliced = vae->encode(x);
  EXPECT_TRUE(at::equal(sliced, at::cat(one_by_one)));
  EXPECT_TRUE(at::equal(enc_sliced.mean, at::cat(means)));
  EXPECT_TRUE(at::equal(enc_sliced.std, at::cat(stds)));
  EXPECT_LT(max_rel_error(sliced, batched), 1e-5);
  EXPECT_LT(max_rel_error(enc_sliced.mean, enc_batched.mean), 1e-5);
  // Slicing composes with tiling (diffusers: each slice goes through _decode).
  vae->enable_tiling();
  at::Tensor big = at::randn({2, 16, 20, 20});
  at::Tensor tiled_sliced = vae->decode(big);
  vae->enable_slicing(false);
  EXPECT_TRUE(at::equal(tiled_sliced.slice(0, 1, 2), vae->decode(big.slice(0, 1, 2))));
}

TEST(AutoencoderKL, OddLatentAndImageSizes) {
  auto vae = random_vae();
  at::Tensor z = at::randn({1, 16, 7, 9});
  at::Tensor out = vae->call("decode", {{"z", z}}).at("sample");
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 14, 18}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  // Downsample2D pads (0, 1, 0, 1) then a stride-2 3x3 conv: 17 -> 8, 23 -> 11.
  at::Tensor x = at::rand({1, 3, 17, 23});
  auto enc = vae->call("encode", {{"sample", x}});
  EXPECT_EQ(enc.at("sample").sizes(), (std::vector<int64_t>{1, 16, 8, 11}));
  EXPECT_EQ(vae->call("forward", {{"sample", x}}).at("sample").sizes(),
            (std::vector<int64_t>{1, 3, 16, 22}));
}

TEST(AutoencoderKL, TiledDecodeStitchesAndStaysCloseToFullDecode) {
  auto vae = random_vae();  // sample_size 32: tiles of 16 latent rows, 32 pixels, blend 8
  ASSERT_EQ(vae->tile_latent_min_size(), 16);
  ASSERT_EQ(vae->tile_sample_min_size(), 32);
  at::Tensor z = at::randn({1, 16, 28, 40});
  at::Tensor full = vae->decode(z);
  vae->enable_tiling();
  at::Tensor tiled = vae->decode(z);
  ASSERT_EQ(tiled.sizes(), full.sizes());
  const double err = max_rel_error(tiled, full);
  std::cout << "[vae] tiled vs full decode (28x40 latent, 16-latent tiles): max rel error " << err
            << "\n";
  EXPECT_LT(err, 0.5);  // blending, not exact; a misplaced tile gives O(1)
  EXPECT_GT(err, 0.0);
  // Tile (0, 0) is never blended: its first row_limit = 24 rows and columns are copied as is.
  at::Tensor t00 = vae->decode_full(z.slice(2, 0, 16).slice(3, 0, 16));
  EXPECT_TRUE(
      at::equal(tiled.slice(2, 0, 24).slice(3, 0, 24), t00.slice(2, 0, 24).slice(3, 0, 24)));
  // Tile (0, 1) starts at latent column 12 (stride int(16 * 0.75)), output column 24; its first
  // 8 columns are blended with columns 24..31 of tile (0, 0): w = x / 8.
  at::Tensor t01 = vae->decode_full(z.slice(2, 0, 16).slice(3, 12, 28));
  for (int64_t x : {1, 5}) {
    const double w = x / 8.0;
    at::Tensor want = t00.select(3, 24 + x) * (1 - w) + t01.select(3, x) * w;
    EXPECT_LT(max_rel_error(tiled.select(3, 24 + x).slice(2, 0, 24), want.slice(2, 0, 24)), 1e-6);
  }
  // A latent no larger than a tile decodes without tiling.
  at::Tensor small = at::randn({1, 16, 16, 16});
  EXPECT_TRUE(at::equal(vae->decode(small), vae->decode_full(small)));
}

TEST(AutoencoderKL, TiledEncodeShapesAndCloseness) {
  auto vae = random_vae();
  at::Tensor x = at::rand({1, 3, 56, 72}) * 2 - 1;
  auto full = vae->encode(x);
  vae->enable_tiling();
  auto tiled = vae->encode(x);
  ASSERT_EQ(tiled.mean.sizes(), full.mean.sizes());
  const double err = max_rel_error(tiled.mean, full.mean);
  std::cout << "[vae] tiled vs full encode (56x72 image, 32-pixel tiles): max rel error " << err
            << "\n";
  EXPECT_LT(err, 0.5);
  EXPECT_GT(err, 0.0);
}

// ---- the band structure (patch-parallel VAE) ----------------------------------------------------

TEST(AutoencoderKL, ExplicitWholeImageContextMatchesDefaultPath) {
  auto vae = random_vae();
  at::Tensor z = at::randn({2, 16, 9, 11});
  SpatialContext whole;  // pad_rows with zeros, local moments, no gathering
  c10::InferenceMode guard;
  at::Tensor a = vae->decode_full(z);
  at::Tensor b = vae->decode_full(z, &whole);
  EXPECT_LT(max_rel_error(b, a), 1e-5);
}

// Two bands decoded by two threads that exchange halo rows, group statistics and attention
// keys/values through shared slots: the in-process model of patch-parallel decoding.
class Exchange {
 public:
  explicit Exchange(int n) : n_(n), slots_(n) {}
  // Publishes `mine` for this rank; returns every rank's value (after all published).
  std::vector<at::Tensor> all_gather(int rank, const at::Tensor& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    slots_[rank] = mine;
    arrive(lock);
    std::vector<at::Tensor> all = slots_;
    arrive(lock);  // nobody overwrites a slot before everyone read it
    return all;
  }

 private:
  void arrive(std::unique_lock<std::mutex>& lock) {
    const int64_t gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }
  int n_;
  std::vector<at::Tensor> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_ = 0;
  int64_t generation_ = 0;
};

class BandContext : public SpatialContext {
 public:
  BandContext(Exchange* ex, int rank, int n) : ex_(ex), rank_(rank), n_(n) {}
  at::Tensor pad_rows(const at::Tensor& x, int64_t halo) const override {
    auto all = ex_->all_gather(rank_, x);
    at::Tensor zeros = at::zeros_like(x.narrow(2, 0, halo));
    at::Tensor above =
        rank_ > 0 ? all[rank_ - 1].narrow(2, all[rank_ - 1].size(2) - halo, halo) : zeros;
    at::Tensor below = rank_ + 1 < n_ ? all[rank_ + 1].narrow(2, 0, halo) : zeros;
    return at::cat({above, x, below}, 2);
  }
  std::pair<at::Tensor, at::Tensor> group_moments(const at::Tensor& x) const override {
    // Exact two-pass moments over the union of the bands.
    at::Tensor whole = at::cat(ex_->all_gather(rank_, x), -1);  // [B, G, n_total]
    auto [var, mean] = at::var_mean(whole, {-1}, false);
    return {mean, var};
  }
  at::Tensor gather_tokens(const at::Tensor& tokens) const override {
    return at::cat(ex_->all_gather(rank_, tokens), 1);
  }

 private:
  Exchange* ex_;
  int rank_, n_;
};

TEST(AutoencoderKL, TwoBandDecodeEqualsWholeImageDecode) {
  auto vae = random_vae();
  at::Tensor z = at::randn({1, 16, 10, 12});
  at::Tensor whole;
  {
    c10::InferenceMode guard;
    whole = vae->decode_full(z);
  }
  const int64_t split = 4;  // uneven bands: latent rows [0, 4) and [4, 10)
  Exchange ex(2);
  at::Tensor band_out[2];
  std::string errors[2];
  auto run = [&](int rank) {
    c10::InferenceMode guard;
    try {
      BandContext ctx(&ex, rank, 2);
      at::Tensor band = rank == 0 ? z.slice(2, 0, split) : z.slice(2, split, 10);
      band_out[rank] = vae->decode_full(band, &ctx);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  at::Tensor stitched = at::cat({band_out[0], band_out[1]}, 2);
  ASSERT_EQ(stitched.sizes(), whole.sizes());
  const double err = max_rel_error(stitched, whole);
  std::cout << "[vae] two-band decode vs whole decode: max rel error " << err << "\n";
  EXPECT_LT(err, 1e-5);
}

// ---- errors and config ------------------------------------------------------------------------

TEST(AutoencoderKL, InputErrorsNameTheInputAndExpectedShape) {
  auto vae = random_vae();
  std::string msg = error_of([&] { vae->call("decode", {{"z", at::randn({1, 4, 8, 8})}}); });
  EXPECT_NE(msg.find("'z'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 4, 8, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[B, 16, H, W]"), std::string::npos) << msg;
  msg = error_of([&] { vae->call("encode", {{"sample", at::randn({1, 4, 8, 8})}}); });
  EXPECT_NE(msg.find("'sample'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[B, 3, H, W]"), std::string::npos) << msg;
  msg = error_of([&] { vae->call("forward", {{"sample", at::randn({3, 8, 8})}}); });
  EXPECT_NE(msg.find("[3, 8, 8]"), std::string::npos) << msg;
  msg = error_of([&] { vae->call("decode", {{"latents", at::randn({1, 16, 8, 8})}}); });
  EXPECT_NE(msg.find("unknown input 'latents'"), std::string::npos) << msg;
  msg = error_of([&] { vae->call("decode", {}); });
  EXPECT_NE(msg.find("missing input 'z'"), std::string::npos) << msg;
  msg = error_of([&] { vae->call("sample", {}); });
  EXPECT_NE(msg.find("no method 'sample'"), std::string::npos) << msg;
  // Unloaded model.
  AutoencoderKL empty(AutoencoderKLConfig::from_json(nlohmann::json::object()));
  msg = error_of([&] { empty.call("decode", {{"z", at::randn({1, 4, 8, 8})}}); });
  EXPECT_NE(msg.find("loaded"), std::string::npos) << msg;
}

TEST(AutoencoderKLConfigTest, DiffusersDefaultsAndErrors) {
  auto c = AutoencoderKLConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(c.in_channels, 3);
  EXPECT_EQ(c.out_channels, 3);
  EXPECT_EQ(c.block_out_channels, (std::vector<int64_t>{64}));
  EXPECT_EQ(c.layers_per_block, 1);
  EXPECT_EQ(c.latent_channels, 4);
  EXPECT_EQ(c.norm_num_groups, 32);
  EXPECT_EQ(c.sample_size, 32);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 0.18215);
  EXPECT_FALSE(c.shift_factor.has_value());
  EXPECT_TRUE(c.use_quant_conv);
  EXPECT_TRUE(c.use_post_quant_conv);
  EXPECT_TRUE(c.mid_block_add_attention);
  EXPECT_TRUE(c.force_upcast);

  auto flux = AutoencoderKLConfig::from_json(
      {{"block_out_channels", {128, 256, 512, 512}},
       {"down_block_types", std::vector<std::string>(4, "DownEncoderBlock2D")},
       {"up_block_types", std::vector<std::string>(4, "UpDecoderBlock2D")},
       {"sample_size", {1024, 1024}},
       {"shift_factor", 0.1159},
       {"scaling_factor", 0.3611}});
  EXPECT_EQ(flux.sample_size, 1024);
  EXPECT_DOUBLE_EQ(*flux.shift_factor, 0.1159);
  AutoencoderKL model(flux);
  EXPECT_EQ(model.spatial_scale(), 8);
  EXPECT_EQ(model.tile_latent_min_size(), 128);

  std::string msg = error_of([] {
    AutoencoderKLConfig::from_json({{"down_block_types", {"AttnDownEncoderBlock2D"}}},
                                   "vae/c.json");
  });
  EXPECT_NE(msg.find("AttnDownEncoderBlock2D"), std::string::npos) << msg;
  msg = error_of([] { AutoencoderKLConfig::from_json({{"latent_channels", "16"}}, "vae/c.json"); });
  EXPECT_NE(msg.find("latent_channels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vae/c.json"), std::string::npos) << msg;
  msg = error_of([] { AutoencoderKLConfig::from_json({{"act_fn", "tanhh"}}); });
  EXPECT_NE(msg.find("tanhh"), std::string::npos) << msg;
  msg = error_of([] { AutoencoderKLConfig::from_json({{"norm_num_groups", 3}}); });
  EXPECT_NE(msg.find("norm_num_groups"), std::string::npos) << msg;
}

TEST(AutoencoderKLRegistry, CreatesFromClassName) {
  ensure_registered();
  auto c = ComponentRegistry::create("AutoencoderKL", {{"latent_channels", 16}}, "mem");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->class_name(), "AutoencoderKL");
  auto methods = c->methods();
  EXPECT_NE(std::find(methods.begin(), methods.end(), "decode"), methods.end());
  EXPECT_NE(std::find(methods.begin(), methods.end(), "encode"), methods.end());
}

}  // namespace
