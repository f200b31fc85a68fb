// HunyuanVideo15Transformer3DModel: the diffusers 0.36.0 fixtures (t2v with zero image embeds,
// i2v, meanflow with patch 2; batch 2 with padded Qwen text and glyphs) through call("forward")
// and the registries (`xfuser forward` too); bf16 / fp16; the text stream's reordering and key
// mask; a model split into two parts; parameter counts; the config and input errors.
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
#include "models/dit/dit_parallel.h"
#include "models/hunyuan_video15/hunyuan_video15_transformer.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
namespace fs = std::filesystem;
using xfuser::models::LoadOptions;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::dit::DiTPart;
using xfuser::models::hunyuan_video15::HunyuanVideo15Config;
using xfuser::models::hunyuan_video15::HunyuanVideo15Transformer3DModel;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;

const std::string kT2v = "hunyuan_video15-t2v-s1";
const std::string kI2v = "hunyuan_video15-i2v-s1";
const std::string kMeanflow = "hunyuan_video15-meanflow-s1";
const std::vector<std::string> kCases = {kT2v, kI2v, kMeanflow};

fs::path fixture_case(const std::string& name) {
  return fixtures_dir() / "diffusers-v0.36.0" / name;
}

HunyuanVideo15Config fixture_config(const std::string& name) {
  auto path = fixture_case(name) / "config.json";
  return HunyuanVideo15Config::from_json(read_json(path), path.string());
}

std::shared_ptr<HunyuanVideo15Transformer3DModel> load_fixture_model(const std::string& name,
                                                                     DiTPart part = {}) {
  auto model = std::make_shared<HunyuanVideo15Transformer3DModel>(fixture_config(name), part);
  SafetensorsFile weights((fixture_case(name) / "diffusion_pytorch_model.safetensors").string());
  LoadOptions opts;
  opts.allow_unexpected =
      !part.embedders || !part.head || part.block_begin != 0 || part.block_end != -1;
  model->load(weights, at::kFloat, "", opts);
  return model;
}

TensorMap fixture_inputs(const std::string& name) {
  SafetensorsFile file((fixture_case(name) / "inputs.safetensors").string());
  TensorMap named;
  for (const auto& n : file.names()) named[n] = file.get(n).clone();
  return named;
}

at::Tensor fixture_output(const std::string& name, const std::string& key = "sample") {
  return SafetensorsFile((fixture_case(name) / "output.safetensors").string()).get(key);
}

class HunyuanVideo15Test : public ::testing::Test {
 protected:
  void SetUp() override { xfuser::models::register_builtin_components(); }
  c10::InferenceMode guard_;
};

// ---- config -------------------------------------------------------------------------------------

TEST_F(HunyuanVideo15Test, ConfigDefaultsFollowDiffusers) {
  auto c = HunyuanVideo15Config::from_json(nlohmann::json::object());
  EXPECT_EQ(c.in_channels, 65);
  EXPECT_EQ(c.resolved_out_channels(), 32);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.attention_head_dim, 128);
  EXPECT_EQ(c.num_layers, 54);
  EXPECT_EQ(c.num_refiner_layers, 2);
  EXPECT_DOUBLE_EQ(c.mlp_ratio, 4.0);
  EXPECT_EQ(c.patch_size, 1);
  EXPECT_EQ(c.patch_size_t, 1);
  EXPECT_EQ(c.qk_norm, "rms_norm");
  EXPECT_EQ(c.text_embed_dim, 3584);
  EXPECT_EQ(c.text_embed_2_dim, 1472);
  EXPECT_EQ(c.image_embed_dim, 1152);
  EXPECT_DOUBLE_EQ(c.rope_theta, 256.0);
  EXPECT_EQ(c.rope_axes_dim, (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(c.target_size, 640);
  EXPECT_EQ(c.task_type, "i2v");
  EXPECT_FALSE(c.use_meanflow);
  EXPECT_EQ(c.byt5_hidden_size, 2048);  // diffusers' hard-coded projector width
  EXPECT_EQ(fixture_config(kT2v).byt5_hidden_size, 32);
  EXPECT_EQ(HunyuanVideo15Config::from_json({{"in_channels", 33}, {"out_channels", nullptr}})
                .resolved_out_channels(),
            33);
  // The real model's projector: 1472 -> 2048 -> 2048 -> 2048 (with biases) + the LayerNorm.
  const HunyuanVideo15Transformer3DModel full(
      HunyuanVideo15Config::from_json({{"num_layers", 1}, {"num_refiner_layers", 1}}));
  int64_t byt5 = 0;
  for (const auto& [name, slot] : full.named_parameters()) {
    if (name.rfind("context_embedder_2.", 0) != 0) continue;
    int64_t count = 1;
    for (auto d : slot->shape) count *= d;
    byt5 += count;
  }
  EXPECT_EQ(byt5, 2 * 1472 + 1472 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 2048 + 2048);
}

TEST_F(HunyuanVideo15Test, ConfigErrorsNameTheFileAndField) {
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"num_layers", "x"}}, "/c.json");
      },
      {"/c.json", "num_layers"});
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"rope_axes_dim", {16, 56, 54}}}, "c.json");
      },
      {"c.json", "rope_axes_dim", "attention_head_dim 128"});
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"qk_norm", "layer_norm"}}, "c.json");
      },
      {"c.json", "qk_norm", "layer_norm", "not supported"});
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"num_layers", 0}}, "c.json");
      },
      {"c.json", "num_layers must be >= 1"});
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"use_meanflow", "yes"}}, "c.json");
      },
      {"c.json", "use_meanflow"});
  expect_error_containing(
      [] {
        HunyuanVideo15Config::from_json({{"xfuser_byt5_hidden_size", 0}}, "c.json");
      },
      {"c.json", "xfuser_byt5_hidden_size"});
}

// ---- diffusers parity ---------------------------------------------------------------------------

TEST_F(HunyuanVideo15Test, ForwardEqualsDiffusersOnEveryFixture) {
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto model = load_fixture_model(name);
    const auto out = model->call("forward", fixture_inputs(name)).at("sample");
    const auto want = fixture_output(name);
    const auto want64 = fixture_output(name, "sample_f64");
    ASSERT_EQ(out.sizes(), want.sizes());
    EXPECT_TRUE(at::isfinite(out).all().item<bool>());
    const double rel = max_rel_error(out, want), rel64 = max_rel_error(out, want64);
    std::printf("[hunyuan_video15] %-28s vs diffusers fp32 %.2e, vs fp64 %.2e\n", name.c_str(), rel,
                rel64);
    EXPECT_LE(rel, 1e-4);
    EXPECT_LE(rel64, 1e-4);
  }
}

TEST_F(HunyuanVideo15Test, RegistryLoadsTheFolderByClassName) {
  XF_REQUIRE_FIXTURE(fixture_case(kI2v));
  auto model =
      xfuser::models::dit::load_dit_transformer(fixture_case(kI2v).string(), at::kFloat, nullptr);
  EXPECT_EQ(model->class_name(), "HunyuanVideo15Transformer3DModel");
  EXPECT_TRUE(model->text_whole());
  EXPECT_EQ(model->text_attention(), xfuser::models::dit::TextAttention::kJointImageFirst);
  EXPECT_EQ(model->num_blocks(), 2);
  const auto named = fixture_inputs(kI2v);
  const auto out =
      model->forward_outputs(model->forward(model->parse_forward_inputs(named)), named);
  EXPECT_LE(max_rel_error(out.at("sample"), fixture_output(kI2v)), 1e-4);
}

TEST_F(HunyuanVideo15Test, ComponentRegistryFamilyAndXfuserForward) {
  bool family = false;
  for (const auto& f : xfuser::models::FamilyRegistry::all()) {
    family = family || f.name == "hunyuan_video15";
  }
  EXPECT_TRUE(family);
  const fs::path bin = xfuser::testing::binary_dir() / "bin" / "xfuser";
  ASSERT_TRUE(fs::exists(bin)) << "xfuser binary not built: " << bin;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  xfuser::testing::TempDir tmp("xfuser-hunyuan-video15-forward");
  for (const auto& name : kCases) {
    SCOPED_TRACE(name);
    XF_REQUIRE_FIXTURE(fixture_case(name));
    auto component = xfuser::models::load_component(fixture_case(name).string(), at::kFloat);
    EXPECT_EQ(component->class_name(), "HunyuanVideo15Transformer3DModel");
    const auto expected = fixture_output(name);
    EXPECT_LE(
        max_rel_error(component->call("forward", fixture_inputs(name)).at("sample"), expected),
        1e-4);
    const fs::path out = tmp / (name + ".safetensors");
    std::string log;
    const int rc = xfuser::testing::run_command(
        q(bin) + " forward --model-dir " + q(fixture_case(name)) + " --inputs " +
            q(fixture_case(name) / "inputs.safetensors") + " --output " + q(out) + " --dtype fp32",
        &log);
    ASSERT_EQ(rc, 0) << log;
    auto got = xfuser::testing::read_tensors(out);
    ASSERT_TRUE(got.count("sample")) << log;
    const double err = max_rel_error(got.at("sample"), expected);
    std::printf("[hunyuan_video15] xfuser forward %-28s fp32 vs diffusers %.2e\n", name.c_str(),
                err);
    EXPECT_LE(err, 1e-4);
  }
}

TEST_F(HunyuanVideo15Test, ReducedPrecisionStaysClose) {
  XF_REQUIRE_FIXTURE(fixture_case(kI2v));
  const auto inputs = fixture_inputs(kI2v);
  const auto expected = fixture_output(kI2v);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto model = std::make_shared<HunyuanVideo15Transformer3DModel>(fixture_config(kI2v));
    SafetensorsFile weights((fixture_case(kI2v) / "diffusion_pytorch_model.safetensors").string());
    model->load(weights, dtype);
    EXPECT_EQ(model->dtype(), dtype);
    TensorMap in = inputs;  // the activations in the reduced dtype, timestep and masks as given
    for (const auto* k :
         {"hidden_states", "encoder_hidden_states", "encoder_hidden_states_2", "image_embeds"}) {
      in[k] = inputs.at(k).to(dtype);
    }
    auto out = model->call("forward", in).at("sample");
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_rel_error(out.to(at::kFloat), expected);
    std::printf("[hunyuan_video15] %s %s vs diffusers fp32 %.2e\n", kI2v.c_str(),
                c10::toString(dtype), err);
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 5e-2);
  }
}

// The output depends on the padded tokens' positions only through the masks: changing the padded
// Qwen / glyph embeddings changes nothing, changing a valid one does; and the text stream holds
// the valid tokens first (row 1 of the t2v fixture: no glyphs, 4 of 7 Qwen tokens).
TEST_F(HunyuanVideo15Test, PaddingIsInvisibleAndTheTextIsReorderedValidFirst) {
  XF_REQUIRE_FIXTURE(fixture_case(kT2v));
  auto model = load_fixture_model(kT2v);
  auto named = fixture_inputs(kT2v);
  const auto base = model->call("forward", named).at("sample");
  auto changed = named;
  changed["encoder_hidden_states"] = named["encoder_hidden_states"].clone();
  changed["encoder_hidden_states"][1].narrow(0, 4, 3).normal_();  // row 1's padded tokens
  changed["encoder_hidden_states_2"] = named["encoder_hidden_states_2"].clone();
  changed["encoder_hidden_states_2"][1].normal_();  // row 1 has no valid glyph
  changed["encoder_hidden_states_2"][0].narrow(0, 3, 2).normal_();
  EXPECT_LE(max_rel_error(model->call("forward", changed).at("sample"), base), 1e-6);
  changed["encoder_hidden_states"][1][0].add_(1.0);  // a valid token
  EXPECT_GT(max_rel_error(model->call("forward", changed).at("sample"), base), 1e-3);

  const auto in = model->parse_forward_inputs(named);
  const auto a = model->embed(in);
  // t2v: the 3 image tokens are padding. Row 0: 3 glyphs + 7 Qwen valid; row 1: 4 Qwen valid.
  // Of the 3 + 5 + 7 reordered tokens the first max(10, 4) are kept.
  ASSERT_EQ(a.text_tokens, 10);
  ASSERT_EQ(a.context.size(1), 10);
  const auto& keys = a.extra.at(HunyuanVideo15Transformer3DModel::kTextKeyMask);
  EXPECT_EQ(keys[0].sum().item<int64_t>(), 10);
  EXPECT_EQ(keys[1].sum().item<int64_t>(), 4);
  EXPECT_TRUE(keys[1].narrow(0, 0, 4).all().item<bool>());
  // Row 1: its 4 Qwen tokens, the 3 padded (not zeroed) image tokens, then the zeroed glyphs.
  EXPECT_GT(a.context[1].narrow(0, 4, 3).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(a.context[1].narrow(0, 7, 3).abs().sum().item<double>(), 0.0);
  // Row 0's valid Qwen tokens are the refiner's output + cond_type_embed[0], after its glyphs.
  EXPECT_GT(a.context[0].narrow(0, 3, 7).abs().min().item<double>(), 0.0);
  // Both rows alike (row 0's masks on row 1): every kept token valid, no key mask.
  auto same = named;
  for (const char* m : {"encoder_attention_mask", "encoder_attention_mask_2"}) {
    same[m] = named[m][0].unsqueeze(0).repeat({2, 1});
  }
  const auto b = model->embed(model->parse_forward_inputs(same));
  EXPECT_EQ(b.text_tokens, 10);
  EXPECT_EQ(b.extra.count(HunyuanVideo15Transformer3DModel::kTextKeyMask), 0u);
}

TEST_F(HunyuanVideo15Test, TwoPartsEqualTheWholeModel) {
  XF_REQUIRE_FIXTURE(fixture_case(kI2v));
  auto whole = load_fixture_model(kI2v);
  const auto in = whole->parse_forward_inputs(fixture_inputs(kI2v));
  const auto want = whole->forward(in);
  auto first = load_fixture_model(kI2v, DiTPart{0, 1, true, false});
  auto second = load_fixture_model(kI2v, DiTPart{1, 2, false, true});
  EXPECT_LT(first->num_parameters(), whole->num_parameters());
  auto a = first->embed(in);
  first->run_blocks(a, 0, 1);
  auto b = second->embed(in);
  EXPECT_FALSE(b.hidden.defined());
  EXPECT_EQ(b.text_tokens, a.text_tokens);
  b.hidden = a.hidden;
  b.context = a.context;
  second->run_blocks(b, 1, 2);
  EXPECT_LE(max_rel_error(second->finalize(b), want), 1e-6);
  expect_error_containing([&] { first->run_blocks(a, 1, 2); },
                          {"transformer_blocks.1", "not held"});
  expect_error_containing([&] { first->finalize(a); }, {"norm_out/proj_out", "not held"});
  const auto blocks = whole->block_parameters();
  const auto others = whole->other_parameters();
  ASSERT_EQ(blocks.size(), 2u);
  int64_t sum = 0;
  for (auto p : blocks) sum += p;
  for (auto p : others) sum += p;
  EXPECT_EQ(sum, whole->num_parameters());
}

// ---- input errors -------------------------------------------------------------------------------

TEST_F(HunyuanVideo15Test, BadInputsGiveClearErrors) {
  XF_REQUIRE_FIXTURE(fixture_case(kT2v));
  auto model = load_fixture_model(kT2v);
  const auto good = fixture_inputs(kT2v);
  auto with = [&](const std::string& key, const at::Tensor& t) {
    auto m = good;
    if (t.defined()) {
      m[key] = t;
    } else {
      m.erase(key);
    }
    return m;
  };
  auto fails = [&](const TensorMap& inputs, std::vector<std::string> parts) {
    expect_error_containing([&] { model->call("forward", inputs); }, parts);
  };
  fails(with("hidden_states", at::zeros({2, 8, 2, 3, 4})), {"hidden_states", "[B, 9, F, H, W]"});
  fails(with("hidden_states", {}), {"missing required input 'hidden_states'"});
  fails(with("encoder_hidden_states", at::zeros({2, 7, 23})), {"encoder_hidden_states", "24"});
  fails(with("encoder_attention_mask", at::ones({2, 6}, at::kLong)),
        {"encoder_attention_mask", "[2, 7]"});
  fails(with("encoder_attention_mask", at::full({2, 7}, 2, at::kLong)),
        {"encoder_attention_mask", "only 0 and 1"});
  fails(with("encoder_attention_mask", at::zeros({2, 7}, at::kLong)),
        {"encoder_attention_mask", "at least one valid text token"});
  fails(with("encoder_hidden_states_2", {}), {"missing required input 'encoder_hidden_states_2'"});
  fails(with("encoder_attention_mask_2", {}),
        {"missing required input 'encoder_attention_mask_2'"});
  fails(with("encoder_hidden_states_2", at::zeros({2, 5, 11})),
        {"encoder_hidden_states_2", "[2, L, 12]"});
  fails(with("encoder_attention_mask_2", at::ones({2, 4}, at::kLong)),
        {"encoder_attention_mask_2", "[2, 5]"});
  fails(with("image_embeds", {}),
        {"missing required input 'image_embeds'", "zeros for text-to-video"});
  fails(with("image_embeds", at::zeros({1, 3, 10})), {"image_embeds", "[2, N3, 10]"});
  fails(with("timestep", at::zeros({3})), {"timestep", "[2]"});
  fails(with("timestep_r", at::zeros({1})), {"timestep_r", "use_meanflow"});
  fails(with("guidance", at::zeros({2})), {"unknown input(s) guidance", "accepted inputs"});
}

}  // namespace
