// The tiny StableDiffusion3Pipeline folder (models/sd3/tiny_sd3.h): every component loads through
// load_component, the layout is what diffusers' StableDiffusion3Pipeline expects (model_index
// entries, CLIP-L + CLIP-G widths padded to the T5 width = joint_attention_dim, pooled = the two
// projections), the prompt embeddings built as the pipeline builds them run through the
// transformer, the variant without T5, and determinism in the seed.
#include <algorithm>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/sd3/tiny_sd3.h"
#include "models/tokenizers/tokenizer.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::read_json;

namespace fs = std::filesystem;
using xfuser::models::load_component;
using xfuser::models::TensorMap;
using xfuser::testing::TempDir;

at::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())});
}

class TinySD3 : public ::testing::Test {
 protected:
  c10::InferenceMode guard_;
};

TEST_F(TinySD3, FolderLoadsAndFitsThePipeline) {
  TempDir tmp("xfuser-tiny-sd3");
  const fs::path dir = tmp / "tiny-sd3";
  xfuser::models::sd3::write_tiny_sd3(dir, 0);

  auto index = read_json(dir / "model_index.json");
  EXPECT_EQ(index["_class_name"], "StableDiffusion3Pipeline");
  const std::map<std::string, std::string> expected = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"},
      {"text_encoder", "CLIPTextModelWithProjection"},
      {"text_encoder_2", "CLIPTextModelWithProjection"},
      {"text_encoder_3", "T5EncoderModel"},
      {"tokenizer", "CLIPTokenizer"},
      {"tokenizer_2", "CLIPTokenizer"},
      {"tokenizer_3", "T5TokenizerFast"},
      {"transformer", "SD3Transformer2DModel"},
      {"vae", "AutoencoderKL"}};
  for (const auto& [name, cls] : expected) {
    ASSERT_TRUE(index.contains(name)) << name;
    EXPECT_EQ(index[name][1], cls) << name;
    EXPECT_TRUE(fs::is_directory(dir / name)) << name;
  }
  auto sched = read_json(dir / "scheduler" / "scheduler_config.json");
  EXPECT_EQ(sched["_class_name"], "FlowMatchEulerDiscreteScheduler");
  EXPECT_EQ(sched["shift"].get<double>(), 3.0);
  EXPECT_FALSE(sched["use_dynamic_shifting"].get<bool>());
  auto vae_cfg = read_json(dir / "vae" / "config.json");
  EXPECT_EQ(vae_cfg["latent_channels"], 16);
  EXPECT_DOUBLE_EQ(vae_cfg["scaling_factor"].get<double>(), 1.5305);
  EXPECT_DOUBLE_EQ(vae_cfg["shift_factor"].get<double>(), 0.0609);

  // Every component through load_component.
  auto clip_l = load_component((dir / "text_encoder").string(), at::kFloat);
  auto clip_g = load_component((dir / "text_encoder_2").string(), at::kFloat);
  auto t5 = load_component((dir / "text_encoder_3").string(), at::kFloat);
  auto transformer = load_component((dir / "transformer").string(), at::kFloat);
  auto vae = load_component((dir / "vae").string(), at::kFloat);
  EXPECT_EQ(clip_l->class_name(), "CLIPTextModelWithProjection");
  EXPECT_EQ(t5->class_name(), "T5EncoderModel");
  EXPECT_EQ(transformer->class_name(), "SD3Transformer2DModel");
  EXPECT_EQ(vae->class_name(), "AutoencoderKL");
  auto tok_l = xfuser::models::tokenizers::load_tokenizer(dir / "tokenizer");
  auto tok_g = xfuser::models::tokenizers::load_tokenizer(dir / "tokenizer_2");
  auto tok_t5 = xfuser::models::tokenizers::load_tokenizer(dir / "tokenizer_3");
  EXPECT_EQ(tok_l->kind(), "clip");
  EXPECT_EQ(tok_g->kind(), "clip");
  EXPECT_EQ(tok_t5->kind(), "t5");
  EXPECT_EQ(tok_g->pad_id().value_or(-1), 0);  // CLIP-G pads with "!"

  // The prompt embeddings as StableDiffusion3Pipeline builds them.
  const std::string prompt = "a photo of a cat";
  auto l_out =
      clip_l->call("forward", {{"input_ids", ids_tensor(tok_l->encode(prompt, 77).input_ids)}});
  auto g_out =
      clip_g->call("forward", {{"input_ids", ids_tensor(tok_g->encode(prompt, 77).input_ids)}});
  auto t5_out =
      t5->call("forward", {{"input_ids", ids_tensor(tok_t5->encode(prompt, 256).input_ids)}});
  const auto& l_hidden = l_out.at("hidden_states_penultimate");  // [1, 77, 32]
  const auto& g_hidden = g_out.at("hidden_states_penultimate");  // [1, 77, 48]
  const auto& t5_hidden = t5_out.at("last_hidden_state");        // [1, 256, 96]
  auto tcfg = read_json(dir / "transformer" / "config.json");
  const int64_t joint = tcfg["joint_attention_dim"];
  EXPECT_EQ(t5_hidden.size(2), joint);
  EXPECT_NE(l_hidden.size(2), g_hidden.size(2));
  const int64_t clip_width = l_hidden.size(2) + g_hidden.size(2);
  ASSERT_LE(clip_width, joint);
  auto clip = at::constant_pad_nd(at::cat({l_hidden, g_hidden}, -1), {0, joint - clip_width});
  auto text = at::cat({clip, t5_hidden}, 1);  // [1, 77 + 256, joint]
  auto pooled = at::cat({l_out.at("text_embeds"), g_out.at("text_embeds")}, -1);
  EXPECT_EQ(pooled.size(1), tcfg["pooled_projection_dim"].get<int64_t>());
  auto latents = at::randn({1, 16, 8, 12});
  auto sample = transformer
                    ->call("forward", {{"hidden_states", latents},
                                       {"encoder_hidden_states", text},
                                       {"pooled_projections", pooled},
                                       {"timestep", at::tensor({1000.0f})}})
                    .at("sample");
  EXPECT_EQ(sample.sizes(), latents.sizes());
  EXPECT_TRUE(at::isfinite(sample).all().item<bool>());
  auto image = vae->call("decode", {{"z", latents}}).at("sample");
  EXPECT_EQ(image.sizes(), (std::vector<int64_t>{1, 3, 64, 96}));

  // The SD3.5 paths exist in the checkpoint: a dual-attention block and RMS QK norms.
  xfuser::models::SafetensorsFile weights(
      (dir / "transformer" / "diffusion_pytorch_model.safetensors").string());
  auto names = weights.names();
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("transformer_blocks.0.attn2.to_q.weight"));
  EXPECT_TRUE(has("transformer_blocks.0.attn.norm_added_q.weight"));
  EXPECT_FALSE(has("transformer_blocks.2.attn.to_add_out.weight"));  // context_pre_only
}

// The folder diffusers' StableDiffusion3Pipeline made from the same layout
// (tests/fixtures/pipelines/sd3-tiny): the same components, config keys and tensor names.
TEST_F(TinySD3, LayoutIsTheDiffusersPipelineFolders) {
  const fs::path ref = xfuser::testing::fixtures_dir() / "pipelines" / "sd3-tiny";
  XF_REQUIRE_FIXTURE(ref);
  TempDir tmp("xfuser-tiny-sd3");
  const fs::path dir = tmp / "tiny-sd3";
  xfuser::models::sd3::write_tiny_sd3(dir, 1);
  auto index = read_json(dir / "model_index.json");
  auto ref_index = read_json(ref / "model_index.json");
  for (const auto& [key, value] : ref_index.items()) {
    ASSERT_TRUE(index.contains(key)) << key;
    if (key[0] == '_') continue;
    EXPECT_EQ(index[key][0], value[0]) << key;  // library (or null)
    EXPECT_EQ(fs::is_directory(dir / key), fs::is_directory(ref / key)) << key;
  }
  EXPECT_EQ(index.size(), ref_index.size());
  const std::vector<std::pair<std::string, std::string>> weights = {
      {"text_encoder", "model.safetensors"},
      {"text_encoder_2", "model.safetensors"},
      {"text_encoder_3", "model.safetensors"},
      {"transformer", "diffusion_pytorch_model.safetensors"},
      {"vae", "diffusion_pytorch_model.safetensors"}};
  for (const auto& [component, file] : weights) {
    SCOPED_TRACE(component);
    auto cfg = read_json(dir / component / "config.json");
    auto ref_cfg = read_json(ref / component / "config.json");
    for (const auto* key :
         {"_class_name", "architectures", "hidden_act", "hidden_size", "projection_dim", "d_model",
          "feed_forward_proj", "in_channels", "out_channels", "joint_attention_dim",
          "pooled_projection_dim", "patch_size", "dual_attention_layers", "qk_norm",
          "latent_channels", "scaling_factor", "shift_factor", "use_quant_conv"}) {
      if (ref_cfg.contains(key)) EXPECT_EQ(cfg[key], ref_cfg[key]) << key;
    }
    xfuser::models::SafetensorsFile a((dir / component / file).string());
    xfuser::models::SafetensorsFile b((ref / component / file).string());
    auto names = a.names(), ref_names = b.names();
    std::sort(names.begin(), names.end());
    std::sort(ref_names.begin(), ref_names.end());
    // transformers' CLIP checkpoints may hold the position_ids buffer; it is not a weight.
    ref_names.erase(
        std::remove(ref_names.begin(), ref_names.end(), "text_model.embeddings.position_ids"),
        ref_names.end());
    std::vector<std::string> only_ours, only_ref;
    std::set_difference(names.begin(), names.end(), ref_names.begin(), ref_names.end(),
                        std::back_inserter(only_ours));
    std::set_difference(ref_names.begin(), ref_names.end(), names.begin(), names.end(),
                        std::back_inserter(only_ref));
    EXPECT_TRUE(only_ours.empty())
        << "not in diffusers' folder: " << ::testing::PrintToString(only_ours);
    EXPECT_TRUE(only_ref.empty()) << "missing: " << ::testing::PrintToString(only_ref);
  }
  for (const auto* tok : {"tokenizer", "tokenizer_2", "tokenizer_3"}) {
    auto a = xfuser::models::tokenizers::load_tokenizer(dir / tok);
    auto b = xfuser::models::tokenizers::load_tokenizer(ref / tok);
    EXPECT_EQ(a->kind(), b->kind()) << tok;
  }
}

TEST_F(TinySD3, WithoutT5AndDeterministic) {
  TempDir tmp("xfuser-tiny-sd3");
  xfuser::models::sd3::write_tiny_sd3_without_t5(tmp / "a", 3);
  xfuser::models::sd3::write_tiny_sd3_without_t5(tmp / "b", 3);
  auto index = read_json(tmp / "a" / "model_index.json");
  EXPECT_TRUE(index["text_encoder_3"][0].is_null());
  EXPECT_TRUE(index["tokenizer_3"][0].is_null());
  EXPECT_FALSE(fs::exists(tmp / "a" / "text_encoder_3"));
  EXPECT_FALSE(fs::exists(tmp / "a" / "tokenizer_3"));
  for (const auto* c : {"transformer", "text_encoder", "text_encoder_2", "vae"}) {
    const std::string file = std::string(c).rfind("text", 0) == 0
                                 ? "model.safetensors"
                                 : "diffusion_pytorch_model.safetensors";
    xfuser::models::SafetensorsFile a((tmp / "a" / c / file).string());
    xfuser::models::SafetensorsFile b((tmp / "b" / c / file).string());
    for (const auto& n : a.names()) EXPECT_TRUE(at::equal(a.get(n), b.get(n))) << c << " " << n;
  }
  EXPECT_THROW(xfuser::models::sd3::write_tiny_sd3(tmp / "a", 3), xfuser::Error);  // not empty
}

}  // namespace
