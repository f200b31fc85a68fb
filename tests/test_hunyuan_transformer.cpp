// HunyuanVideoTransformer3DModel: the diffusers v0.33.1 fixtures (the tiny one, and a larger one
// with 2 + 2 blocks, patch 2, latent_concat channels and padded text in a batch of 2) through
// call("forward"), the registry and `xfuser forward`; patchify / unpatchify against diffusers'
// Conv3d and final permute; the rotary tables; the token path on a subset of the tokens; models
// split into two parts (PipeFusion stages); the attention calls and the text mask's semantics;
// parameter counts; the config and input errors.
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/dit/dit.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
namespace fs = std::filesystem;
using xfuser::models::AttentionCall;
using xfuser::models::LoadOptions;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorParallel;
using xfuser::models::dit::DiTPart;
using xfuser::models::hunyuan_video::HunyuanVideoConfig;
using xfuser::models::hunyuan_video::HunyuanVideoTransformer3DModel;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

const std::string kTiny = "hunyuan_video-tiny-s1";
const std::string kMasked = "hunyuan_video-masked-s1";
const std::vector<std::string> kCases = {kTiny, kMasked};

fs::path fixture_case(const std::string& name) {
  return fixtures_dir() / "diffusers-v0.33.1" / name;
}

HunyuanVideoConfig fixture_config(const std::string& name) {
  auto path = fixture_case(name) / "config.json";
  return HunyuanVideoConfig::from_json(read_json(path), path.string());
}

std::shared_ptr<HunyuanVideoTransformer3DModel> load_fixture_model(const std::string& name,
                                                                   DiTPart part = {}) {
  auto model = std::make_shared<HunyuanVideoTransformer3DModel>(fixture_config(name), part);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  LoadOptions opts;
  opts.allow_unexpected =
      !part.embedders || !part.head || part.block_begin != 0 || part.block_end != -1;
  model->load(weights, at::kFloat, "", opts);
  return model;
}

class HunyuanTest : public ::testing::Test {
 protected:
  void SetUp() override { xfuser::models::register_builtin_components(); }
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(HunyuanTest, ConfigDefaultsFollowDiffusers) {
  auto c = HunyuanVideoConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(c.in_channels, 16);
  EXPECT_EQ(c.resolved_out_channels(), 16);
  EXPECT_EQ(c.num_attention_heads, 24);
  EXPECT_EQ(c.attention_head_dim, 128);
  EXPECT_EQ(c.num_layers, 20);
  EXPECT_EQ(c.num_single_layers, 40);
  EXPECT_EQ(c.num_refiner_layers, 2);
  EXPECT_DOUBLE_EQ(c.mlp_ratio, 4.0);
  EXPECT_EQ(c.patch_size, 2);
  EXPECT_EQ(c.patch_size_t, 1);
  EXPECT_EQ(c.qk_norm, "rms_norm");
  EXPECT_TRUE(c.guidance_embeds);
  EXPECT_EQ(c.text_embed_dim, 4096);
  EXPECT_EQ(c.pooled_projection_dim, 768);
  EXPECT_DOUBLE_EQ(c.rope_theta, 256.0);
  EXPECT_EQ(c.rope_axes_dim, (std::vector<int64_t>{16, 56, 56}));
  EXPECT_FALSE(c.image_condition_type.has_value());
  EXPECT_EQ(c.output_dim(), 16 * 4);
  auto m = fixture_config(kMasked);
  EXPECT_EQ(m.image_condition_type.value_or(""), "latent_concat");
  EXPECT_EQ(m.token_channels(), 8 * 4);
  EXPECT_EQ(m.output_dim(), 4 * 4);
  EXPECT_EQ(m.mlp_dim(), 72);
  EXPECT_EQ(HunyuanVideoConfig::from_json({{"in_channels", 33}, {"out_channels", nullptr}})
                .resolved_out_channels(),
            33);
}

TEST_F(HunyuanTest, ConfigErrorsNameTheFileAndField) {
  expect_error_containing(
      [] {
        HunyuanVideoConfig::from_json({{"num_layers", "x"}}, "/c.json");
      },
      {"/c.json", "num_layers"});
  expect_error_containing(
      [] {
        HunyuanVideoConfig::from_json({{"rope_axes_dim", {16, 56, 54}}}, "c.json");
      },
      {"c.json", "rope_axes_dim", "attention_head_dim 128"});
  expect_error_containing(
      [] {
        HunyuanVideoConfig::from_json({{"image_condition_type", "token_replace"}}, "c.json");
      },
      {"c.json", "token_replace", "not supported"});
  expect_error_containing(
      [] {
        HunyuanVideoConfig::from_json({{"qk_norm", "layer_norm"}}, "c.json");
      },
      {"c.json", "qk_norm"});
}

// ---- the diffusers fixtures ---------------------------------------------------------------------

TEST_F(HunyuanTest, FixturesFloat32ThroughCall) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name);
    EXPECT_EQ(model->num_parameters(),
              read_json(fixture_case(name) / "case.json")["num_parameters"].get<int64_t>());
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto expected = read_tensors(fixture_case(name) / "output.safetensors");
    auto out = model->call("forward", inputs).at("sample");
    ASSERT_EQ(out.sizes(), expected.at("sample").sizes());
    const double err = max_rel_error(out, expected.at("sample"));
    const double err64 = max_rel_error(out, expected.at("sample_f64"));
    std::cout << "[ " << name << " fp32 ] max rel error vs sample " << err << ", vs sample_f64 "
              << err64 << std::endl;
    EXPECT_LE(err, 1e-4);
    EXPECT_LE(err64, 1e-4);
  }
}

TEST_F(HunyuanTest, FixtureReducedPrecision) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto expected = read_tensors(fixture_case(kMasked) / "output.safetensors").at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto model = std::make_shared<HunyuanVideoTransformer3DModel>(fixture_config(kMasked));
    SafetensorsFile weights(
        (fixture_case(kMasked) / "diffusion_pytorch_model.safetensors").string());
    model->load(weights, dtype);
    EXPECT_EQ(model->dtype(), dtype);
    // The activations in the reduced dtype; timestep and guidance (6000 is not a bfloat16) and
    // the mask as given.
    TensorMap in = inputs;
    for (const auto* k : {"hidden_states", "encoder_hidden_states", "pooled_projections"}) {
      in[k] = inputs.at(k).to(dtype);
    }
    auto out = model->call("forward", in).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out.to(at::kFloat), expected);
    std::cout << "[ " << kMasked << " " << dtype << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, dtype == at::kHalf ? 5e-3 : 3e-2);  // measured 9.4e-4 and 7.6e-3
  }
}

TEST_F(HunyuanTest, FixturesThroughTheRegistry) {
  ASSERT_NE(xfuser::models::dit::DiTRegistry::find("HunyuanVideoTransformer3DModel"), nullptr);
  bool family = false;
  for (const auto& f : xfuser::models::FamilyRegistry::all()) {
    family = family || f.name == "hunyuan_video";
  }
  EXPECT_TRUE(family);
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto component = xfuser::models::load_component(fixture_case(name).string(), at::kFloat);
    EXPECT_EQ(component->class_name(), "HunyuanVideoTransformer3DModel");
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto out = component->call("forward", inputs).at("sample");
    auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
    EXPECT_LE(max_rel_error(out, expected), 1e-4);
  }
}

TEST_F(HunyuanTest, XfuserForwardToolOnTheFixtures) {
  const fs::path bin = xfuser::testing::binary_dir() / "bin" / "xfuser";
  ASSERT_TRUE(fs::exists(bin)) << "xfuser binary not built: " << bin;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  TempDir tmp("xfuser-hunyuan-forward");
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    const fs::path out = tmp / (name + ".safetensors");
    std::string log;
    const int rc = run_command(q(bin) + " forward --model-dir " + q(fixture_case(name)) +
                                   " --inputs " + q(fixture_case(name) / "inputs.safetensors") +
                                   " --output " + q(out) + " --dtype fp32",
                               &log);
    ASSERT_EQ(rc, 0) << log;
    auto got = read_tensors(out);
    ASSERT_TRUE(got.count("sample")) << log;
    auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
    ASSERT_EQ(got["sample"].sizes(), expected.sizes());
    const double err = max_rel_error(got["sample"], expected);
    std::cout << "[ xfuser forward " << name << " fp32 ] max rel error " << err << std::endl;
    EXPECT_LE(err, 1e-4);
  }
}

// ---- token layout -------------------------------------------------------------------------------

TEST_F(HunyuanTest, TokenPathEqualsCall) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name);
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto in = model->parse_forward_inputs(inputs);
    const auto& c = model->config();
    const auto& hs = inputs.at("hidden_states");
    const int64_t n =
        hs.size(2) / c.patch_size_t * (hs.size(3) / c.patch_size) * (hs.size(4) / c.patch_size);
    EXPECT_EQ(in.tokens.sizes(), (std::vector<int64_t>{hs.size(0), n, c.token_channels()}));
    EXPECT_EQ(in.token_ids.sizes(), (std::vector<int64_t>{n, 3}));
    // A mask of all ones is dropped (what the pipeline does); a padded one stays, as bool.
    EXPECT_EQ(in.text_mask.defined(), name == kMasked);
    if (in.text_mask.defined()) EXPECT_EQ(in.text_mask.scalar_type(), at::kBool);
    auto tokens = model->forward(in);
    EXPECT_EQ(tokens.sizes(), (std::vector<int64_t>{hs.size(0), n, c.output_dim()}));
    auto out = model->forward_outputs(tokens, inputs).at("sample");
    EXPECT_TRUE(at::equal(out, model->call("forward", inputs).at("sample")));
  }
}

TEST_F(HunyuanTest, PatchifyIsTheConv3dAndUnpatchifyIsDiffusersPermute) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  // A patch (2, 2, 2) on a 4 x 6 x 4 video checks the order with every patch side > 1.
  auto x = at::randn({2, 3, 4, 6, 4});
  auto tokens = HunyuanVideoTransformer3DModel::patchify(x, 2, 2);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 2 * 3 * 2, 3 * 8}));
  auto w3 = at::randn({5, 3, 2, 2, 2});
  auto conv = at::conv3d(x, w3, {}, {2, 2, 2}).flatten(2).transpose(1, 2);  // [B, N, 5]
  EXPECT_LE(max_rel_error(at::linear(tokens, w3.reshape({5, -1})), conv), 1e-6);
  // diffusers: reshape [B, F', H', W', C, pt, p, p], permute(0, 4, 1, 5, 2, 6, 3, 7), flattens.
  auto out_tokens = at::randn({2, 12, 3 * 8});
  auto expect = out_tokens.reshape({2, 2, 3, 2, 3, 2, 2, 2})
                    .permute({0, 4, 1, 5, 2, 6, 3, 7})
                    .flatten(6, 7)
                    .flatten(4, 5)
                    .flatten(2, 3);
  EXPECT_TRUE(
      at::equal(HunyuanVideoTransformer3DModel::unpatchify(out_tokens, 2, 3, 2, 2, 2, 3), expect));
  // proj_out's layout is the conv weight's (channel slowest): unpatchify inverts patchify.
  EXPECT_TRUE(at::equal(HunyuanVideoTransformer3DModel::unpatchify(tokens, 2, 3, 2, 2, 2, 3), x));
  // The fixture's x_embedder: embed() = diffusers' conv + flatten + transpose.
  auto model = load_fixture_model(kMasked);
  SafetensorsFile weights((fixture_case(kMasked) / "diffusion_pytorch_model.safetensors").string());
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto a = model->embed(model->parse_forward_inputs(inputs));
  auto ref = at::conv3d(inputs.at("hidden_states"), weights.get("x_embedder.proj.weight"),
                        weights.get("x_embedder.proj.bias"), {1, 2, 2})
                 .flatten(2)
                 .transpose(1, 2);
  EXPECT_LE(max_rel_error(a.hidden, ref), 1e-6);
}

TEST_F(HunyuanTest, RopeIsPerTokenAndImageOnly) {
  // Token (f, h, w) = (2, 1, 3), axes (4, 4, 4), theta 256: per axis the angles pos * [1, 1/16],
  // each repeated for its (2i, 2i+1) pair.
  auto ids = at::tensor({2.0f, 1.0f, 3.0f}).view({1, 3});
  auto r = HunyuanVideoTransformer3DModel::rope(ids, {4, 4, 4}, 256.0);
  ASSERT_EQ(r.cos.sizes(), (std::vector<int64_t>{1, 12}));
  auto angles = at::tensor(
      {2.0, 2.0, 0.125, 0.125, 1.0, 1.0, 0.0625, 0.0625, 3.0, 3.0, 0.1875, 0.1875}, at::kDouble);
  EXPECT_LE(max_rel_error(r.cos[0], at::cos(angles)), 1e-6);
  EXPECT_LE(max_rel_error(r.sin[0], at::sin(angles)), 1e-6);
  // The grid's ids are (f, h, w) row-major.
  auto grid = HunyuanVideoTransformer3DModel::token_ids(2, 3, 4, at::TensorOptions());
  ASSERT_EQ(grid.sizes(), (std::vector<int64_t>{24, 3}));
  EXPECT_TRUE(at::equal(grid[23], at::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_TRUE(at::equal(grid[17], at::tensor({1.0f, 1.0f, 1.0f})));
}

TEST_F(HunyuanTest, EmbedOfATokenSubsetIsTheRowsOfTheFullEmbed) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto model = load_fixture_model(kMasked);
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto full = model->parse_forward_inputs(inputs);
  auto a = model->embed(full);
  ASSERT_EQ(full.tokens.size(1), 48);
  auto sub = full;  // tokens 10..33, crossing the frame boundary at 16 and 32
  sub.tokens = full.tokens.narrow(1, 10, 24);
  sub.token_ids = full.token_ids.narrow(0, 10, 24);
  auto s = model->embed(sub);
  EXPECT_LE(max_rel_error(s.hidden, a.hidden.narrow(1, 10, 24)), 1e-6);
  EXPECT_TRUE(at::equal(s.rope.cos, a.rope.cos.narrow(0, 10, 24)));
  EXPECT_TRUE(at::equal(s.rope.sin, a.rope.sin.narrow(0, 10, 24)));
  EXPECT_TRUE(at::equal(s.context, a.context));
  // The rotary tables cover the image tokens only (the text is not rotated).
  EXPECT_EQ(a.rope.cos.size(0), 48);
  EXPECT_EQ(a.context.size(1), 7);
}

// ---- the text mask ------------------------------------------------------------------------------

TEST_F(HunyuanTest, TextKeysAreTheFirstSumOfTheMask) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto model = load_fixture_model(kMasked);
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto a = model->embed(model->parse_forward_inputs(inputs));
  // Rows 1111100 and 1110100: diffusers attends text keys j < sum(mask) (key 3 of row 1 too).
  ASSERT_TRUE(a.extra.count("text_key_mask"));
  auto want = at::tensor({1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0}).view({2, 7}).to(at::kBool);
  EXPECT_TRUE(at::equal(a.extra.at("text_key_mask"), want));
  // The attention calls get the [B, N + L] key mask of [image, text].
  std::vector<at::Tensor> masks;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionCall& call) {
    masks.push_back(call.mask);
    return xfuser::models::local_attention(q, k, v, call);
  });
  model->call("forward", inputs);
  model->set_attention_hook({});
  ASSERT_EQ(masks.size(), 4u);
  for (const auto& m : masks) {
    ASSERT_TRUE(m.defined());
    ASSERT_EQ(m.sizes(), (std::vector<int64_t>{2, 48 + 7}));
    EXPECT_TRUE(m.narrow(1, 0, 48).all().item<bool>());
    EXPECT_TRUE(at::equal(m.narrow(1, 48, 7), want));
  }
  // A mask of ones passes no mask; the same forward without the mask is equal to rounding (the
  // refiner then takes the plain mean of the text).
  auto tiny = load_fixture_model(kTiny);
  auto tin = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  auto tokens = tiny->parse_forward_inputs(tin);
  EXPECT_FALSE(tiny->embed(tokens).extra.count("text_key_mask"));
  auto with_mask = tiny->forward(tokens);
  tokens.text_mask = at::Tensor();
  EXPECT_LE(max_rel_error(tiny->forward(tokens), with_mask), 1e-6);
}

TEST_F(HunyuanTest, DroppingThePaddedTextTailIsExactForTheImage) {
  // Batch row 0 (mask 1111100) alone, and with its text cut to the 5 valid tokens and no mask:
  // the padded text rows are never keys, so the image output is the same.
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto model = load_fixture_model(kMasked);
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto expected = read_tensors(fixture_case(kMasked) / "output.safetensors").at("sample");
  TensorMap row;
  for (const auto& [k, v] : inputs) row[k] = v.narrow(0, 0, 1);
  auto one = model->call("forward", row).at("sample");
  EXPECT_LE(max_rel_error(one, expected.narrow(0, 0, 1)), 1e-4);
  TensorMap cut = row;
  cut["encoder_hidden_states"] = row["encoder_hidden_states"].narrow(1, 0, 5);
  cut["encoder_attention_mask"] = row["encoder_attention_mask"].narrow(1, 0, 5);
  EXPECT_LE(max_rel_error(model->call("forward", cut).at("sample"), one), 1e-5);
  // Changing a padded token's embedding changes nothing either (row 0, token 6).
  TensorMap noisy = row;
  noisy["encoder_hidden_states"] = row["encoder_hidden_states"].clone();
  noisy["encoder_hidden_states"][0][6].fill_(3.0);
  EXPECT_LE(max_rel_error(model->call("forward", noisy).at("sample"), one), 1e-6);
}

// ---- parts and attention calls ------------------------------------------------------------------

TEST_F(HunyuanTest, TwoPartsChainedEqualTheWholeModel) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto whole = load_fixture_model(kMasked);
  const auto tokens_in = whole->parse_forward_inputs(inputs);
  const auto want = whole->forward(tokens_in);
  // Split inside the double blocks, at the double/single boundary and inside the single blocks.
  for (int64_t split : {1, 2, 3}) {
    SCOPED_TRACE(split);
    auto first = load_fixture_model(kMasked, DiTPart{0, split, true, false});
    auto second = load_fixture_model(kMasked, DiTPart{split, -1, false, true});
    EXPECT_EQ(second->part().block_end, 4);
    // time_text_embed is on both parts.
    EXPECT_EQ(first->num_parameters() + second->num_parameters(),
              whole->num_parameters() + whole->other_parameters()[1]);
    auto a = first->embed(tokens_in);
    first->run_blocks(a, 0, split);
    EXPECT_THROW(first->finalize(a), xfuser::Error);
    EXPECT_EQ(a.joined, split > 2);
    auto b = second->embed(tokens_in);
    EXPECT_FALSE(b.hidden.defined());
    EXPECT_FALSE(b.context.defined());
    // What a stage sends: the image and text streams, or the joined [image, text] sequence.
    b.hidden = a.hidden;
    b.context = a.context;
    b.joined = a.joined;
    second->run_blocks(b, split, 4);
    EXPECT_TRUE(at::equal(second->finalize(b), want));
    auto fresh = first->embed(tokens_in);
    expect_error_containing([&] { second->run_blocks(fresh, 0, 1); },
                            {"transformer_blocks.0", "not held"});
    expect_error_containing([&] { second->run_blocks(b, 0, 1); }, {"already joined"});
  }
}

TEST_F(HunyuanTest, AttentionCallsAreJointWithTheImageFirst) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  auto model = load_fixture_model(kTiny);
  auto inputs = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  const auto want = model->call("forward", inputs).at("sample");
  struct Seen {
    int64_t layer, text_tokens, q_len;
    bool text_first, cross, masked;
  };
  std::vector<Seen> seen;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionCall& call) {
    seen.push_back({call.layer, call.text_tokens, q.size(1), call.text_first, call.cross,
                    call.mask.defined()});
    return xfuser::models::local_attention(q, k, v, call);
  });
  auto got = model->call("forward", inputs).at("sample");
  model->set_attention_hook({});
  EXPECT_TRUE(at::equal(got, want));
  // The refiner's attention is local (not through the hook): one double, one single block.
  ASSERT_EQ(seen.size(), 2u);
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i].layer, i);
    EXPECT_EQ(seen[i].text_tokens, 12);
    EXPECT_EQ(seen[i].q_len, 256 + 12);
    EXPECT_FALSE(seen[i].text_first);
    EXPECT_FALSE(seen[i].cross);
    EXPECT_FALSE(seen[i].masked);  // an all-ones mask passes none
  }
  EXPECT_EQ(model->text_attention(), xfuser::models::dit::TextAttention::kJointImageFirst);
  EXPECT_FALSE(model->joined_at(0));
  EXPECT_TRUE(model->joined_at(1));
}

TEST_F(HunyuanTest, ParameterCountsPartitionTheModel) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    HunyuanVideoTransformer3DModel model(fixture_config(name));
    int64_t sum = 0;
    for (auto p : model.block_parameters()) sum += p;
    for (auto p : model.other_parameters()) sum += p;
    EXPECT_EQ(sum, model.num_parameters());
    EXPECT_EQ(sum, read_json(fixture_case(name) / "case.json")["num_parameters"].get<int64_t>());
    EXPECT_EQ(model.block_parameters().size(), static_cast<size_t>(model.num_blocks()));
  }
}

TEST_F(HunyuanTest, TensorParallelNeedsWholeHeads) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  expect_error_containing(
      [] {
        HunyuanVideoTransformer3DModel model(fixture_config(kTiny), {}, TensorParallel{0, 4});
      },
      {"num_attention_heads 2", "tensor parallel degree 4"});
  // A rank of 2 holds half of every head-sharded projection; the refiner is replicated.
  HunyuanVideoTransformer3DModel half(fixture_config(kTiny), {}, TensorParallel{1, 2});
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [n, slot] : half.named_parameters()) shapes[n] = slot->shape;
  EXPECT_EQ(shapes.at("transformer_blocks.0.attn.to_q.weight"), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(shapes.at("single_transformer_blocks.0.proj_out.weight"),
            (std::vector<int64_t>{20, 50}));
  EXPECT_EQ(shapes.at("context_embedder.token_refiner.refiner_blocks.0.attn.to_q.weight"),
            (std::vector<int64_t>{20, 20}));
}

// ---- input errors -------------------------------------------------------------------------------

TEST_F(HunyuanTest, BadInputsAreClearErrors) {
  XF_REQUIRE_FIXTURE(fixture_case(kMasked));
  auto model = load_fixture_model(kMasked);
  const auto inputs = read_tensors(fixture_case(kMasked) / "inputs.safetensors");
  auto with = [&](const std::string& name, const at::Tensor& t) {
    TensorMap m = inputs;
    if (t.defined()) {
      m[name] = t;
    } else {
      m.erase(name);
    }
    return m;
  };
  auto fails = [&](const TensorMap& m, std::vector<std::string> parts) {
    expect_error_containing([&] { model->call("forward", m); }, parts);
  };
  fails(with("hidden_states", at::randn({2, 4, 3, 8, 8})), {"hidden_states", "[B, 8, F, H, W]"});
  fails(with("hidden_states", at::randn({2, 8, 3, 7, 8})), {"hidden_states", "multiples"});
  fails(with("hidden_states", {}), {"missing", "hidden_states"});
  fails(with("encoder_hidden_states", at::randn({2, 7, 15})),
        {"encoder_hidden_states", "[2, L, 16]"});
  fails(with("encoder_attention_mask", {}), {"missing", "encoder_attention_mask"});
  fails(with("encoder_attention_mask", at::ones({2, 6})), {"encoder_attention_mask", "[2, 7]"});
  fails(with("encoder_attention_mask", at::full({2, 7}, 0.5)),
        {"encoder_attention_mask", "0 and 1"});
  fails(with("pooled_projections", at::randn({2, 9})), {"pooled_projections", "[2, 8]"});
  fails(with("guidance", {}), {"missing", "guidance", "guidance_embeds"});
  fails(with("timestep", at::ones({3})), {"timestep", "[2]"});
  fails(with("img_ids", at::ones({3})), {"unknown input", "img_ids"});
  // A text split over sequence-parallel ranks (what the drivers do when L divides by the degree)
  // cannot go through the token refiner.
  auto in = model->parse_forward_inputs(inputs);
  EXPECT_EQ(in.extra.at("text_tokens").item<int64_t>(), 7);
  auto half = in;
  half.text = in.text.narrow(1, 0, 3);
  if (in.text_mask.defined()) half.text_mask = in.text_mask.narrow(1, 0, 3);
  expect_error_containing([&] { model->forward(half); },
                          {"holds 3 of the prompt's 7 text tokens", "sequence-parallel"});
  expect_error_containing([&] { model->embed(half); }, {"split over sequence-parallel ranks"});
  half.extra.erase("text_tokens");  // a caller that states nothing is trusted
  EXPECT_EQ(model->forward(half).size(1), 48);
}

}  // namespace
