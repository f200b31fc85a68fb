// Flux2Transformer2DModel (FLUX.2): the diffusers 0.36.0 fixtures (flux2-tiny-s1: batch 2 with a
// reference image's ids (t = 10) and 3-D int64 ids as Flux2Pipeline passes them; flux2-other-s1:
// 2 + 2 blocks, patch 2, out_channels, mlp_ratio, eps, rope_theta and 2-D fractional ids) through
// call("forward") and the registry; parameter names and counts; models split into parts
// (PipeFusion stages) and block ranges; the attention calls; the shared modulation; the
// tensor-parallel slices; config, weight and input errors.
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
#include "models/flux2/flux2_transformer.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"
#include "tests/test_util.h"

namespace {
namespace fs = std::filesystem;
using xfuser::models::AttentionCall;
using xfuser::models::LoadOptions;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorMapSource;
using xfuser::models::TensorParallel;
using xfuser::models::dit::DiTPart;
using xfuser::models::flux2::Flux2Config;
using xfuser::models::flux2::Flux2Transformer2DModel;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

const std::string kTiny = "flux2-tiny-s1";
const std::string kOther = "flux2-other-s1";
const std::vector<std::string> kCases = {kTiny, kOther};

fs::path fixture_case(const std::string& name) {
  return fixtures_dir() / "diffusers-v0.36.0" / name;
}

Flux2Config fixture_config(const std::string& name) {
  auto path = fixture_case(name) / "config.json";
  return Flux2Config::from_json(read_json(path), path.string());
}

std::shared_ptr<Flux2Transformer2DModel> load_fixture_model(const std::string& name,
                                                            DiTPart part = {}) {
  auto model = std::make_shared<Flux2Transformer2DModel>(fixture_config(name), part);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  LoadOptions opts;
  opts.allow_unexpected =
      !part.embedders || !part.head || part.block_begin != 0 || part.block_end != -1;
  model->load(weights, at::kFloat, "", opts);
  return model;
}

class Flux2Test : public ::testing::Test {
 protected:
  void SetUp() override { xfuser::models::register_builtin_components(); }
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(Flux2Test, ConfigDefaultsFollowDiffusers) {
  auto c = Flux2Config::from_json(nlohmann::json::object());
  EXPECT_EQ(c.patch_size, 1);
  EXPECT_EQ(c.in_channels, 128);
  EXPECT_EQ(c.resolved_out_channels(), 128);
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(c.num_single_layers, 48);
  EXPECT_EQ(c.attention_head_dim, 128);
  EXPECT_EQ(c.num_attention_heads, 48);
  EXPECT_EQ(c.joint_attention_dim, 15360);
  EXPECT_EQ(c.timestep_guidance_channels, 256);
  EXPECT_DOUBLE_EQ(c.mlp_ratio, 3.0);
  EXPECT_EQ(c.axes_dims_rope, (std::vector<int64_t>{32, 32, 32, 32}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 2000.0);
  EXPECT_DOUBLE_EQ(c.eps, 1e-6);
  EXPECT_EQ(c.inner_dim(), 6144);
  EXPECT_EQ(c.mlp_hidden_dim(), 18432);
  EXPECT_EQ(c.output_dim(), 128);
  XF_REQUIRE_FIXTURE(fixture_case(kOther));
  auto o = fixture_config(kOther);
  EXPECT_EQ(o.patch_size, 2);
  EXPECT_EQ(o.resolved_out_channels(), 4);
  EXPECT_EQ(o.output_dim(), 16);
  EXPECT_EQ(o.mlp_hidden_dim(), 32);
  EXPECT_DOUBLE_EQ(o.rope_theta, 500.0);
  EXPECT_DOUBLE_EQ(o.eps, 1e-5);
  // Python's int(): 16 * 2.7 = 43.2 -> 43.
  EXPECT_EQ(Flux2Config::from_json({{"num_attention_heads", 2},
                                    {"attention_head_dim", 8},
                                    {"axes_dims_rope", {2, 2, 2, 2}},
                                    {"mlp_ratio", 2.7}})
                .mlp_hidden_dim(),
            43);
}

TEST_F(Flux2Test, ConfigErrorsNameTheFileAndField) {
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"num_layers", "x"}}, "/c.json");
      },
      {"/c.json", "num_layers"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"rope_theta", "big"}}, "/c.json");
      },
      {"/c.json", "rope_theta"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"axes_dims_rope", {32, 32, 32, 30}}}, "c.json");
      },
      {"c.json", "sum(axes_dims_rope) = 126", "attention_head_dim = 128"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"axes_dims_rope", {32, 33, 31, 32}}}, "c.json");
      },
      {"c.json", "even", "33"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"mlp_ratio", 0.0}}, "c.json");
      },
      {"c.json", "mlp_ratio"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"eps", -1.0}}, "c.json");
      },
      {"c.json", "eps"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"timestep_guidance_channels", 7}}, "c.json");
      },
      {"c.json", "timestep_guidance_channels", "7"});
  expect_error_containing(
      [] {
        Flux2Config::from_json({{"guidance_embeds", false}}, "c.json");
      },
      {"c.json", "guidance_embeds"});
  expect_error_containing([] { Flux2Config::from_json(nlohmann::json::array(), "c.json"); },
                          {"c.json", "JSON object"});
}

// ---- parameters ---------------------------------------------------------------------------------

TEST_F(Flux2Test, ParameterNamesAndShapesMatchDiffusers) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    Flux2Transformer2DModel model(fixture_config(name));
    SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
    std::map<std::string, std::vector<int64_t>> ours, theirs;
    for (const auto& [n, slot] : model.named_parameters()) ours[n] = slot->shape;
    for (const auto& n : weights.names()) {
      // The tensor must outlive its sizes() view.
      const at::Tensor t = weights.get(n);
      theirs[n] = t.sizes().vec();
    }
    EXPECT_EQ(ours, theirs);
    // No biases anywhere.
    for (const auto& [n, shape] : ours) EXPECT_EQ(n.find("bias"), std::string::npos) << n;
  }
}

TEST_F(Flux2Test, ParameterCountsPartitionTheModel) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    Flux2Transformer2DModel model(fixture_config(name));
    int64_t sum = 0;
    for (auto p : model.block_parameters()) sum += p;
    for (auto p : model.other_parameters()) sum += p;
    EXPECT_EQ(sum, model.num_parameters());
    EXPECT_EQ(sum, read_json(fixture_case(name) / "case.json")["num_parameters"].get<int64_t>());
    EXPECT_EQ(model.block_parameters().size(), static_cast<size_t>(model.num_blocks()));
  }
}

// ---- the diffusers fixtures ---------------------------------------------------------------------

TEST_F(Flux2Test, FixturesFloat32ThroughCall) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name);
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

TEST_F(Flux2Test, FixturesThroughTheRegistry) {
  ASSERT_NE(xfuser::models::dit::DiTRegistry::find("Flux2Transformer2DModel"), nullptr);
  bool family = false;
  for (const auto& f : xfuser::models::FamilyRegistry::all()) family = family || f.name == "flux2";
  EXPECT_TRUE(family);
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto component = xfuser::models::load_component(fixture_case(name).string(), at::kFloat);
    EXPECT_EQ(component->class_name(), "Flux2Transformer2DModel");
    auto inputs = read_tensors(fixture_case(name) / "inputs.safetensors");
    auto out = component->call("forward", inputs).at("sample");
    auto expected = read_tensors(fixture_case(name) / "output.safetensors").at("sample");
    EXPECT_LE(max_rel_error(out, expected), 1e-4);
  }
}

TEST_F(Flux2Test, TwoDimensionalIdsEqualTheBatchedOnes) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  auto model = load_fixture_model(kTiny);
  auto inputs = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  const auto want = model->call("forward", inputs).at("sample");
  auto flat = inputs;
  flat["img_ids"] = inputs.at("img_ids")[0].to(at::kFloat);
  flat["txt_ids"] = inputs.at("txt_ids")[0];
  EXPECT_TRUE(at::equal(model->call("forward", flat).at("sample"), want));
  // The reference image's time offset matters: the same tokens at t = 0 give another output.
  auto moved = flat;
  moved["img_ids"] = flat.at("img_ids").clone();
  moved["img_ids"].narrow(0, 24, 6).select(1, 0).fill_(0);
  EXPECT_GT(max_rel_error(model->call("forward", moved).at("sample"), want), 1e-3);
}

TEST_F(Flux2Test, BatchRowsAreIndependent) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  auto model = load_fixture_model(kTiny);
  auto inputs = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  const auto want = model->call("forward", inputs).at("sample");
  for (int64_t row = 0; row < 2; ++row) {
    TensorMap one = inputs;
    for (const auto* k : {"hidden_states", "encoder_hidden_states", "timestep", "guidance"}) {
      one[k] = inputs.at(k).narrow(0, row, 1);
    }
    auto got = model->call("forward", one).at("sample");
    EXPECT_LE(max_rel_error(got, want.narrow(0, row, 1)), 1e-5) << "row " << row;
  }
  // The guidance is embedded: another scale changes the output.
  auto other = inputs;
  other["guidance"] = inputs.at("guidance") + 1.0;
  EXPECT_GT(max_rel_error(model->call("forward", other).at("sample"), want), 1e-3);
}

TEST_F(Flux2Test, FixtureReducedPrecision) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  auto inputs = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  auto expected = read_tensors(fixture_case(kTiny) / "output.safetensors").at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto model = std::make_shared<Flux2Transformer2DModel>(fixture_config(kTiny));
    SafetensorsFile weights((fixture_case(kTiny) / "diffusion_pytorch_model.safetensors").string());
    model->load(weights, dtype);
    EXPECT_EQ(model->dtype(), dtype);
    TensorMap in = inputs;
    for (const auto* k : {"hidden_states", "encoder_hidden_states"}) in[k] = inputs.at(k).to(dtype);
    auto out = model->call("forward", in).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out.to(at::kFloat), expected);
    std::cout << "[ " << kTiny << " " << dtype << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 5e-2);
  }
}

// ---- parts, block ranges, attention calls -------------------------------------------------------

TEST_F(Flux2Test, StagedBlockRangesEqualForward) {
  XF_REQUIRE_FIXTURE(fixture_case(kOther));
  auto model = load_fixture_model(kOther);
  const auto in =
      model->parse_forward_inputs(read_tensors(fixture_case(kOther) / "inputs.safetensors"));
  const auto want = model->forward(in);
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 4}, {0, 1, 2, 3, 4}, {0, 3, 4}}) {
    auto a = model->embed(in);
    // The modulation is computed once, for every block: [B|1, 6D] twice and [B|1, 3D].
    EXPECT_EQ(a.extra.at(Flux2Transformer2DModel::kModImg).sizes(), (at::IntArrayRef{1, 96}));
    EXPECT_EQ(a.extra.at(Flux2Transformer2DModel::kModTxt).sizes(), (at::IntArrayRef{1, 96}));
    EXPECT_EQ(a.extra.at(Flux2Transformer2DModel::kModSingle).sizes(), (at::IntArrayRef{1, 48}));
    for (size_t i = 0; i + 1 < cuts.size(); ++i) model->run_blocks(a, cuts[i], cuts[i + 1]);
    EXPECT_TRUE(a.joined);
    EXPECT_TRUE(at::equal(model->finalize(a), want));
  }
  auto a = model->embed(in);
  expect_error_containing([&] { model->run_blocks(a, 3, 5); }, {"outside the 4 blocks"});
  model->run_blocks(a, 0, 3);
  expect_error_containing([&] { model->run_blocks(a, 1, 2); }, {"already joined"});
}

TEST_F(Flux2Test, PartsChainedEqualTheWholeModel) {
  XF_REQUIRE_FIXTURE(fixture_case(kOther));
  auto inputs = read_tensors(fixture_case(kOther) / "inputs.safetensors");
  auto whole = load_fixture_model(kOther);
  const auto in = whole->parse_forward_inputs(inputs);
  const auto want = whole->forward(in);
  const auto diffusers = read_tensors(fixture_case(kOther) / "output.safetensors").at("sample");
  // Three stages, cut inside the double blocks, at the double/single boundary and inside the
  // single blocks.
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 1, 3, 4}, {0, 2, 4}}) {
    SCOPED_TRACE(cuts.size());
    std::vector<std::shared_ptr<Flux2Transformer2DModel>> parts;
    int64_t params = 0;
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      parts.push_back(
          load_fixture_model(kOther, DiTPart{cuts[s], cuts[s + 1], s == 0, s + 2 == cuts.size()}));
      params += parts.back()->num_parameters();
    }
    // time_guidance_embed and the modulation layers are on every part.
    EXPECT_EQ(params, whole->num_parameters() +
                          static_cast<int64_t>(parts.size() - 1) * whole->other_parameters()[1]);
    xfuser::models::dit::DiTActivations prev;
    for (size_t s = 0; s < parts.size(); ++s) {
      auto a = parts[s]->embed(in);
      if (s > 0) {
        EXPECT_FALSE(a.hidden.defined());
        EXPECT_FALSE(a.context.defined());
        a.hidden = prev.hidden;
        a.context = prev.context;
        a.joined = prev.joined;
      }
      parts[s]->run_blocks(a, cuts[s], cuts[s + 1]);
      if (s + 1 < parts.size()) {
        EXPECT_THROW(parts[s]->finalize(a), xfuser::Error);
        EXPECT_EQ(a.joined, cuts[s + 1] > 2);
      }
      prev = a;
    }
    auto got = parts.back()->finalize(prev);
    EXPECT_TRUE(at::equal(got, want));
    EXPECT_LE(max_rel_error(got, diffusers), 1e-4);
    auto fresh = parts.front()->embed(in);
    expect_error_containing([&] { parts.back()->run_blocks(fresh, 0, 1); },
                            {"transformer_blocks.0", "not held"});
  }
}

TEST_F(Flux2Test, AttentionCallsAreJointWithTheTextFirst) {
  XF_REQUIRE_FIXTURE(fixture_case(kOther));
  auto model = load_fixture_model(kOther);
  auto inputs = read_tensors(fixture_case(kOther) / "inputs.safetensors");
  const auto want = model->call("forward", inputs).at("sample");
  struct Seen {
    int64_t layer, text_tokens, q_len, heads, head_dim;
    bool text_first, cross;
  };
  std::vector<Seen> seen;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionCall& call) {
    seen.push_back({call.layer, call.text_tokens, q.size(1), q.size(2), q.size(3), call.text_first,
                    call.cross});
    return xfuser::models::local_attention(q, k, v, call);
  });
  auto got = model->call("forward", inputs).at("sample");
  model->set_attention_hook({});
  EXPECT_TRUE(at::equal(got, want));
  ASSERT_EQ(seen.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(seen[i].layer, i);
    EXPECT_EQ(seen[i].text_tokens, 7);
    EXPECT_EQ(seen[i].q_len, 7 + 12);
    EXPECT_EQ(seen[i].heads, 2);
    EXPECT_EQ(seen[i].head_dim, 8);
    EXPECT_TRUE(seen[i].text_first);
    EXPECT_FALSE(seen[i].cross);
  }
  EXPECT_EQ(model->text_attention(), xfuser::models::dit::TextAttention::kJointTextFirst);
  EXPECT_FALSE(model->text_whole());
  EXPECT_FALSE(model->joined_at(1));
  EXPECT_TRUE(model->joined_at(2));
  EXPECT_EQ(model->num_heads(), 2);
  EXPECT_EQ(model->hidden_size(), 16);
}

// ---- tensor parallel slices ---------------------------------------------------------------------

TEST_F(Flux2Test, TensorParallelSlicesAndDivisibility) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  expect_error_containing(
      [] {
        Flux2Transformer2DModel model(fixture_config(kTiny), {}, TensorParallel{0, 4});
      },
      {"num_attention_heads 2", "tensor parallel degree 4"});
  // 3 heads of 8 (D = 24), mlp_ratio 1.5: a feed-forward of 36, which 3 ranks split but not...
  auto odd = Flux2Config::from_json({{"num_attention_heads", 2},
                                     {"attention_head_dim", 8},
                                     {"axes_dims_rope", {2, 2, 2, 2}},
                                     {"mlp_ratio", 1.0 / 16 * 3}});  // int(16 * 3/16) = 3
  expect_error_containing(
      [&] {
        Flux2Transformer2DModel model(odd, {}, TensorParallel{0, 2});
      },
      {"feed-forward width 3", "tensor parallel degree 2"});
  // Rank 1 of 2 holds one head (16 of 32 features) and half of every feed-forward (48 of 96).
  Flux2Transformer2DModel half(fixture_config(kTiny), {}, TensorParallel{1, 2});
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [n, slot] : half.named_parameters()) shapes[n] = slot->shape;
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(shapes.at("transformer_blocks.0.attn.to_q.weight"), (Shape{16, 32}));
  EXPECT_EQ(shapes.at("transformer_blocks.0.attn.to_out.0.weight"), (Shape{32, 16}));
  EXPECT_EQ(shapes.at("transformer_blocks.0.ff.linear_in.weight"), (Shape{96, 32}));
  EXPECT_EQ(shapes.at("transformer_blocks.0.ff.linear_out.weight"), (Shape{32, 48}));
  EXPECT_EQ(shapes.at("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight"),
            (Shape{3 * 16 + 2 * 48, 32}));
  EXPECT_EQ(shapes.at("single_transformer_blocks.0.attn.to_out.weight"), (Shape{32, 16 + 48}));
  EXPECT_EQ(shapes.at("double_stream_modulation_img.linear.weight"), (Shape{96, 32}));
  EXPECT_EQ(shapes.at("single_stream_modulation.linear.weight"), (Shape{48, 32}));
  EXPECT_EQ(shapes.at("x_embedder.weight"), (Shape{32, 8}));  // replicated
  EXPECT_EQ(shapes.at("norm_out.linear.weight"), (Shape{64, 32}));
  // It loads its slices of the checkpoint: rank 1's rows of the fused projection are
  // [q heads 1 | k heads 1 | v heads 1 | gate half 1 | up half 1].
  SafetensorsFile weights((fixture_case(kTiny) / "diffusion_pytorch_model.safetensors").string());
  half.load(weights, at::kFloat);
  const auto full = weights.get("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight");
  at::Tensor slice;
  for (const auto& [n, slot] : half.named_parameters()) {
    if (n == "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight") slice = slot->tensor;
  }
  ASSERT_TRUE(slice.defined());
  const auto expected_rows =
      at::cat({full.narrow(0, 16, 16), full.narrow(0, 48, 16), full.narrow(0, 80, 16),
               full.narrow(0, 96 + 48, 48), full.narrow(0, 96 + 96 + 48, 48)},
              0);
  EXPECT_TRUE(at::equal(slice, expected_rows));
}

// ---- errors -------------------------------------------------------------------------------------

TEST_F(Flux2Test, MissingOrMisshapedWeightsAreNamed) {
  XF_REQUIRE_FIXTURE(fixture_case(kOther));
  auto tensors = read_tensors(fixture_case(kOther) / "diffusion_pytorch_model.safetensors");
  {
    auto t = tensors;
    t.erase("single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight");
    Flux2Transformer2DModel model(fixture_config(kOther));
    expect_error_containing([&] { model.load(TensorMapSource(t), at::kFloat); },
                            {"single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight", "missing"});
  }
  {
    auto t = tensors;
    t["transformer_blocks.0.ff.linear_in.weight"] = at::zeros({48, 16});
    Flux2Transformer2DModel model(fixture_config(kOther));
    expect_error_containing([&] { model.load(TensorMapSource(t), at::kFloat); },
                            {"transformer_blocks.0.ff.linear_in.weight", "[64, 16]", "[48, 16]"});
  }
  {
    auto t = tensors;
    t["transformer_blocks.0.attn.to_q.bias"] = at::zeros({16});  // FLUX.2 has no biases
    Flux2Transformer2DModel model(fixture_config(kOther));
    expect_error_containing([&] { model.load(TensorMapSource(t), at::kFloat); },
                            {"transformer_blocks.0.attn.to_q.bias", "unexpected"});
  }
  Flux2Transformer2DModel unloaded(fixture_config(kOther));
  expect_error_containing([&] { unloaded.dtype(); }, {"before its weights were loaded"});
}

TEST_F(Flux2Test, InputErrorsNameTheInput) {
  XF_REQUIRE_FIXTURE(fixture_case(kTiny));
  auto model = load_fixture_model(kTiny);
  const auto inputs = read_tensors(fixture_case(kTiny) / "inputs.safetensors");
  auto fails = [&](const TensorMap& m, std::vector<std::string> needles) {
    expect_error_containing([&] { model->call("forward", m); }, needles);
  };
  auto without = [&](const std::string& k) {
    auto m = inputs;
    m.erase(k);
    return m;
  };
  auto with = [&](const std::string& k, const at::Tensor& t) {
    auto m = inputs;
    m[k] = t;
    return m;
  };
  fails(without("guidance"), {"missing required input 'guidance'"});
  fails(without("timestep"), {"missing required input 'timestep'"});
  fails(without("img_ids"), {"missing required input 'img_ids'"});
  fails(with("pooled_projections", at::zeros({2, 8})), {"unknown input", "pooled_projections"});
  fails(with("hidden_states", at::zeros({2, 30, 4})), {"hidden_states", "[B, N, 8]"});
  fails(with("encoder_hidden_states", at::zeros({2, 5, 16})), {"encoder_hidden_states", "32"});
  fails(with("img_ids", at::zeros({30, 3})), {"img_ids", "[30, 4]", "[30, 3]"});
  fails(with("txt_ids", at::zeros({6, 4})), {"txt_ids", "[5, 4]"});
  fails(with("timestep", at::zeros({3})), {"timestep", "[2]"});
  fails(with("guidance", at::zeros({2, 1})), {"guidance", "[2]"});
  fails(with("hidden_states", at::zeros({2, 30, 8}, at::kLong)), {"floating point"});
}

}  // namespace
