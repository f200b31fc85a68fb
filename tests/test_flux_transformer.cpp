// FluxTransformer2DModel: diffusers v0.33.1 fixture parity (fp32, bf16, fp16), an independent
// float64 re-implementation of diffusers' math for cases the fixture does not cover (guidance,
// batch 2, non-square id grids, several blocks), the staged forward and attention hook, and the
// input checks.
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/attention.h"
#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux/flux_transformer.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::expect_error_containing;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorMapSource;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using StateDict = std::map<std::string, at::Tensor>;

std::filesystem::path fixture_case() {
  return fixtures_dir() / "diffusers-v0.33.1" / "flux-tiny-s1";
}

std::shared_ptr<FluxTransformer2DModel> load_fixture_model(c10::ScalarType dtype) {
  auto dir = fixture_case();
  auto model = std::make_shared<FluxTransformer2DModel>(
      FluxConfig::from_json(read_json(dir / "config.json"), (dir / "config.json").string()));
  SafetensorsFile weights((dir / "diffusion_pytorch_model.safetensors").string());
  model->load(weights, dtype);
  return model;
}

TensorMap cast_floats(const TensorMap& in, c10::ScalarType dtype) {
  TensorMap out;
  for (const auto& [k, v] : in) out[k] = at::isFloatingType(v.scalar_type()) ? v.to(dtype) : v;
  return out;
}

// ---- independent float64 reference of diffusers' FLUX math -------------------------------------
// Written from the diffusers definitions without the library's modules: plain tensor algebra on
// a state dict. The timestep sinusoid uses float32 arguments as diffusers does (its frequencies
// and t * f are float32 there); everything else is float64.

struct Ref {
  const StateDict& sd;
  const FluxConfig& cfg;

  at::Tensor w(const std::string& n) const { return sd.at(n).to(at::kDouble); }
  at::Tensor linear(const std::string& p, const at::Tensor& x) const {
    return at::matmul(x, w(p + ".weight").t()) + w(p + ".bias");
  }
  static at::Tensor silu(const at::Tensor& x) { return x / (1 + at::exp(-x)); }
  static at::Tensor gelu_tanh(const at::Tensor& x) {
    return 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  static at::Tensor ln(const at::Tensor& x) {
    auto mu = x.mean(-1, true);
    auto var = (x - mu).pow(2).mean(-1, true);
    return (x - mu) / at::sqrt(var + 1e-6);
  }
  at::Tensor rms(const std::string& p, const at::Tensor& x) const {
    return x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6) * w(p + ".weight");
  }
  static at::Tensor sinusoid(const at::Tensor& t) {  // t [B] -> [B, 256] (cos first)
    std::vector<double> rows;
    auto tf = t.to(at::kFloat).contiguous();
    const int64_t n = tf.size(0);
    std::vector<double> out(n * 256);
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t k = 0; k < 128; ++k) {
        float f = std::exp(static_cast<float>(-std::log(10000.0)) * static_cast<float>(k) / 128.0f);
        float arg = tf[b].item<float>() * f;
        out[b * 256 + k] = std::cos(static_cast<double>(arg));
        out[b * 256 + 128 + k] = std::sin(static_cast<double>(arg));
      }
    }
    return at::tensor(out, at::kDouble).view({n, 256});
  }
  // Per-pair rotation angles [S, hd/2] for ids [S, axes].
  at::Tensor angles(const at::Tensor& ids) const {
    std::vector<at::Tensor> parts;
    auto pos = ids.to(at::kFloat).to(at::kDouble);
    for (size_t a = 0; a < cfg.axes_dims_rope.size(); ++a) {
      const int64_t d = cfg.axes_dims_rope[a];
      auto j = at::arange(d / 2, at::kDouble);
      auto freq = at::pow(10000.0, -2.0 * j / static_cast<double>(d));
      parts.push_back(pos.select(1, a).unsqueeze(1) * freq.unsqueeze(0));
    }
    return at::cat(parts, 1);
  }
  static at::Tensor rotate(const at::Tensor& x, const at::Tensor& ang) {  // x [B, S, H, hd]
    auto p = x.reshape({x.size(0), x.size(1), x.size(2), x.size(3) / 2, 2});
    auto c = at::cos(ang).view({1, ang.size(0), 1, ang.size(1)});
    auto s = at::sin(ang).view({1, ang.size(0), 1, ang.size(1)});
    auto x0 = p.select(-1, 0), x1 = p.select(-1, 1);
    return at::stack({x0 * c - x1 * s, x1 * c + x0 * s}, -1).flatten(3);
  }
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    auto s = at::einsum("bqhd,bkhd->bhqk", {q, k}) / std::sqrt(double(cfg.attention_head_dim));
    return at::einsum("bhqk,bkhd->bqhd", {at::softmax(s, -1), v});
  }
  at::Tensor heads(const at::Tensor& x) const {
    return x.view({x.size(0), x.size(1), cfg.num_attention_heads, cfg.attention_head_dim});
  }

  at::Tensor forward(const TensorMap& in) const {
    auto x = linear("x_embedder", in.at("hidden_states").to(at::kDouble));
    auto temb = linear("time_text_embed.timestep_embedder.linear_2",
                       silu(linear("time_text_embed.timestep_embedder.linear_1",
                                   sinusoid(in.at("timestep").to(at::kFloat) * 1000))));
    if (cfg.guidance_embeds) {
      temb = temb + linear("time_text_embed.guidance_embedder.linear_2",
                           silu(linear("time_text_embed.guidance_embedder.linear_1",
                                       sinusoid(in.at("guidance").to(at::kFloat) * 1000))));
    }
    temb = temb + linear("time_text_embed.text_embedder.linear_2",
                         silu(linear("time_text_embed.text_embedder.linear_1",
                                     in.at("pooled_projections").to(at::kDouble))));
    auto c = linear("context_embedder", in.at("encoder_hidden_states").to(at::kDouble));
    auto txt_ids = in.at("txt_ids"), img_ids = in.at("img_ids");
    if (txt_ids.dim() == 3) txt_ids = txt_ids[0];
    if (img_ids.dim() == 3) img_ids = img_ids[0];
    auto ang = angles(at::cat({txt_ids.to(at::kFloat), img_ids.to(at::kFloat)}, 0));
    const int64_t l = c.size(1), n = x.size(1);
    auto st = silu(temb);
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      const std::string p = "transformer_blocks." + std::to_string(i) + ".";
      auto m = linear(p + "norm1.linear", st).chunk(6, 1);
      auto mc = linear(p + "norm1_context.linear", st).chunk(6, 1);
      auto nx = ln(x) * (1 + m[1].unsqueeze(1)) + m[0].unsqueeze(1);
      auto nc = ln(c) * (1 + mc[1].unsqueeze(1)) + mc[0].unsqueeze(1);
      auto q = at::cat({rms(p + "attn.norm_added_q", heads(linear(p + "attn.add_q_proj", nc))),
                        rms(p + "attn.norm_q", heads(linear(p + "attn.to_q", nx)))},
                       1);
      auto k = at::cat({rms(p + "attn.norm_added_k", heads(linear(p + "attn.add_k_proj", nc))),
                        rms(p + "attn.norm_k", heads(linear(p + "attn.to_k", nx)))},
                       1);
      auto v = at::cat(
          {heads(linear(p + "attn.add_v_proj", nc)), heads(linear(p + "attn.to_v", nx))}, 1);
      auto o = attend(rotate(q, ang), rotate(k, ang), v).flatten(2);  // [B, L+N, D]
      x = x + m[2].unsqueeze(1) * linear(p + "attn.to_out.0", o.narrow(1, l, n));
      c = c + mc[2].unsqueeze(1) * linear(p + "attn.to_add_out", o.narrow(1, 0, l));
      auto hx = ln(x) * (1 + m[4].unsqueeze(1)) + m[3].unsqueeze(1);
      x = x +
          m[5].unsqueeze(1) * linear(p + "ff.net.2", gelu_tanh(linear(p + "ff.net.0.proj", hx)));
      auto hc = ln(c) * (1 + mc[4].unsqueeze(1)) + mc[3].unsqueeze(1);
      c = c + mc[5].unsqueeze(1) * linear(p + "ff_context.net.2",
                                          gelu_tanh(linear(p + "ff_context.net.0.proj", hc)));
    }
    auto h = at::cat({c, x}, 1);
    for (int64_t i = 0; i < cfg.num_single_layers; ++i) {
      const std::string p = "single_transformer_blocks." + std::to_string(i) + ".";
      auto m = linear(p + "norm.linear", st).chunk(3, 1);
      auto nh = ln(h) * (1 + m[1].unsqueeze(1)) + m[0].unsqueeze(1);
      auto mlp = gelu_tanh(linear(p + "proj_mlp", nh));
      auto q = rotate(rms(p + "attn.norm_q", heads(linear(p + "attn.to_q", nh))), ang);
      auto k = rotate(rms(p + "attn.norm_k", heads(linear(p + "attn.to_k", nh))), ang);
      auto v = heads(linear(p + "attn.to_v", nh));
      auto o = attend(q, k, v).flatten(2);
      h = h + m[2].unsqueeze(1) * linear(p + "proj_out", at::cat({o, mlp}, 2));
    }
    x = h.narrow(1, l, n);
    auto so = linear("norm_out.linear", st).chunk(2, 1);  // scale, shift
    x = ln(x) * (1 + so[0].unsqueeze(1)) + so[1].unsqueeze(1);
    return linear("proj_out", x);
  }
};

// ---- random tiny models -------------------------------------------------------------------------

FluxConfig tiny_config(bool guidance, int64_t double_blocks = 2, int64_t single_blocks = 2) {
  FluxConfig c;
  c.in_channels = 8;
  c.num_layers = double_blocks;
  c.num_single_layers = single_blocks;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 12;
  c.guidance_embeds = guidance;
  c.axes_dims_rope = {4, 4, 8};
  return c;
}

// Weights of a useful scale: W ~ N(0, 1/in), biases ~ 0.1 N, norm weights ~ 1 + 0.1 N.
StateDict random_state(const FluxTransformer2DModel& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  StateDict sd;
  for (const auto& [name, slot] : model.named_parameters()) {
    auto t = at::empty(slot->shape, at::kFloat).normal_(0.0, 1.0, gen);
    if (slot->shape.size() == 2) {
      t = t / std::sqrt(static_cast<double>(slot->shape[1]));
    } else if (name.find("norm") != std::string::npos) {
      t = 1 + 0.1 * t;
    } else {
      t = 0.1 * t;
    }
    sd[name] = t;
  }
  return sd;
}

std::shared_ptr<FluxTransformer2DModel> make_model(const FluxConfig& cfg, const StateDict& sd,
                                                   c10::ScalarType dtype = at::kFloat) {
  auto m = std::make_shared<FluxTransformer2DModel>(cfg);
  m->load(TensorMapSource(sd), dtype);
  return m;
}

// Pipeline-like ids: text zeros, image (0, r, c) on an h x w grid.
at::Tensor grid_ids(int64_t h, int64_t w) {
  auto ids = at::zeros({h * w, 3});
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t c = 0; c < w; ++c) {
      ids[r * w + c][1] = static_cast<float>(r);
      ids[r * w + c][2] = static_cast<float>(c);
    }
  }
  return ids;
}

TensorMap random_inputs(const FluxConfig& cfg, int64_t b, int64_t h, int64_t w, int64_t l,
                        uint64_t seed, bool with_guidance) {
  at::manual_seed(seed);
  TensorMap in;
  in["hidden_states"] = at::randn({b, h * w, cfg.in_channels});
  in["encoder_hidden_states"] = at::randn({b, l, cfg.joint_attention_dim});
  in["pooled_projections"] = at::randn({b, cfg.pooled_projection_dim});
  in["timestep"] = at::rand({b});
  in["img_ids"] = grid_ids(h, w);
  in["txt_ids"] = at::randn({l, 3});
  if (with_guidance) in["guidance"] = 1 + 4 * at::rand({b});
  return in;
}

TensorMap slice_batch(const TensorMap& in, int64_t i) {
  TensorMap out;
  for (const auto& [k, v] : in) {
    out[k] = (k == "img_ids" || k == "txt_ids") ? v : v.narrow(0, i, 1);
  }
  return out;
}

class FluxTest : public ::testing::Test {
 protected:
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(FluxTest, ConfigDefaultsFollowDiffusers) {
  auto c = FluxConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(c.patch_size, 1);
  EXPECT_EQ(c.in_channels, 64);
  EXPECT_EQ(c.resolved_out_channels(), 64);
  EXPECT_EQ(c.num_layers, 19);
  EXPECT_EQ(c.num_single_layers, 38);
  EXPECT_EQ(c.attention_head_dim, 128);
  EXPECT_EQ(c.num_attention_heads, 24);
  EXPECT_EQ(c.joint_attention_dim, 4096);
  EXPECT_EQ(c.pooled_projection_dim, 768);
  EXPECT_FALSE(c.guidance_embeds);
  EXPECT_EQ(c.axes_dims_rope, (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(c.inner_dim(), 3072);
  auto d = FluxConfig::from_json(
      {{"out_channels", 16}, {"patch_size", 2}, {"guidance_embeds", true}, {"_class_name", "x"}});
  EXPECT_EQ(d.output_dim(), 64);
  EXPECT_TRUE(d.guidance_embeds);
  expect_error_containing(
      [] {
        FluxConfig::from_json({{"num_layers", "two"}}, "cfg.json");
      },
      {"num_layers", "cfg.json"});
  expect_error_containing(
      [] {
        FluxConfig::from_json({{"axes_dims_rope", {16, 56, 58}}});
      },
      {"axes_dims_rope", "attention_head_dim"});
}

TEST_F(FluxTest, ParameterNamesMatchDiffusers) {
  FluxTransformer2DModel m(tiny_config(true, 1, 1));
  std::set<std::string> names;
  for (const auto& [n, s] : m.named_parameters()) names.insert(n);
  for (const char* n :
       {"x_embedder.weight", "context_embedder.bias",
        "time_text_embed.timestep_embedder.linear_1.weight",
        "time_text_embed.guidance_embedder.linear_2.bias",
        "time_text_embed.text_embedder.linear_1.weight", "transformer_blocks.0.norm1.linear.weight",
        "transformer_blocks.0.norm1_context.linear.bias",
        "transformer_blocks.0.attn.norm_added_q.weight",
        "transformer_blocks.0.attn.to_out.0.weight", "transformer_blocks.0.attn.to_add_out.bias",
        "transformer_blocks.0.ff.net.0.proj.weight", "transformer_blocks.0.ff_context.net.2.bias",
        "single_transformer_blocks.0.norm.linear.weight",
        "single_transformer_blocks.0.proj_mlp.weight",
        "single_transformer_blocks.0.proj_out.weight",
        "single_transformer_blocks.0.attn.norm_k.weight", "norm_out.linear.weight",
        "proj_out.bias"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_FALSE(names.count("single_transformer_blocks.0.attn.to_out.0.weight"));
  FluxTransformer2DModel no_guidance(tiny_config(false, 1, 1));
  for (const auto& [n, s] : no_guidance.named_parameters()) {
    EXPECT_EQ(n.find("guidance_embedder"), std::string::npos) << n;
  }
}

// ---- the diffusers fixture ----------------------------------------------------------------------

TEST_F(FluxTest, FixtureFloat32) {
  XF_REQUIRE_FIXTURE(fixture_case());
  auto model = load_fixture_model(at::kFloat);
  EXPECT_EQ(model->num_parameters(), read_json(fixture_case() / "case.json")["num_parameters"]);
  EXPECT_EQ(model->named_parameters().size(), 62u);
  auto inputs = read_tensors(fixture_case() / "inputs.safetensors");
  auto expected = read_tensors(fixture_case() / "output.safetensors");
  auto out = model->call("forward", inputs).at("sample");
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  ASSERT_EQ(out.sizes(), expected.at("sample").sizes());
  const double err = max_rel_error(out, expected.at("sample"));
  const double err64 = max_rel_error(out, expected.at("sample_f64"));
  std::cout << "[ flux fp32 ] max|out - sample|/max|sample| = " << err
            << ", vs sample_f64 = " << err64 << std::endl;
  EXPECT_LE(err, 1e-4);
  EXPECT_LE(err64, 1e-4);
}

TEST_F(FluxTest, FixtureThroughTheRegistry) {
  XF_REQUIRE_FIXTURE(fixture_case());
  xfuser::models::register_builtin_components();
  xfuser::models::register_builtin_components();  // idempotent
  auto component = xfuser::models::load_component(fixture_case().string(), at::kFloat);
  EXPECT_EQ(component->class_name(), "FluxTransformer2DModel");
  auto inputs = read_tensors(fixture_case() / "inputs.safetensors");
  auto out = component->call("forward", inputs).at("sample");
  auto expected = read_tensors(fixture_case() / "output.safetensors").at("sample");
  EXPECT_LE(max_rel_error(out, expected), 1e-4);
}

TEST_F(FluxTest, FixtureReducedPrecision) {
  XF_REQUIRE_FIXTURE(fixture_case());
  auto inputs = read_tensors(fixture_case() / "inputs.safetensors");
  auto expected = read_tensors(fixture_case() / "output.safetensors").at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto model = load_fixture_model(dtype);
    auto out = model->call("forward", cast_floats(inputs, dtype)).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out, expected);
    std::cout << "[ flux " << (dtype == at::kHalf ? "fp16" : "bf16")
              << " ] max|out - sample|/max|sample| = " << err << std::endl;
    EXPECT_LE(err, 2e-2);
    // Float32 inputs are cast by the model (ids kept in float32 here, so the rope differs only
    // by the bf16/fp16 rounding of the fixture's random ids).
    auto out32in = model->call("forward", inputs).at("sample");
    EXPECT_LE(max_rel_error(out32in, expected), 2e-2);
    auto same = cast_floats(inputs, dtype);
    same["img_ids"] = inputs["img_ids"];
    same["txt_ids"] = inputs["txt_ids"];
    EXPECT_TRUE(at::equal(model->call("forward", same).at("sample"), out32in));
  }
}

TEST_F(FluxTest, FixtureDeprecated3dIdsDropTheBatch) {
  XF_REQUIRE_FIXTURE(fixture_case());
  auto model = load_fixture_model(at::kFloat);
  auto inputs = read_tensors(fixture_case() / "inputs.safetensors");
  auto ref = model->call("forward", inputs).at("sample");
  auto in3 = inputs;
  in3["img_ids"] = inputs["img_ids"].unsqueeze(0);
  in3["txt_ids"] = at::stack({inputs["txt_ids"], at::zeros_like(inputs["txt_ids"])});  // [2, L, 3]
  EXPECT_TRUE(at::equal(model->call("forward", in3).at("sample"), ref));
}

TEST_F(FluxTest, ReferenceImplementationMatchesTheFixture) {
  XF_REQUIRE_FIXTURE(fixture_case());
  auto dir = fixture_case();
  auto cfg = FluxConfig::from_json(read_json(dir / "config.json"));
  auto sd = read_tensors(dir / "diffusion_pytorch_model.safetensors");
  auto inputs = read_tensors(dir / "inputs.safetensors");
  auto expected = read_tensors(dir / "output.safetensors").at("sample");
  auto ref = Ref{sd, cfg}.forward(inputs);
  const double err = max_rel_error(ref, expected);
  std::cout << "[ reference ] float64 reference vs fixture: " << err << std::endl;
  EXPECT_LE(err, 1e-5);
}

// ---- beyond the fixture: independent reference --------------------------------------------------

TEST_F(FluxTest, GuidanceModelMatchesReference) {
  auto cfg = tiny_config(true, 2, 2);
  auto sd = random_state(FluxTransformer2DModel(cfg), 11);
  auto model = make_model(cfg, sd);
  auto in = random_inputs(cfg, 2, 3, 5, 7, 12, true);  // batch 2, 3x5 grid, 7 text tokens
  auto out = model->call("forward", in).at("sample");
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 15, cfg.output_dim()}));
  auto ref = Ref{sd, cfg}.forward(in);
  const double err = max_rel_error(out, ref);
  std::cout << "[ guidance 2+2 blocks, B=2, 3x5 grid ] vs float64 reference: " << err << std::endl;
  EXPECT_LE(err, 1e-4);
  EXPECT_GT(out.abs().max().item<float>(), 0.1f);
}

TEST_F(FluxTest, NonSquareGridsPatchSizeAndOutChannels) {
  auto cfg = tiny_config(false, 1, 2);
  cfg.patch_size = 2;
  cfg.out_channels = 3;  // proj_out -> 2*2*3
  auto sd = random_state(FluxTransformer2DModel(cfg), 21);
  auto model = make_model(cfg, sd);
  for (auto [h, w] : {std::pair<int64_t, int64_t>{2, 7}, {6, 1}, {4, 4}}) {
    auto in = random_inputs(cfg, 1, h, w, 5, 22 + h, false);
    auto out = model->call("forward", in).at("sample");
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, h * w, 12}));
    EXPECT_LE(max_rel_error(out, Ref{sd, cfg}.forward(in)), 1e-4) << h << "x" << w;
  }
}

TEST_F(FluxTest, BatchTwoEqualsTwoBatchOneRuns) {
  for (bool guidance : {false, true}) {
    auto cfg = tiny_config(guidance, 2, 2);
    auto model = make_model(cfg, random_state(FluxTransformer2DModel(cfg), 31));
    auto in = random_inputs(cfg, 2, 4, 3, 6, 32, guidance);
    auto both = model->call("forward", in).at("sample");
    for (int64_t i = 0; i < 2; ++i) {
      auto one = model->call("forward", slice_batch(in, i)).at("sample");
      EXPECT_LE(max_rel_error(both.narrow(0, i, 1), one), 1e-6) << "guidance " << guidance;
    }
    EXPECT_GT(max_rel_error(both[0], both[1]), 1e-2);
    // A [1] timestep broadcasts over the batch like diffusers.
    auto in1 = in;
    in1["timestep"] = in["timestep"].narrow(0, 0, 1);
    auto same_t = in;
    same_t["timestep"] = in["timestep"][0].expand({2}).contiguous();
    EXPECT_LE(max_rel_error(model->call("forward", in1).at("sample"),
                            model->call("forward", same_t).at("sample")),
              1e-6);
  }
}

TEST_F(FluxTest, GuidanceIsRequiredAndChangesTheOutput) {
  auto cfg = tiny_config(true, 1, 1);
  auto model = make_model(cfg, random_state(FluxTransformer2DModel(cfg), 41));
  auto in = random_inputs(cfg, 1, 2, 2, 3, 42, true);
  auto a = model->call("forward", in).at("sample");
  in["guidance"] = in["guidance"] + 1.5;
  auto b = model->call("forward", in).at("sample");
  EXPECT_GT(max_rel_error(a, b), 1e-3);
  in.erase("guidance");
  expect_error_containing([&] { model->call("forward", in); }, {"guidance", "missing"});

  // Without guidance_embeds a guidance input is accepted and ignored.
  auto cfg0 = tiny_config(false, 1, 1);
  auto model0 = make_model(cfg0, random_state(FluxTransformer2DModel(cfg0), 43));
  auto in0 = random_inputs(cfg0, 1, 2, 2, 3, 44, false);
  auto c = model0->call("forward", in0).at("sample");
  in0["guidance"] = at::full({1}, 3.5);
  EXPECT_TRUE(at::equal(model0->call("forward", in0).at("sample"), c));
}

TEST_F(FluxTest, ReducedPrecisionAgreesWithFloat32) {
  auto cfg = tiny_config(true, 2, 2);
  auto sd = random_state(FluxTransformer2DModel(cfg), 51);
  auto in = random_inputs(cfg, 2, 3, 4, 5, 52, true);
  // diffusers rounds t * 1000 to the model dtype (timestep.to(dtype) * 1000), which moves the
  // sinusoid's fast components for arbitrary t: compare at values exact in bf16 and fp16, with
  // pipeline-like integer ids.
  in["timestep"] = at::tensor({0.5f, 0.25f});
  in["guidance"] = at::tensor({4.0f, 2.0f});
  in["txt_ids"] = at::zeros({5, 3});
  auto ref = make_model(cfg, sd)->call("forward", in).at("sample");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto out = make_model(cfg, sd, dtype)->call("forward", cast_floats(in, dtype)).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_FALSE(at::isnan(out).any().item<bool>());
    const double err = max_rel_error(out, ref);
    std::cout << "[ random 2+2 " << (dtype == at::kHalf ? "fp16" : "bf16") << " vs fp32 ] " << err
              << std::endl;
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 4e-2);
  }
}

// ---- staged forward and the attention hook ------------------------------------------------------

TEST_F(FluxTest, StagedForwardEqualsForward) {
  auto cfg = tiny_config(true, 3, 3);
  auto model = make_model(cfg, random_state(FluxTransformer2DModel(cfg), 61));
  auto in = random_inputs(cfg, 1, 3, 3, 4, 62, true);
  auto full = model->call("forward", in).at("sample");
  auto parsed = model->parse_inputs(in);
  auto st = model->embed(parsed);
  EXPECT_EQ(st.text_tokens, 4);
  EXPECT_EQ(st.rope.cos.sizes(), (std::vector<int64_t>{13, 16}));
  model->run_double_blocks(st, 0, 1);
  model->run_double_blocks(st, 1, 1);  // empty range
  model->run_double_blocks(st, 1, 3);
  model->run_single_blocks(st, 0, 2);
  EXPECT_TRUE(st.joined);
  EXPECT_EQ(st.hidden.size(1), 13);
  model->run_single_blocks(st, 2, 3);
  EXPECT_TRUE(at::equal(model->finalize(st), full));
  expect_error_containing([&] { model->run_double_blocks(st, 0, 1); }, {"joined"});
  expect_error_containing([&] { model->run_single_blocks(st, 2, 4); }, {"[2, 4)", "3 single"});
}

TEST_F(FluxTest, EveryAttentionGoesThroughTheHook) {
  auto cfg = tiny_config(false, 2, 3);
  auto model = make_model(cfg, random_state(FluxTransformer2DModel(cfg), 71));
  auto in = random_inputs(cfg, 2, 2, 3, 5, 72, false);
  auto ref = model->call("forward", in).at("sample");
  std::vector<int64_t> layers;
  model->set_attention_hook([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const xfuser::models::AttentionCall& call) {
    layers.push_back(call.layer);
    EXPECT_EQ(call.text_tokens, 5);
    EXPECT_TRUE(call.text_first);
    EXPECT_EQ(q.sizes(), (std::vector<int64_t>{2, 11, 2, 16}));  // [B, L+N, H, hd]
    EXPECT_EQ(k.sizes(), q.sizes());
    // Split the keys in two and merge: what ring attention will do.
    auto a = xfuser::backends::attention(q, k.narrow(1, 0, 4), v.narrow(1, 0, 4));
    auto b = xfuser::backends::attention(q, k.narrow(1, 4, 7), v.narrow(1, 4, 7));
    return xfuser::backends::merge_attention(a, b).out;
  });
  auto hooked = model->call("forward", in).at("sample");
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_LE(max_rel_error(hooked, ref), 1e-5);
  // A hook that changes the attention changes the output (the model has no other path).
  model->set_attention_hook([](const at::Tensor& q, const at::Tensor&, const at::Tensor& v,
                               const xfuser::models::AttentionCall&) { return at::zeros_like(q); });
  EXPECT_GT(max_rel_error(model->call("forward", in).at("sample"), ref), 1e-2);
  model->set_attention_hook(nullptr);
  EXPECT_TRUE(at::equal(model->call("forward", in).at("sample"), ref));
}

// ---- input checks -------------------------------------------------------------------------------

TEST_F(FluxTest, InputErrorsNameTheInput) {
  auto cfg = tiny_config(false, 1, 1);
  auto model = make_model(cfg, random_state(FluxTransformer2DModel(cfg), 81));
  auto good = random_inputs(cfg, 1, 2, 2, 3, 82, false);
  ASSERT_NO_THROW(model->call("forward", good));

  auto in = good;
  in["hidden_states"] = at::randn({1, 4, 9});
  expect_error_containing([&] { model->call("forward", in); },
                          {"hidden_states", "[B, N, 8]", "[1, 4, 9]"});
  in = good;
  in.erase("timestep");
  expect_error_containing([&] { model->call("forward", in); },
                          {"missing required input 'timestep'"});
  in = good;
  in.erase("encoder_hidden_states");
  expect_error_containing([&] { model->call("forward", in); }, {"encoder_hidden_states"});
  in = good;
  in["return_dict"] = at::zeros({1});
  expect_error_containing([&] { model->call("forward", in); },
                          {"unknown input(s) return_dict", "hidden_states", "txt_ids", "guidance"});
  in = good;
  in["encoder_hidden_states"] = at::randn({2, 3, 24});
  expect_error_containing([&] { model->call("forward", in); },
                          {"encoder_hidden_states", "[1, L, 24]"});
  in = good;
  in["pooled_projections"] = at::randn({1, 13});
  expect_error_containing([&] { model->call("forward", in); }, {"pooled_projections", "[1, 12]"});
  in = good;
  in["img_ids"] = grid_ids(2, 3);
  expect_error_containing([&] { model->call("forward", in); }, {"img_ids", "[4, 3]"});
  in = good;
  in["txt_ids"] = at::zeros({3, 2});
  expect_error_containing([&] { model->call("forward", in); }, {"txt_ids", "[3, 3]"});
  in = good;
  in["timestep"] = at::rand({3});
  expect_error_containing([&] { model->call("forward", in); }, {"timestep"});
  expect_error_containing([&] { model->call("decode", good); }, {"decode", "forward"});

  FluxTransformer2DModel unloaded(cfg);
  expect_error_containing([&] { unloaded.call("forward", good); }, {"loaded"});
}

}  // namespace
