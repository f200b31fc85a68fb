// SD3Transformer2DModel: the diffusers v0.33.1 fixtures (SD3 and SD3.5: dual attention, RMS QK
// norms) through call("forward"), the registry and `xfuser forward`; the stored position table;
// patchify / unpatchify against diffusers' conv and einsum; the token path on a subset of the
// tokens; a model split into two parts; the attention hook's layout; parameter counts; the config
// and input errors.
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
#include "models/sd3/sd3_transformer.h"
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
using xfuser::models::dit::DiTPart;
using xfuser::models::sd3::SD3Config;
using xfuser::models::sd3::SD3Transformer2DModel;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

// SD3, SD3.5 (dual attention, RMS QK norms), and patch 2 on a 10 x 18 grid cropped from a
// 24 x 24 table with joint_attention_dim != caption_projection_dim.
const std::vector<std::string> kCases = {"sd3-tiny-s1", "sd3-tiny_sd35-s1", "sd3-crop-s1"};

fs::path fixture_case(const std::string& name) {
  return fixtures_dir() / "diffusers-v0.33.1" / name;
}

SD3Config fixture_config(const std::string& name) {
  auto path = fixture_case(name) / "config.json";
  return SD3Config::from_json(read_json(path), path.string());
}

std::shared_ptr<SD3Transformer2DModel> load_fixture_model(const std::string& name,
                                                          c10::ScalarType dtype,
                                                          DiTPart part = {}) {
  auto model = std::make_shared<SD3Transformer2DModel>(fixture_config(name), part);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  LoadOptions opts;
  opts.allow_unexpected = part.embedders == false || part.head == false || part.block_begin != 0 ||
                          part.block_end != -1;
  model->load(weights, dtype, "", opts);
  return model;
}

// A random SD3.5-style model with patch 2 (the fixtures use patch 1).
SD3Config patch2_config() {
  SD3Config c;
  c.sample_size = 16;
  c.patch_size = 2;
  c.in_channels = 4;
  c.out_channels = 3;
  c.num_layers = 3;
  c.attention_head_dim = 8;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.caption_projection_dim = 16;
  c.pooled_projection_dim = 12;
  c.pos_embed_max_size = 12;
  c.dual_attention_layers = {1};
  c.qk_norm = "rms_norm";
  return c;
}

TensorMap random_inputs(const SD3Config& c, int64_t b, int64_t h, int64_t w, int64_t l) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  TensorMap in;
  in["hidden_states"] = at::empty({b, c.in_channels, h, w}).normal_(0, 1, gen);
  in["encoder_hidden_states"] = at::empty({b, l, c.joint_attention_dim}).normal_(0, 1, gen);
  in["pooled_projections"] = at::empty({b, c.pooled_projection_dim}).normal_(0, 1, gen);
  in["timestep"] = at::tensor(std::vector<int64_t>(b, 500), at::kLong);
  return in;
}

class SD3Test : public ::testing::Test {
 protected:
  void SetUp() override { xfuser::models::register_builtin_components(); }
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(SD3Test, ConfigDefaultsFollowDiffusers) {
  auto c = SD3Config::from_json(nlohmann::json::object());
  EXPECT_EQ(c.sample_size, 128);
  EXPECT_EQ(c.patch_size, 2);
  EXPECT_EQ(c.in_channels, 16);
  EXPECT_EQ(c.num_layers, 18);
  EXPECT_EQ(c.attention_head_dim, 64);
  EXPECT_EQ(c.num_attention_heads, 18);
  EXPECT_EQ(c.joint_attention_dim, 4096);
  EXPECT_EQ(c.caption_projection_dim, 1152);
  EXPECT_EQ(c.pooled_projection_dim, 2048);
  EXPECT_EQ(c.resolved_out_channels(), 16);
  EXPECT_EQ(c.max_grid(), 96);
  EXPECT_TRUE(c.dual_attention_layers.empty());
  EXPECT_FALSE(c.qk_norm.has_value());
  // out_channels null means in_channels, as in diffusers.
  auto c2 = SD3Config::from_json({{"in_channels", 4}, {"out_channels", nullptr}});
  EXPECT_EQ(c2.resolved_out_channels(), 4);
  if (fs::exists(fixture_case("sd3-tiny_sd35-s1"))) {
    auto sd35 = fixture_config("sd3-tiny_sd35-s1");
    EXPECT_EQ(sd35.dual_attention_layers, std::vector<int64_t>{0});
    EXPECT_EQ(sd35.qk_norm.value_or(""), "rms_norm");
  }
}

TEST_F(SD3Test, ConfigErrorsNameTheFileAndField) {
  expect_error_containing(
      [] {
        SD3Config::from_json({{"num_layers", "four"}}, "/x/config.json");
      },
      {"/x/config.json", "num_layers"});
  expect_error_containing(
      [] {
        SD3Config::from_json({{"qk_norm", "layer_norm"}}, "cfg.json");
      },
      {"cfg.json", "qk_norm", "layer_norm"});
  expect_error_containing(
      [] {
        SD3Config::from_json({{"num_layers", 2}, {"dual_attention_layers", {0, 5}}}, "c.json");
      },
      {"c.json", "dual_attention_layers", "5"});
  expect_error_containing(
      [] {
        SD3Config::from_json({{"caption_projection_dim", 100}}, "c.json");
      },
      {"c.json", "caption_projection_dim"});
  expect_error_containing(
      [] {
        SD3Config::from_json({{"pos_embed_max_size", nullptr}}, "c.json");
      },
      {"c.json", "pos_embed_max_size"});
}

// ---- the diffusers fixtures ---------------------------------------------------------------------

TEST_F(SD3Test, FixturesFloat32ThroughCall) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name, at::kFloat);
    const auto c = fixture_config(name);
    // case.json counts nn.Parameters; the stored position table is a buffer.
    EXPECT_EQ(model->num_parameters() - c.max_grid() * c.max_grid() * c.inner_dim(),
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

TEST_F(SD3Test, FixturesReducedPrecision) {
  const std::string name = "sd3-tiny_sd35-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto model = load_fixture_model(name, dtype);
    TensorMap in;
    for (const auto& [k, v] : inputs) in[k] = at::isFloatingType(v.scalar_type()) ? v.to(dtype) : v;
    auto out = model->call("forward", in).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out.to(at::kFloat), expected);
    std::cout << "[ " << name << " " << dtype << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 4e-2);
  }
}

TEST_F(SD3Test, FixturesThroughTheRegistry) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    ASSERT_NE(xfuser::models::dit::DiTRegistry::find("SD3Transformer2DModel"), nullptr);
    auto component = xfuser::models::load_component(fixture_case(name).string(), at::kFloat);
    EXPECT_EQ(component->class_name(), "SD3Transformer2DModel");
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto out = component->call("forward", inputs).at("sample");
    auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
    EXPECT_LE(max_rel_error(out, expected), 1e-4);
  }
}

TEST_F(SD3Test, XfuserForwardToolOnTheFixtures) {
  const fs::path bin = xfuser::testing::binary_dir() / "bin" / "xfuser";
  if (!fs::exists(bin)) GTEST_SKIP() << "xfuser binary not built: " << bin;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  TempDir tmp("xfuser-sd3-forward");
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
  // A wrong input exits non-zero with a message naming it.
  const std::string name = kCases[0];
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  inputs["hidden_states"] = inputs["hidden_states"].narrow(2, 0, 31).contiguous();
  inputs["img_ids"] = at::zeros({4, 3});
  const fs::path bad = tmp / "bad.safetensors";
  xfuser::models::save_safetensors(bad.string(), {inputs.begin(), inputs.end()});
  std::string log;
  const int rc = run_command(q(bin) + " forward --model-dir " + q(fixture_case(name)) +
                                 " --inputs " + q(bad) + " --output " + q(tmp / "x.safetensors"),
                             &log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("img_ids"), std::string::npos) << log;
}

TEST_F(SD3Test, StoredPositionTableIsDiffusersSinCos) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    const auto c = fixture_config(name);
    SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
    auto stored = weights.get("pos_embed.pos_embed");
    auto table = SD3Transformer2DModel::sincos_pos_table(c.inner_dim(), c.max_grid(), c.base_size(),
                                                         stored.options());
    ASSERT_EQ(table.sizes(), stored.select(0, 0).sizes());
    const double err = max_rel_error(table, stored.select(0, 0));
    std::cout << "[ " << name << " ] position table max rel error " << err << std::endl;
    EXPECT_LE(err, 1e-6);
  }
}

// ---- token layout -------------------------------------------------------------------------------

TEST_F(SD3Test, PatchifyIsTheConvAndUnpatchifyIsDiffusersEinsum) {
  const auto c = patch2_config();
  SD3Transformer2DModel model(c);
  model.init_random(3, 0.2);
  auto in = random_inputs(c, 2, 8, 6, 5);
  const auto& hs = in["hidden_states"];
  // The pos_embed projection on tokens equals diffusers' Conv2d(k = s = p) + flatten.
  const auto params = model.named_parameters();
  std::map<std::string, at::Tensor> sd;
  for (const auto& [n, slot] : params) sd[n] = slot->tensor;
  auto conv = at::conv2d(hs, sd["pos_embed.proj.weight"], sd["pos_embed.proj.bias"], {2, 2})
                  .flatten(2)
                  .transpose(1, 2);  // [B, 12, D]
  auto tokens = SD3Transformer2DModel::patchify(hs, 2);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 12, 16}));
  auto mm =
      at::linear(tokens, sd["pos_embed.proj.weight"].reshape({16, -1}), sd["pos_embed.proj.bias"]);
  EXPECT_LE(max_rel_error(mm, conv), 1e-6);
  // Token ids: the centre crop of the 12 x 12 table for a 4 x 3 grid: top 4, left 4.
  auto ids = SD3Transformer2DModel::token_ids(4, 3, 12, hs.options());
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{12, 2}));
  EXPECT_EQ(ids[0][0].item<float>(), 4.f);
  EXPECT_EQ(ids[0][1].item<float>(), 4.f);
  EXPECT_EQ(ids[5][0].item<float>(), 5.f);  // token 5 = row 1, col 2
  EXPECT_EQ(ids[5][1].item<float>(), 6.f);
  // embed() = conv + the cropped table rows.
  xfuser::models::dit::DiTInputs din = model.parse_forward_inputs(in);
  auto a = model.embed(din);
  auto table = sd["pos_embed.pos_embed"].view({12, 12, 16}).narrow(0, 4, 4).narrow(1, 4, 3);
  EXPECT_LE(max_rel_error(a.hidden, conv + table.reshape({1, 12, 16})), 1e-6);
  // unpatchify: reshape [B, h, w, p, q, C] and einsum nhwpqc->nchpwq.
  auto out_tokens = at::randn({2, 12, 2 * 2 * 3});
  auto ref =
      at::einsum("nhwpqc->nchpwq", {out_tokens.reshape({2, 4, 3, 2, 2, 3})}).reshape({2, 3, 8, 6});
  EXPECT_TRUE(at::equal(SD3Transformer2DModel::unpatchify(out_tokens, 4, 3, 2, 3), ref));
  // The whole forward's output is [B, out_C, H, W].
  auto sample = model.call("forward", in).at("sample");
  EXPECT_EQ(sample.sizes(), (std::vector<int64_t>{2, 3, 8, 6}));
}

TEST_F(SD3Test, EmbedOfATokenSubsetIsTheRowsOfTheFullEmbed) {
  const auto c = patch2_config();
  SD3Transformer2DModel model(c);
  model.init_random(4, 0.2);
  auto in = model.parse_forward_inputs(random_inputs(c, 2, 10, 8, 7));  // 5 x 4 grid
  auto full = model.embed(in);
  for (auto [a, b] : std::vector<std::pair<int64_t, int64_t>>{{0, 7}, {7, 20}, {3, 4}}) {
    auto sub = in;
    sub.tokens = in.tokens.narrow(1, a, b - a);
    sub.token_ids = in.token_ids.narrow(0, a, b - a);
    model.check_inputs(sub);
    auto part = model.embed(sub);
    // Equal up to the matmul's blocking (BLAS sums in a row-count dependent order).
    EXPECT_LE(max_rel_error(part.hidden, full.hidden.narrow(1, a, b - a)), 1e-6)
        << "tokens [" << a << ", " << b << ")";
    // Integer ids embed as the float ones.
    sub.token_ids = sub.token_ids.to(at::kLong);
    EXPECT_TRUE(at::equal(model.embed(sub).hidden, part.hidden));
    EXPECT_TRUE(at::equal(part.temb, full.temb));
    EXPECT_TRUE(at::equal(part.context, full.context));
  }
}

TEST_F(SD3Test, TimestepIsReadAsFloatAndBroadcasts) {
  const auto c = patch2_config();
  SD3Transformer2DModel model(c);
  model.init_random(6, 0.2);
  auto in = random_inputs(c, 2, 8, 8, 3);  // int64 timesteps [500, 500]
  auto want = model.call("forward", in).at("sample");
  in["timestep"] = at::tensor({500.0f});  // float, one value for the batch
  // Equal up to the kernels' batch-size dependent summation order (libtorch 2.x vectorises the
  // [1, D] and [2, D] embeddings differently).
  EXPECT_LE(max_rel_error(model.call("forward", in).at("sample"), want), 1e-6);
  in["timestep"] = at::tensor({500.0f, 20.0f});
  EXPECT_FALSE(at::allclose(model.call("forward", in).at("sample"), want, 1e-3, 1e-4));
}

// ---- parts, hook, counts ------------------------------------------------------------------------

TEST_F(SD3Test, TwoPartsChainedEqualTheWholeModel) {
  const std::string name = "sd3-tiny_sd35-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto whole = load_fixture_model(name, at::kFloat);
  const auto tokens_in = whole->parse_forward_inputs(inputs);
  const auto want = whole->forward(tokens_in);
  for (int64_t k : {1, 3}) {
    SCOPED_TRACE(k);
    auto first = load_fixture_model(name, at::kFloat, DiTPart{0, k, true, false});
    auto second = load_fixture_model(name, at::kFloat, DiTPart{k, -1, false, true});
    EXPECT_EQ(second->part().block_end, 4);
    EXPECT_LT(first->num_parameters(), whole->num_parameters());
    EXPECT_EQ(first->num_parameters() + second->num_parameters(),
              whole->num_parameters() + (whole->other_parameters()[1]));  // temb in both
    auto a = first->embed(tokens_in);
    first->run_blocks(a, 0, k);
    EXPECT_THROW(first->finalize(a), xfuser::Error);
    auto b = second->embed(tokens_in);
    EXPECT_FALSE(b.hidden.defined());
    b.hidden = a.hidden;
    b.context = a.context;
    second->run_blocks(b, k, 4);
    EXPECT_FALSE(b.context.defined());  // the last block keeps no text stream
    EXPECT_TRUE(at::equal(second->finalize(b), want));
    expect_error_containing([&] { second->run_blocks(b, 0, 1); },
                            {"transformer_blocks.0", "not held"});
  }
}

TEST_F(SD3Test, AttentionHookSeesImageThenText) {
  const std::string name = "sd3-tiny_sd35-s1";
  XF_REQUIRE_FIXTURE(fixture_case(name));
  auto model = load_fixture_model(name, at::kFloat);
  auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
  auto want = model->call("forward", inputs).at("sample");
  std::vector<AttentionCall> calls;
  std::vector<int64_t> lengths;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionCall& call) {
    calls.push_back(call);
    lengths.push_back(q.size(1));
    return xfuser::models::local_attention(q, k, v, call);
  });
  auto got = model->call("forward", inputs).at("sample");
  EXPECT_TRUE(at::equal(got, want));
  // Block 0 (dual): joint attention (layer 0) then attn2 (layer num_layers + 0 = 4).
  ASSERT_EQ(calls.size(), 5u);
  const std::vector<int64_t> layers = {0, 4, 1, 2, 3};
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].layer, layers[i]);
    EXPECT_FALSE(calls[i].text_first);
    const bool self = calls[i].layer == 4;
    EXPECT_EQ(calls[i].text_tokens, self ? 0 : 154);
    EXPECT_EQ(lengths[i], self ? 1024 : 1024 + 154);
  }
  EXPECT_EQ(model->text_attention(), xfuser::models::dit::TextAttention::kJointImageFirst);
}

TEST_F(SD3Test, ParameterCountsPartitionTheModel) {
  for (auto cfg : {patch2_config(), SD3Config::from_json({{"num_layers", 3}})}) {
    SD3Transformer2DModel model(cfg);
    auto blocks = model.block_parameters();
    auto other = model.other_parameters();
    ASSERT_EQ(blocks.size(), static_cast<size_t>(cfg.num_layers));
    ASSERT_EQ(other.size(), 3u);
    int64_t sum = 0;
    for (auto n : blocks) sum += n;
    for (auto n : other) sum += n;
    EXPECT_EQ(sum, model.num_parameters());
    EXPECT_EQ(model.num_blocks(), cfg.num_layers);
    EXPECT_EQ(model.hidden_size(), cfg.inner_dim());
  }
}

// ---- input errors -------------------------------------------------------------------------------

TEST_F(SD3Test, BadInputsNameTheInput) {
  const auto c = patch2_config();
  SD3Transformer2DModel model(c);
  model.init_random(5, 0.2);
  auto good = random_inputs(c, 1, 8, 8, 3);
  auto with = [&](const std::string& key, const at::Tensor& t) {
    auto m = good;
    if (t.defined()) {
      m[key] = t;
    } else {
      m.erase(key);
    }
    return m;
  };
  auto run = [&](const TensorMap& m) { return [&model, m] { model.call("forward", m); }; };
  expect_error_containing(run(with("img_ids", at::zeros({4, 3}))), {"unknown input", "img_ids"});
  expect_error_containing(run(with("hidden_states", at::Tensor())), {"missing", "hidden_states"});
  expect_error_containing(run(with("encoder_hidden_states", at::Tensor())),
                          {"missing", "encoder_hidden_states"});
  expect_error_containing(run(with("pooled_projections", at::Tensor())),
                          {"missing", "pooled_projections"});
  expect_error_containing(run(with("timestep", at::Tensor())), {"missing", "timestep"});
  expect_error_containing(run(with("hidden_states", at::zeros({1, 4, 7, 8}))),
                          {"hidden_states", "multiples of patch_size 2"});
  expect_error_containing(run(with("hidden_states", at::zeros({1, 4, 26, 8}))),
                          {"hidden_states", "pos_embed_max_size 12"});
  expect_error_containing(run(with("hidden_states", at::zeros({1, 5, 8, 8}))),
                          {"hidden_states", "[B, 4, H, W]"});
  expect_error_containing(run(with("hidden_states", at::zeros({4, 8, 8}))), {"hidden_states"});
  expect_error_containing(run(with("encoder_hidden_states", at::zeros({1, 3, 23}))),
                          {"encoder_hidden_states", "[1, L, 24]"});
  expect_error_containing(run(with("pooled_projections", at::zeros({2, 12}))),
                          {"pooled_projections", "[1, 12]"});
  expect_error_containing(run(with("timestep", at::zeros({3}))), {"timestep", "[1]"});
  // Token-level inputs: ids outside the table.
  auto in = model.parse_forward_inputs(good);
  in.token_ids = in.token_ids + 10;
  expect_error_containing([&] { model.forward(in); }, {"token_ids", "position table"});
  expect_error_containing([&] { model.call("decode", good); }, {"decode"});
  expect_error_containing(
      [&] {
        SD3Transformer2DModel(c, DiTPart{0, 4, true, true});
      },
      {"block range", "3 blocks"});
  expect_error_containing(
      [&] {
        SD3Transformer2DModel(c, DiTPart{}, xfuser::models::TensorParallel{0, 4});
      },
      {"num_attention_heads 2", "tensor parallel degree 4"});
}

}  // namespace
