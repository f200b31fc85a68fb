// WanTransformer3DModel: the diffusers v0.33.1 fixtures (T2V, and Wan2.1-I2V with the image
// cross-attention) through call("forward"), the registry and `xfuser forward`; patchify /
// unpatchify against diffusers' Conv3d and final permute; the token path on a subset of the
// tokens (RoPE per token); a model split into two parts; the attention calls' flags; parameter
// counts; the config, tensor-parallel shapes and input errors.
#include <fstream>
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
#include "models/registry.h"
#include "models/wan/wan_transformer.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::expect_error_containing;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

namespace fs = std::filesystem;
using xfuser::models::AttentionCall;
using xfuser::models::LoadOptions;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorParallel;
using xfuser::models::dit::DiTPart;
using xfuser::models::wan::WanConfig;
using xfuser::models::wan::WanTransformer3DModel;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

// T2V, and I2V (image_dim, added_kv_proj_dim, 257 image tokens).
const std::vector<std::string> kCases = {"wan-tiny-s1", "wan-i2v-tiny-s1"};

fs::path fixture_case(const std::string& name) {
  return fixtures_dir() / "diffusers-v0.33.1" / name;
}

WanConfig fixture_config(const std::string& name) {
  auto path = fixture_case(name) / "config.json";
  return WanConfig::from_json(read_json(path), path.string());
}

std::shared_ptr<WanTransformer3DModel> load_fixture_model(const std::string& name,
                                                          c10::ScalarType dtype,
                                                          DiTPart part = {}) {
  auto model = std::make_shared<WanTransformer3DModel>(fixture_config(name), part);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  LoadOptions opts;
  opts.allow_unexpected = part.embedders == false || part.head == false || part.block_begin != 0 ||
                          part.block_end != -1;
  model->load(weights, dtype, "", opts);
  return model;
}

class WanTest : public ::testing::Test {
 protected:
  void SetUp() override { xfuser::models::register_builtin_components(); }
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(WanTest, ConfigDefaultsFollowDiffusers) {
  auto c = WanConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(c.patch_size, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(c.num_attention_heads, 40);
  EXPECT_EQ(c.attention_head_dim, 128);
  EXPECT_EQ(c.in_channels, 16);
  EXPECT_EQ(c.resolved_out_channels(), 16);
  EXPECT_EQ(c.text_dim, 4096);
  EXPECT_EQ(c.freq_dim, 256);
  EXPECT_EQ(c.ffn_dim, 13824);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_TRUE(c.cross_attn_norm);
  EXPECT_EQ(c.qk_norm.value_or(""), "rms_norm_across_heads");
  EXPECT_DOUBLE_EQ(c.eps, 1e-6);
  EXPECT_FALSE(c.image_dim.has_value());
  EXPECT_FALSE(c.added_kv_proj_dim.has_value());
  EXPECT_EQ(c.rope_max_seq_len, 1024);
  // The RoPE split for head dim 128 is (44, 42, 42); for 12 it is (4, 4, 4).
  EXPECT_EQ(c.rope_axes_dims(), (std::vector<int64_t>{44, 42, 42}));
  EXPECT_EQ(fixture_config("wan-tiny-s1").rope_axes_dims(), (std::vector<int64_t>{4, 4, 4}));
  auto i2v = fixture_config("wan-i2v-tiny-s1");
  EXPECT_EQ(i2v.image_dim.value_or(0), 8);
  EXPECT_EQ(i2v.added_kv_proj_dim.value_or(0), 24);
  // out_channels null means in_channels, as in diffusers.
  EXPECT_EQ(WanConfig::from_json({{"in_channels", 36}, {"out_channels", nullptr}})
                .resolved_out_channels(),
            36);
}

TEST_F(WanTest, ConfigErrorsNameTheFileAndField) {
  expect_error_containing(
      [] {
        WanConfig::from_json({{"num_layers", "four"}}, "/x/config.json");
      },
      {"/x/config.json", "num_layers"});
  expect_error_containing(
      [] {
        WanConfig::from_json({{"patch_size", {1, 2}}}, "c.json");
      },
      {"c.json", "patch_size"});
  expect_error_containing(
      [] {
        WanConfig::from_json({{"qk_norm", "rms_norm"}}, "c.json");
      },
      {"c.json", "qk_norm", "rms_norm"});
  expect_error_containing(
      [] {
        WanConfig::from_json({{"image_dim", 8}, {"added_kv_proj_dim", 100}}, "c.json");
      },
      {"c.json", "added_kv_proj_dim"});
  expect_error_containing(
      [] {
        WanConfig::from_json({{"attention_head_dim", 7}}, "c.json");
      },
      {"c.json", "attention_head_dim"});
}

// ---- the diffusers fixtures ---------------------------------------------------------------------

TEST_F(WanTest, FixturesFloat32ThroughCall) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name, at::kFloat);
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

TEST_F(WanTest, FixtureReducedPrecision) {
  const std::string name = "wan-i2v-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto model = load_fixture_model(name, dtype);
    TensorMap in;
    for (const auto& [k, v] : inputs) in[k] = at::isFloatingType(v.scalar_type()) ? v.to(dtype) : v;
    // diffusers' _keep_in_fp32_modules stay float32.
    for (const auto& [n, slot] : model->named_parameters()) {
      const bool kept = n.find("time_embedder") != std::string::npos ||
                        n.find("scale_shift_table") != std::string::npos ||
                        n.find(".norm2.") != std::string::npos ||
                        n.find(".norm1.") != std::string::npos;
      EXPECT_EQ(slot->tensor.scalar_type(), kept ? at::kFloat : dtype) << n;
    }
    auto out = model->call("forward", in).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out.to(at::kFloat), expected);
    std::cout << "[ " << name << " " << dtype << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 5e-2);
  }
}

TEST_F(WanTest, FixturesThroughTheRegistry) {
  ASSERT_NE(xfuser::models::dit::DiTRegistry::find("WanTransformer3DModel"), nullptr);
  bool family = false;
  for (const auto& f : xfuser::models::FamilyRegistry::all()) family = family || f.name == "wan";
  EXPECT_TRUE(family);
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto component = xfuser::models::load_component(fixture_case(name).string(), at::kFloat);
    EXPECT_EQ(component->class_name(), "WanTransformer3DModel");
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto out = component->call("forward", inputs).at("sample");
    auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
    EXPECT_LE(max_rel_error(out, expected), 1e-4);
  }
}

TEST_F(WanTest, XfuserForwardToolOnTheFixtures) {
  const fs::path bin = xfuser::testing::binary_dir() / "bin" / "xfuser";
  ASSERT_TRUE(fs::exists(bin)) << "xfuser binary not built: " << bin;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  TempDir tmp("xfuser-wan-forward");
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
  // An I2V model without its image embeddings exits non-zero naming the missing input.
  const std::string name = "wan-i2v-tiny-s1";
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  inputs.erase("encoder_hidden_states_image");
  const fs::path bad = tmp / "bad.safetensors";
  xfuser::models::save_safetensors(bad.string(), {inputs.begin(), inputs.end()});
  std::string log;
  const int rc = run_command(q(bin) + " forward --model-dir " + q(fixture_case(name)) +
                                 " --inputs " + q(bad) + " --output " + q(tmp / "x.safetensors"),
                             &log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("encoder_hidden_states_image"), std::string::npos) << log;
}

// ---- token layout -------------------------------------------------------------------------------

TEST_F(WanTest, PatchifyIsTheConv3dAndUnpatchifyIsDiffusersPermute) {
  const std::string name = "wan-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  auto w = weights.get("patch_embedding.weight"), b = weights.get("patch_embedding.bias");
  // A patch (2, 2, 2) on a 4 x 6 x 4 video checks the order with every patch side > 1.
  const std::vector<int64_t> patch = {2, 2, 2};
  auto x = at::randn({2, 3, 4, 6, 4});
  auto tokens = WanTransformer3DModel::patchify(x, patch);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 2 * 3 * 2, 3 * 8}));
  auto w3 = at::randn({5, 3, 2, 2, 2});
  auto conv = at::conv3d(x, w3, {}, {2, 2, 2}).flatten(2).transpose(1, 2);  // [B, N, 5]
  EXPECT_LE(max_rel_error(at::linear(tokens, w3.reshape({5, -1})), conv), 1e-6);
  // The fixture's patch embedding: embed() = diffusers' conv + flatten + transpose.
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto hs = inputs.at("hidden_states");
  auto din = model->parse_forward_inputs(inputs);
  auto a = model->embed(din);
  auto ref = at::conv3d(hs, w, b, {1, 2, 2}).flatten(2).transpose(1, 2);
  EXPECT_LE(max_rel_error(a.hidden, ref), 1e-6);
  // token ids: (f, h, w) row-major.
  auto ids = WanTransformer3DModel::token_ids(2, 3, 4, hs.options());
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{24, 3}));
  EXPECT_EQ(ids[17][0].item<float>(), 1.f);  // 17 = 1*12 + 1*4 + 1
  EXPECT_EQ(ids[17][1].item<float>(), 1.f);
  EXPECT_EQ(ids[17][2].item<float>(), 1.f);
  EXPECT_EQ(ids[11][1].item<float>(), 2.f);
  EXPECT_EQ(ids[11][2].item<float>(), 3.f);
  // unpatchify: diffusers' reshape [B, F', H', W', pt, ph, pw, C], permute(0,7,1,4,2,5,3,6) and
  // flatten(6,7).flatten(4,5).flatten(2,3).
  auto out_tokens = at::randn({2, 12, 8 * 3});
  auto expect = out_tokens.reshape({2, 2, 3, 2, 2, 2, 2, 3})
                    .permute({0, 7, 1, 4, 2, 5, 3, 6})
                    .flatten(6, 7)
                    .flatten(4, 5)
                    .flatten(2, 3);
  EXPECT_TRUE(at::equal(WanTransformer3DModel::unpatchify(out_tokens, 2, 3, 2, patch, 3), expect));
  // The output tokens have the channel fastest (proj_out's layout), the input tokens slowest
  // (the conv weight's): unpatchify inverts patchify only after moving the channel.
  auto moved = tokens.reshape({2, 12, 3, 8}).transpose(2, 3).reshape({2, 12, 24});
  EXPECT_TRUE(at::equal(WanTransformer3DModel::unpatchify(moved, 2, 3, 2, patch, 3), x));
}

TEST_F(WanTest, EmbedOfATokenSubsetIsTheRowsOfTheFullEmbed) {
  const std::string name = "wan-i2v-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto full = model->parse_forward_inputs(inputs);
  auto a = model->embed(full);
  // Tokens 10..25 of the 2 x 4 x 4 grid (crossing the frame boundary at 16): patch rows and
  // rotary rows.
  ASSERT_EQ(full.tokens.size(1), 32);
  auto sub = full;
  sub.tokens = full.tokens.narrow(1, 10, 16);
  sub.token_ids = full.token_ids.narrow(0, 10, 16);
  auto s = model->embed(sub);
  // (a matmul over fewer rows may block differently: equal to rounding)
  EXPECT_LE(max_rel_error(s.hidden, a.hidden.narrow(1, 10, 16)), 1e-6);
  EXPECT_TRUE(at::equal(s.rope.cos, a.rope.cos.narrow(0, 10, 16)));
  EXPECT_TRUE(at::equal(s.rope.sin, a.rope.sin.narrow(0, 10, 16)));
  EXPECT_TRUE(at::equal(s.context, a.context));
  EXPECT_EQ(a.context.size(1), 257 + 12);  // image embeddings first, as diffusers concatenates
  // Token 22 is (f, h, w) = (1, 1, 2): per axis (4 dims each) the angles pos * [1, 1/100],
  // each repeated for its (2i, 2i+1) pair (diffusers' complex freqs, interleaved).
  auto angles =
      at::tensor({1.0, 1.0, 0.01, 0.01, 1.0, 1.0, 0.01, 0.01, 2.0, 2.0, 0.02, 0.02}, at::kDouble);
  EXPECT_LE(max_rel_error(a.rope.cos.select(0, 22), at::cos(angles)), 1e-6);
  EXPECT_LE(max_rel_error(a.rope.sin.select(0, 22), at::sin(angles)), 1e-6);
}

// The image tokens are however many the image encoder gives (diffusers 0.42 takes the first
// L - 512 context tokens, not a fixed 257): two copies of the 257 image tokens are 514 keys and
// values of the same softmax weights each halved, so the output is the 257-token one; a split at
// a fixed 257 would attend the copy as text instead.
TEST_F(WanTest, ImageTokensAreWhateverTheImageEncoderGave) {
  const std::string name = "wan-i2v-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  const at::Tensor once = model->call("forward", inputs).at("sample");
  const at::Tensor image = inputs.at("encoder_hidden_states_image");
  ASSERT_EQ(image.size(1), 257);
  inputs["encoder_hidden_states_image"] = at::cat({image, image}, 1);
  const at::Tensor twice = model->call("forward", inputs).at("sample");
  EXPECT_LE(max_rel_error(twice, once), 1e-5);
  // Fewer tokens (the first 100) is a different image context, and runs.
  inputs["encoder_hidden_states_image"] = image.narrow(1, 0, 100);
  const at::Tensor fewer = model->call("forward", inputs).at("sample");
  EXPECT_GT(max_rel_error(fewer, once), 1e-4);
}

TEST_F(WanTest, TimestepBroadcastsOverTheBatch) {
  const std::string name = "wan-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto one = model->call("forward", inputs).at("sample");
  TensorMap two = inputs;
  two["hidden_states"] = at::cat({inputs["hidden_states"], inputs["hidden_states"]}, 0);
  two["encoder_hidden_states"] =
      at::cat({inputs["encoder_hidden_states"], inputs["encoder_hidden_states"]}, 0);
  auto out = model->call("forward", two).at("sample");  // timestep [1] for a batch of 2
  ASSERT_EQ(out.size(0), 2);
  EXPECT_LE(max_rel_error(out.narrow(0, 1, 1), one), 1e-5);
  // A float timestep equals the int64 one.
  TensorMap f = inputs;
  f["timestep"] = inputs["timestep"].to(at::kFloat);
  EXPECT_LE(max_rel_error(model->call("forward", f).at("sample"), one), 1e-6);
}

TEST_F(WanTest, TwoPartsChainedEqualTheWholeModel) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto whole = load_fixture_model(name, at::kFloat);
    const auto tokens_in = whole->parse_forward_inputs(inputs);
    const auto want = whole->forward(tokens_in);
    auto first = load_fixture_model(name, at::kFloat, DiTPart{0, 1, true, false});
    auto second = load_fixture_model(name, at::kFloat, DiTPart{1, -1, false, true});
    EXPECT_EQ(second->part().block_end, 2);
    // The condition embedder is on both parts.
    EXPECT_EQ(first->num_parameters() + second->num_parameters(),
              whole->num_parameters() + whole->other_parameters()[1]);
    auto a = first->embed(tokens_in);
    first->run_blocks(a, 0, 1);
    EXPECT_THROW(first->finalize(a), xfuser::Error);
    auto b = second->embed(tokens_in);
    EXPECT_FALSE(b.hidden.defined());
    EXPECT_TRUE(b.context.defined());  // every part computes the text conditioning itself
    b.hidden = a.hidden;               // only the image stream travels between stages
    second->run_blocks(b, 1, 2);
    EXPECT_TRUE(at::equal(second->finalize(b), want));
    expect_error_containing([&] { second->run_blocks(b, 0, 1); }, {"blocks.0", "not held"});
  }
}

TEST_F(WanTest, AttentionCallsSelfThenCross) {
  const std::string name = "wan-i2v-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  const auto want = model->call("forward", inputs).at("sample");
  struct Seen {
    int64_t layer, text_tokens, q_len, k_len;
    bool cross;
  };
  std::vector<Seen> seen;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionCall& call) {
    seen.push_back({call.layer, call.text_tokens, q.size(1), k.size(1), call.cross});
    return xfuser::models::local_attention(q, k, v, call);
  });
  auto got = model->call("forward", inputs).at("sample");
  model->set_attention_hook({});
  EXPECT_TRUE(at::equal(got, want));
  // Per block: attn1 (self, layer i), attn2's image attention (layer 2L + i), attn2's text
  // attention (layer L + i).
  ASSERT_EQ(seen.size(), 6u);
  for (int64_t i = 0; i < 2; ++i) {
    const auto& s = seen[3 * i];
    EXPECT_EQ(s.layer, i);
    EXPECT_FALSE(s.cross);
    EXPECT_EQ(s.text_tokens, 0);
    EXPECT_EQ(s.k_len, 32);
    const auto& img = seen[3 * i + 1];
    EXPECT_EQ(img.layer, 4 + i);
    EXPECT_TRUE(img.cross);
    EXPECT_EQ(img.k_len, 257);
    const auto& txt = seen[3 * i + 2];
    EXPECT_EQ(txt.layer, 2 + i);
    EXPECT_TRUE(txt.cross);
    EXPECT_EQ(txt.q_len, 32);
    EXPECT_EQ(txt.k_len, 12);
  }
  EXPECT_EQ(model->text_attention(), xfuser::models::dit::TextAttention::kCross);
}

TEST_F(WanTest, ParameterCountsPartitionTheModel) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    WanTransformer3DModel model(fixture_config(name));
    int64_t sum = 0;
    for (auto p : model.block_parameters()) sum += p;
    for (auto p : model.other_parameters()) sum += p;
    EXPECT_EQ(sum, model.num_parameters());
    EXPECT_EQ(sum, read_json(fixture_case(name) / "case.json")["num_parameters"].get<int64_t>());
  }
}

TEST_F(WanTest, TensorParallelNeedsWholeHeads) {
  // 2 heads over 4 ranks (the tensor-parallel forward itself: test_wan_sequence_parallel).
  expect_error_containing(
      [] {
        WanTransformer3DModel model(fixture_config("wan-tiny-s1"), {}, TensorParallel{0, 4});
      },
      {"num_attention_heads 2", "tensor parallel degree 4"});
  // A rank of 2 holds half of every head-sharded tensor, the QK norm weights included.
  WanTransformer3DModel half(fixture_config("wan-tiny-s1"), {}, TensorParallel{1, 2});
  for (const auto& [n, slot] : half.named_parameters()) {
    if (n == "blocks.0.attn1.norm_q.weight" || n == "blocks.0.attn2.to_k.bias") {
      EXPECT_EQ(slot->shape, std::vector<int64_t>{12}) << n;
    }
    if (n == "blocks.0.ffn.net.2.weight") {
      EXPECT_EQ(slot->shape, (std::vector<int64_t>{24, 16})) << n;
    }
  }
}

TEST_F(WanTest, BadInputsNameTheInput) {
  for (const auto& name : kCases) XF_REQUIRE_FIXTURE(fixture_case(name));
  auto t2v = load_fixture_model("wan-tiny-s1", at::kFloat);
  auto i2v = load_fixture_model("wan-i2v-tiny-s1", at::kFloat);
  const auto t2v_in = read_tensors(fixture_case("wan-tiny-s1") / "inputs.safetensors");
  const auto i2v_in = read_tensors(fixture_case("wan-i2v-tiny-s1") / "inputs.safetensors");
  auto with = [](TensorMap m, const std::string& k, const at::Tensor& v) {
    if (v.defined()) {
      m[k] = v;
    } else {
      m.erase(k);
    }
    return m;
  };
  auto fails = [&](WanTransformer3DModel& m, const TensorMap& in,
                   const std::vector<std::string>& needles) {
    expect_error_containing([&] { m.call("forward", in); }, needles);
  };
  fails(*t2v, with(t2v_in, "hidden_states", at::randn({1, 4, 16, 16})),
        {"hidden_states", "[B, 4, F, H, W]"});
  fails(*t2v, with(t2v_in, "hidden_states", at::randn({1, 4, 2, 15, 16})),
        {"hidden_states", "patch_size"});
  fails(*t2v, with(t2v_in, "hidden_states", at::randn({1, 4, 2, 66, 16})),
        {"hidden_states", "rope_max_seq_len"});
  fails(*t2v, with(t2v_in, "encoder_hidden_states", at::randn({1, 12, 15})),
        {"encoder_hidden_states", "[1, L, 16]"});
  fails(*t2v, with(t2v_in, "timestep", at::tensor({1, 2, 3})), {"timestep"});
  fails(*t2v, with(t2v_in, "timestep", at::Tensor()), {"timestep", "missing"});
  fails(*t2v, with(t2v_in, "img_ids", at::zeros({4, 3})), {"img_ids", "accepted inputs"});
  fails(*t2v, with(t2v_in, "encoder_hidden_states_image", at::randn({1, 257, 8})),
        {"encoder_hidden_states_image", "image_dim"});
  fails(*i2v, with(i2v_in, "encoder_hidden_states_image", at::Tensor()),
        {"encoder_hidden_states_image", "missing"});
  fails(*i2v, with(i2v_in, "encoder_hidden_states_image", at::randn({1, 257, 7})),
        {"encoder_hidden_states_image", "[1, L_img, 8]", "[1, 257, 7]"});
  // token level: ids outside the rotary table, ids of the wrong width.
  auto din = t2v->parse_forward_inputs(t2v_in);
  auto bad = din;
  bad.token_ids = din.token_ids + 40;
  expect_error_containing([&] { t2v->forward(bad); }, {"token_ids", "rope_max_seq_len"});
  bad.token_ids = din.token_ids.narrow(1, 0, 2);
  expect_error_containing([&] { t2v->forward(bad); }, {"token_ids", "3]"});
}

}  // namespace
