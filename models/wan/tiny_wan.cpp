#include "models/wan/tiny_wan.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/tiny_pipeline.h"
#include "models/flux/tiny_flux.h"
#include "models/tokenizers/spm_library.h"

namespace xfuser::models::wan {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const fs::path& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "cannot read ", path.string());
  return json::parse(in);
}

}  // namespace

namespace {

// Wan 2.1 (one transformer; I2V with CLIP) or Wan 2.2 A14B (two experts; I2V without CLIP).
void write(const fs::path& out, uint64_t seed, bool i2v, bool wan22) {
  XF_CONTEXT("writing the tiny Wan ", wan22 ? "2.2" : "2.1", i2v ? " I2V" : " T2V", " pipeline to ",
             out.string());
  const bool clip = i2v && !wan22;
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());

  // The tokenizer: the tiny FLUX pipeline's T5 SentencePiece model (Wan's is google/umt5-xxl's,
  // the same SentencePiece layout).
  const fs::path flux = out / (".tiny-flux-" + std::to_string(::getpid()));
  flux::make_tiny_flux(flux, seed);
  fs::copy(flux / "tokenizer_2", out / "tokenizer", fs::copy_options::recursive);
  fs::remove_all(flux, ec);
  auto tok_config = read_json(out / "tokenizer" / "tokenizer_config.json");
  tok_config["model_max_length"] = 512;
  write_json_file(out / "tokenizer" / "tokenizer_config.json", tok_config);

  json index = {{"_class_name", i2v ? "WanImageToVideoPipeline" : "WanPipeline"},
                {"_diffusers_version", "0.33.1"},
                {"scheduler", {"diffusers", "UniPCMultistepScheduler"}},
                {"text_encoder", {"transformers", "UMT5EncoderModel"}},
                {"tokenizer", {"transformers", "T5TokenizerFast"}},
                {"transformer", {"diffusers", "WanTransformer3DModel"}},
                {"vae", {"diffusers", "AutoencoderKLWan"}}};
  constexpr int64_t kVision = 32, kInner = 64;
  if (wan22) {
    index["transformer_2"] = {"diffusers", "WanTransformer3DModel"};
    // Wan2.2-T2V-A14B's and Wan2.2-I2V-A14B's model_index.json.
    index["boundary_ratio"] = i2v ? 0.9 : 0.875;
    index["expand_timesteps"] = false;
  }
  if (clip) {
    index["image_encoder"] = {"transformers", "CLIPVisionModel"};
    index["image_processor"] = {"transformers", "CLIPImageProcessor"};
    // 32x32 pixels in 2x2 patches: 256 + 1 tokens, as many image tokens as Wan 2.1 CLIP gives.
    write_random_component(out / "image_encoder",
                           {{"architectures", {"CLIPVisionModel"}},
                            {"model_type", "clip_vision_model"},
                            {"hidden_size", kVision},
                            {"intermediate_size", 64},
                            {"projection_dim", kVision},
                            {"num_hidden_layers", 2},
                            {"num_attention_heads", 4},
                            {"num_channels", 3},
                            {"image_size", 32},
                            {"patch_size", 2},
                            {"hidden_act", "gelu"},
                            {"layer_norm_eps", 1e-5},
                            {"torch_dtype", "float32"}},
                           "model.safetensors", seed + 4);
    fs::create_directories(out / "image_processor");
    write_json_file(out / "image_processor" / "preprocessor_config.json",
                    {{"image_processor_type", "CLIPImageProcessor"},
                     {"do_resize", true},
                     {"size", {{"shortest_edge", 32}}},
                     {"resample", 3},
                     {"do_center_crop", true},
                     {"crop_size", {{"height", 32}, {"width", 32}}},
                     {"do_rescale", true},
                     {"rescale_factor", 1.0 / 255.0},
                     {"do_normalize", true},
                     {"image_mean", {0.48145466, 0.4578275, 0.40821073}},
                     {"image_std", {0.26862954, 0.26130258, 0.27577711}},
                     {"do_convert_rgb", true}});
  }
  write_json_file(out / "model_index.json", index);
  fs::create_directories(out / "scheduler");
  // Wan2.1-T2V-14B-Diffusers' scheduler_config.json.
  write_json_file(out / "scheduler" / "scheduler_config.json",
                  {{"_class_name", "UniPCMultistepScheduler"},
                   {"_diffusers_version", "0.33.1"},
                   {"num_train_timesteps", 1000},
                   {"beta_start", 0.0001},
                   {"beta_end", 0.02},
                   {"beta_schedule", "linear"},
                   {"solver_order", 2},
                   {"prediction_type", "flow_prediction"},
                   {"predict_x0", true},
                   {"solver_type", "bh2"},
                   {"lower_order_final", true},
                   {"use_flow_sigmas", true},
                   {"flow_shift", 5.0},
                   {"final_sigmas_type", "zero"},
                   {"timestep_spacing", "linspace"},
                   {"steps_offset", 0}});

  constexpr int64_t kText = 64;
  auto spm = tokenizers::SentencePieceModel::load(out / "tokenizer" / "spiece.model");
  write_random_component(out / "text_encoder",
                         {{"architectures", {"UMT5EncoderModel"}},
                          {"model_type", "umt5"},
                          {"vocab_size", spm->piece_size()},
                          {"d_model", kText},
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
                         "model.safetensors", seed + 1);
  json transformer = {{"_class_name", "WanTransformer3DModel"},
                      {"_diffusers_version", "0.33.1"},
                      {"patch_size", {1, 2, 2}},
                      {"num_attention_heads", 4},
                      {"attention_head_dim", kInner / 4},
                      {"in_channels", i2v ? 36 : 16},
                      {"out_channels", 16},
                      {"text_dim", kText},
                      {"freq_dim", 256},
                      {"ffn_dim", 128},
                      {"num_layers", 2},
                      {"cross_attn_norm", true},
                      {"qk_norm", "rms_norm_across_heads"},
                      {"eps", 1e-6},
                      {"rope_max_seq_len", 1024}};
  if (clip) {
    transformer["image_dim"] = kVision;
    transformer["added_kv_proj_dim"] = kInner;
  }
  write_random_component(out / "transformer", transformer, "diffusion_pytorch_model.safetensors",
                         seed + 2);
  if (wan22) {
    write_random_component(out / "transformer_2", transformer,
                           "diffusion_pytorch_model.safetensors", seed + 5);
  }
  write_random_component(out / "vae",
                         {{"_class_name", "AutoencoderKLWan"},
                          {"_diffusers_version", "0.33.1"},
                          {"base_dim", 8},
                          {"z_dim", 16},
                          {"dim_mult", {1, 1, 2, 2}},
                          {"num_res_blocks", 1},
                          {"attn_scales", json::array()},
                          {"temperal_downsample", {false, true, true}},
                          {"dropout", 0.0},
                          {"latents_mean",
                           {-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                            0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921}},
                          {"latents_std",
                           {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687,
                            2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160}}},
                         "diffusion_pytorch_model.safetensors", seed + 3);
}

}  // namespace

void write_tiny_wan_t2v(const fs::path& dir, uint64_t seed) { write(dir, seed, false, false); }

void write_tiny_wan_i2v(const fs::path& dir, uint64_t seed) { write(dir, seed, true, false); }

void write_tiny_wan22_t2v(const fs::path& dir, uint64_t seed) { write(dir, seed, false, true); }

void write_tiny_wan22_i2v(const fs::path& dir, uint64_t seed) { write(dir, seed, true, true); }

}  // namespace xfuser::models::wan
