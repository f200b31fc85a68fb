#include "models/sd3/tiny_sd3.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/tiny_pipeline.h"
#include "models/flux/tiny_flux.h"
#include "models/sd3/sd3_transformer.h"
#include "models/tokenizers/spm_library.h"
#include "models/weights/safetensors.h"

namespace xfuser::models::sd3 {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const fs::path& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "cannot read ", path.string());
  return json::parse(in);
}

// A component folder with seeded random weights; SD3's position table holds the sin-cos table
// diffusers stores.
void write_component(const fs::path& dir, const json& config, const std::string& weights_name,
                     uint64_t seed) {
  write_random_component(dir, config, weights_name, seed,
                         [&](const std::string& name, const at::Tensor& t) {
                           if (name != "pos_embed.pos_embed" ||
                               config.value("_class_name", "") != "SD3Transformer2DModel") {
                             return t;
                           }
                           auto c = SD3Config::from_json(config, (dir / "config.json").string());
                           return SD3Transformer2DModel::sincos_pos_table(
                                      c.inner_dim(), c.max_grid(), c.base_size(), t.options())
                               .unsqueeze(0);
                         });
}

json clip_config(const std::string& act, int64_t vocab, int64_t hidden, int64_t intermediate,
                 int64_t projection) {
  return {{"architectures", {"CLIPTextModelWithProjection"}},
          {"model_type", "clip_text_model"},
          {"vocab_size", vocab},
          {"hidden_size", hidden},
          {"intermediate_size", intermediate},
          {"projection_dim", projection},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"max_position_embeddings", 77},
          {"hidden_act", act},
          {"layer_norm_eps", 1e-5},
          {"bos_token_id", vocab - 2},
          {"eos_token_id", vocab - 1},
          {"pad_token_id", vocab - 1},
          {"torch_dtype", "float32"}};
}

void write(const fs::path& out, uint64_t seed, bool with_t5) {
  XF_CONTEXT("writing the tiny SD3 pipeline to ", out.string());
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());

  // The tokenizers: those of the tiny FLUX pipeline (CLIP BPE, T5 SentencePiece).
  const fs::path flux = out / (".tiny-flux-" + std::to_string(::getpid()));
  flux::make_tiny_flux(flux, seed);
  const auto copy = fs::copy_options::recursive;
  fs::copy(flux / "tokenizer", out / "tokenizer", copy);
  // SD3's CLIP-G tokenizer pads with "!" (id 0), CLIP-L's with <|endoftext|>.
  fs::copy(flux / "tokenizer", out / "tokenizer_2", copy);
  auto special = read_json(out / "tokenizer_2" / "special_tokens_map.json");
  special["pad_token"] = "!";
  write_json_file(out / "tokenizer_2" / "special_tokens_map.json", special);
  auto tok_config = read_json(out / "tokenizer_2" / "tokenizer_config.json");
  tok_config["pad_token"] = "!";
  write_json_file(out / "tokenizer_2" / "tokenizer_config.json", tok_config);
  if (with_t5) {
    fs::copy(flux / "tokenizer_2", out / "tokenizer_3", copy);
    auto t5_config = read_json(out / "tokenizer_3" / "tokenizer_config.json");
    t5_config["model_max_length"] = 256;
    write_json_file(out / "tokenizer_3" / "tokenizer_config.json", t5_config);
  }
  fs::remove_all(flux, ec);
  const int64_t clip_vocab =
      static_cast<int64_t>(read_json(out / "tokenizer" / "vocab.json").size());

  const json null_pair = {nullptr, nullptr};
  write_json_file(out / "model_index.json",
                  {{"_class_name", "StableDiffusion3Pipeline"},
                   {"_diffusers_version", "0.33.1"},
                   {"feature_extractor", null_pair},
                   {"image_encoder", null_pair},
                   {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                   {"text_encoder", {"transformers", "CLIPTextModelWithProjection"}},
                   {"text_encoder_2", {"transformers", "CLIPTextModelWithProjection"}},
                   {"text_encoder_3", with_t5 ? json{"transformers", "T5EncoderModel"} : null_pair},
                   {"tokenizer", {"transformers", "CLIPTokenizer"}},
                   {"tokenizer_2", {"transformers", "CLIPTokenizer"}},
                   {"tokenizer_3", with_t5 ? json{"transformers", "T5TokenizerFast"} : null_pair},
                   {"transformer", {"diffusers", "SD3Transformer2DModel"}},
                   {"vae", {"diffusers", "AutoencoderKL"}}});

  fs::create_directories(out / "scheduler");
  write_json_file(out / "scheduler" / "scheduler_config.json",
                  {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                   {"_diffusers_version", "0.33.1"},
                   {"num_train_timesteps", 1000},
                   {"shift", 3.0},
                   {"use_dynamic_shifting", false}});

  // CLIP-L layout (quick GELU) and CLIP-G layout (wider, erf GELU); SD3 uses both with
  // projection: hidden_states[-2] for the sequence, text_embeds for the pooled vector.
  constexpr int64_t kClipL = 32, kClipG = 48, kT5 = 96;
  write_component(out / "text_encoder", clip_config("quick_gelu", clip_vocab, kClipL, 64, kClipL),
                  "model.safetensors", seed + 1);
  write_component(out / "text_encoder_2", clip_config("gelu", clip_vocab, kClipG, 96, kClipG),
                  "model.safetensors", seed + 2);
  if (with_t5) {
    auto spm = tokenizers::SentencePieceModel::load(out / "tokenizer_3" / "spiece.model");
    write_component(out / "text_encoder_3",
                    {{"architectures", {"T5EncoderModel"}},
                     {"model_type", "t5"},
                     {"vocab_size", spm->piece_size()},
                     {"d_model", kT5},
                     {"d_kv", 8},
                     {"d_ff", 128},
                     {"num_layers", 2},
                     {"num_heads", 4},
                     {"relative_attention_num_buckets", 32},
                     {"relative_attention_max_distance", 128},
                     {"feed_forward_proj", "gated-gelu"},
                     {"layer_norm_epsilon", 1e-6},
                     {"eos_token_id", 1},
                     {"pad_token_id", 0},
                     {"torch_dtype", "float32"}},
                    "model.safetensors", seed + 3);
  }
  write_component(out / "transformer",
                  {{"_class_name", "SD3Transformer2DModel"},
                   {"_diffusers_version", "0.33.1"},
                   {"sample_size", 32},
                   {"patch_size", 2},
                   {"in_channels", 16},
                   {"out_channels", 16},
                   {"num_layers", 2},
                   {"attention_head_dim", 16},
                   {"num_attention_heads", 4},
                   {"joint_attention_dim", kT5},
                   {"caption_projection_dim", 64},
                   {"pooled_projection_dim", kClipL + kClipG},
                   {"pos_embed_max_size", 64},
                   {"dual_attention_layers", {0}},
                   {"qk_norm", "rms_norm"}},
                  "diffusion_pytorch_model.safetensors", seed + 4);
  write_component(
      out / "vae",
      {{"_class_name", "AutoencoderKL"},
       {"_diffusers_version", "0.33.1"},
       {"in_channels", 3},
       {"out_channels", 3},
       {"down_block_types",
        {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
       {"up_block_types",
        {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
       {"block_out_channels", {8, 8, 16, 16}},
       {"layers_per_block", 1},
       {"act_fn", "silu"},
       {"latent_channels", 16},
       {"norm_num_groups", 4},
       {"sample_size", 256},
       {"scaling_factor", 1.5305},
       {"shift_factor", 0.0609},
       {"use_quant_conv", false},
       {"use_post_quant_conv", false},
       {"mid_block_add_attention", true},
       {"force_upcast", true}},
      "diffusion_pytorch_model.safetensors", seed + 5);
}

}  // namespace

void write_tiny_sd3(const fs::path& dir, uint64_t seed) { write(dir, seed, true); }

void write_tiny_sd3_without_t5(const fs::path& dir, uint64_t seed) { write(dir, seed, false); }

}  // namespace xfuser::models::sd3
