#include "models/hunyuan_video15/tiny_hunyuan_video15.h"

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/tiny_pipeline.h"
#include "models/hunyuan_video15/hunyuan_video15_prompt.h"
#include "models/tokenizers/bpe_trainer.h"

namespace xfuser::models::hunyuan_video15 {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Qwen2's pre-tokenizer regex (tokenizer.json's Split pattern).
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Qwen2.5-VL's special tokens, in their order after the vocabulary (<|endoftext|> is the pad).
const std::vector<std::string>& qwen_special_tokens() {
  static const std::vector<std::string> tokens = {
      "<|endoftext|>",      "<|im_start|>",     "<|im_end|>",     "<|object_ref_start|>",
      "<|object_ref_end|>", "<|box_start|>",    "<|box_end|>",    "<|quad_start|>",
      "<|quad_end|>",       "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
      "<|image_pad|>",      "<|video_pad|>"};
  return tokens;
}

// Qwen2.5-VL's chat template (the pipeline renders it itself; written for diffusers).
constexpr const char* kChatTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for "
    "message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' "
    "in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% "
    "if add_vision_id %}Picture {{ image_count.value }}: {% endif "
    "%}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in "
    "content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ "
    "video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in "
    "content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}";

std::string corpus() {
  return std::string(kSystemMessage) +
         "\na cat sits on a red chair. A dog runs on the beach at sunset, waves in the "
         "background. A woman with a blue umbrella walks through the rain at night; neon lights "
         "reflect on the wet street. The camera slowly pans across a mountain lake at sunrise, "
         "birds fly over the water. Two people dance in a golden field, cinematic lighting, "
         "close up shot of a flower swaying in the wind, an old man reading a book in a library, "
         "a red car drives down a city street, the sign says \"OPEN\".\n";
}

json added_token(const std::string& content, bool strip_and_normalize) {
  return {{"content", content},
          {"lstrip", strip_and_normalize},
          {"normalized", strip_and_normalize},
          {"rstrip", strip_and_normalize},
          {"single_word", false},
          {"special", true}};
}

void write_qwen_tokenizer(const fs::path& tok, const std::string& tokenizer_json) {
  fs::create_directories(tok);
  write_text_file(tok / "tokenizer.json", tokenizer_json);
  const json parsed = json::parse(tokenizer_json);
  json decoder = json::object();
  json added = json::object();
  for (const auto& t : parsed.at("added_tokens")) {
    const auto id = t.at("id").get<int64_t>();
    const auto content = t.at("content").get<std::string>();
    decoder[std::to_string(id)] = added_token(content, false);
    added[content] = id;
  }
  write_json_file(tok / "tokenizer_config.json", {{"added_tokens_decoder", decoder},
                                                  {"bos_token", nullptr},
                                                  {"clean_up_tokenization_spaces", false},
                                                  {"eos_token", "<|im_end|>"},
                                                  {"errors", "replace"},
                                                  {"extra_special_tokens", json::object()},
                                                  {"model_max_length", 131072},
                                                  {"pad_token", "<|endoftext|>"},
                                                  {"split_special_tokens", false},
                                                  {"tokenizer_class", "Qwen2Tokenizer"},
                                                  {"unk_token", nullptr}});
  write_json_file(tok / "added_tokens.json", added);
  const auto special = [](const std::string& content) {
    return json{{"content", content},
                {"lstrip", false},
                {"normalized", false},
                {"rstrip", false},
                {"single_word", false}};
  };
  write_json_file(tok / "special_tokens_map.json",
                  {{"eos_token", special("<|im_end|>")}, {"pad_token", special("<|endoftext|>")}});
  write_text_file(tok / "chat_template.jinja", kChatTemplate);
}

// ByT5Tokenizer (google/byt5-small's files): <pad> </s> <unk> at 0..2, the 256 bytes at 3..258,
// then 125 <extra_id_N> tokens at 259..383.
void write_byt5_tokenizer(const fs::path& tok) {
  constexpr int kExtra = 125;
  fs::create_directories(tok);
  json decoder = json::object();
  json added = json::object();
  json additional = json::array();
  const std::vector<std::string> base = {"<pad>", "</s>", "<unk>"};
  for (size_t i = 0; i < base.size(); ++i) decoder[std::to_string(i)] = added_token(base[i], true);
  for (int i = 0; i < kExtra; ++i) {
    const std::string name = "<extra_id_" + std::to_string(i) + ">";
    decoder[std::to_string(259 + i)] = added_token(name, false);
    added[name] = 259 + i;
    additional.push_back(name);
  }
  write_json_file(tok / "tokenizer_config.json",
                  {{"added_tokens_decoder", decoder},
                   {"additional_special_tokens", additional},
                   {"clean_up_tokenization_spaces", false},
                   {"eos_token", "</s>"},
                   {"extra_ids", 0},
                   {"extra_special_tokens", json::object()},
                   {"model_max_length", 1000000000000000019884624838656.0},
                   {"pad_token", "<pad>"},
                   {"tokenizer_class", "ByT5Tokenizer"},
                   {"unk_token", "<unk>"}});
  write_json_file(tok / "added_tokens.json", added);
  write_json_file(tok / "special_tokens_map.json", {{"additional_special_tokens", additional},
                                                    {"eos_token", "</s>"},
                                                    {"pad_token", "<pad>"},
                                                    {"unk_token", "<unk>"}});
}

}  // namespace

std::string tiny_hunyuan_video15_tokenizer_json() {
  tokenizers::BpeTrainerOptions options;
  options.split_pattern = kQwen2Pattern;
  options.special_tokens = qwen_special_tokens();
  options.specials_first = false;
  options.post_processor = {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", false},
                            {"use_regex", false}};
  options.num_merges = 300;
  json tok = json::parse(tokenizers::train_byte_level_bpe(corpus(), options));
  // Qwen2's tokenizer.json: NFC before the split, merges always applied.
  tok["normalizer"] = {{"type", "NFC"}};
  tok["model"]["ignore_merges"] = false;
  return tok.dump(2) + "\n";
}

void write_tiny_hunyuan_video15(const fs::path& out, uint64_t seed, bool image_to_video) {
  XF_CONTEXT("writing the tiny HunyuanVideo-1.5 pipeline to ", out.string());
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());
  const std::string version = "0.36.0";
  const std::string tf_version = "4.57.1";

  json index = {{"_class_name",
                 image_to_video ? "HunyuanVideo15ImageToVideoPipeline" : "HunyuanVideo15Pipeline"},
                {"_diffusers_version", version},
                {"guider", {"diffusers", "ClassifierFreeGuidance"}},
                {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                {"text_encoder", {"transformers", "Qwen2_5_VLTextModel"}},
                {"text_encoder_2", {"transformers", "T5EncoderModel"}},
                {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
                {"tokenizer_2", {"transformers", "ByT5Tokenizer"}},
                {"transformer", {"diffusers", "HunyuanVideo15Transformer3DModel"}},
                {"vae", {"diffusers", "AutoencoderKLHunyuanVideo15"}}};
  if (image_to_video) {
    index["feature_extractor"] = {"transformers", "SiglipImageProcessor"};
    index["image_encoder"] = {"transformers", "SiglipVisionModel"};
  }
  write_json_file(out / "model_index.json", index);
  fs::create_directories(out / "scheduler");
  write_json_file(out / "scheduler" / "scheduler_config.json",
                  {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                   {"_diffusers_version", version},
                   {"base_image_seq_len", 256},
                   {"base_shift", 0.5},
                   {"invert_sigmas", false},
                   {"max_image_seq_len", 4096},
                   {"max_shift", 1.15},
                   {"num_train_timesteps", 1000},
                   {"shift", 5.0},
                   {"shift_terminal", nullptr},
                   {"stochastic_sampling", false},
                   {"time_shift_type", "exponential"},
                   {"use_beta_sigmas", false},
                   {"use_dynamic_shifting", false},
                   {"use_exponential_sigmas", false},
                   {"use_karras_sigmas", false}});
  fs::create_directories(out / "guider");
  write_json_file(out / "guider" / "guider_config.json", {{"_class_name", "ClassifierFreeGuidance"},
                                                          {"_diffusers_version", version},
                                                          {"enabled", true},
                                                          {"guidance_rescale", 0.0},
                                                          {"guidance_scale", 6.0},
                                                          {"start", 0.0},
                                                          {"stop", 1.0},
                                                          {"use_original_formulation", false}});

  // tokenizer/ + text_encoder/: Qwen2Tokenizer and a 3-layer Qwen2_5_VLTextModel (the pipeline
  // reads hidden_states[-3]).
  const std::string tokenizer_json = tiny_hunyuan_video15_tokenizer_json();
  write_qwen_tokenizer(out / "tokenizer", tokenizer_json);
  const json parsed = json::parse(tokenizer_json);
  const int64_t vocab_size = static_cast<int64_t>(parsed.at("model").at("vocab").size() +
                                                  parsed.at("added_tokens").size());
  const int64_t text_dim = 24;
  write_random_component(
      out / "text_encoder",
      {{"architectures", {"Qwen2_5_VLTextModel"}},
       {"attention_dropout", 0.0},
       {"dtype", "float32"},
       {"hidden_act", "silu"},
       {"hidden_size", text_dim},
       {"initializer_range", 0.02},
       {"intermediate_size", 32},
       {"layer_types", {"full_attention", "full_attention", "full_attention"}},
       {"max_position_embeddings", 2048},
       {"max_window_layers", 80},
       {"model_type", "qwen2_5_vl_text"},
       {"num_attention_heads", 2},
       {"num_hidden_layers", 3},
       {"num_key_value_heads", 1},
       {"rms_norm_eps", 1e-6},
       {"rope_scaling",
        {{"mrope_section", {1, 1, 4}}, {"rope_type", "default"}, {"type", "default"}}},
       {"rope_theta", 1000000.0},
       {"sliding_window", nullptr},
       {"tie_word_embeddings", false},
       {"transformers_version", tf_version},
       {"use_cache", true},
       {"use_sliding_window", false},
       {"vocab_size", vocab_size}},
      "model.safetensors", seed + 21);

  // tokenizer_2/ + text_encoder_2/: ByT5 (bytes + 3 specials + 125 extra ids = 384 ids).
  write_byt5_tokenizer(out / "tokenizer_2");
  const int64_t byt5_dim = 12;
  write_random_component(out / "text_encoder_2",
                         {{"architectures", {"T5EncoderModel"}},
                          {"classifier_dropout", 0.0},
                          {"d_ff", 24},
                          {"d_kv", 4},
                          {"d_model", byt5_dim},
                          {"dense_act_fn", "gelu_new"},
                          {"dropout_rate", 0.1},
                          {"dtype", "float32"},
                          {"eos_token_id", 1},
                          {"feed_forward_proj", "gated-gelu"},
                          {"initializer_factor", 1.0},
                          {"is_encoder_decoder", false},
                          {"is_gated_act", true},
                          {"layer_norm_epsilon", 1e-6},
                          {"model_type", "t5"},
                          {"num_decoder_layers", 2},
                          {"num_heads", 3},
                          {"num_layers", 2},
                          {"pad_token_id", 0},
                          {"relative_attention_max_distance", 128},
                          {"relative_attention_num_buckets", 32},
                          {"tie_word_embeddings", false},
                          {"transformers_version", tf_version},
                          {"use_cache", false},
                          {"vocab_size", 384}},
                         "model.safetensors", seed + 22);

  // image_encoder/ + feature_extractor/ (i2v): SigLIP on 16x16 pictures, 16 tokens of width 10.
  const int64_t image_dim = 10;
  if (image_to_video) {
    write_random_component(out / "image_encoder",
                           {{"architectures", {"SiglipVisionModel"}},
                            {"attention_dropout", 0.0},
                            {"dtype", "float32"},
                            {"hidden_act", "gelu_pytorch_tanh"},
                            {"hidden_size", image_dim},
                            {"image_size", 16},
                            {"intermediate_size", 16},
                            {"layer_norm_eps", 1e-6},
                            {"model_type", "siglip_vision_model"},
                            {"num_attention_heads", 2},
                            {"num_channels", 3},
                            {"num_hidden_layers", 2},
                            {"patch_size", 4},
                            {"transformers_version", tf_version}},
                           "model.safetensors", seed + 23);
    fs::create_directories(out / "feature_extractor");
    write_json_file(out / "feature_extractor" / "preprocessor_config.json",
                    {{"do_convert_rgb", nullptr},
                     {"do_normalize", true},
                     {"do_rescale", true},
                     {"do_resize", true},
                     {"image_mean", {0.5, 0.5, 0.5}},
                     {"image_processor_type", "SiglipImageProcessor"},
                     {"image_std", {0.5, 0.5, 0.5}},
                     {"resample", 3},
                     {"rescale_factor", 0.00392156862745098},
                     {"size", {{"height", 16}, {"width", 16}}}});
  }

  // transformer/: diffusers hard-codes the ByT5 projector's hidden width
  // (HunyuanVideo15ByT5TextProjection(text_embed_2_dim, 2048, inner_dim): a 2048 x 2048 linear,
  // 16 MB in fp32); xfuser reads the width from "xfuser_byt5_hidden_size" (default 2048), so this
  // tiny folder uses 32, as the diffusers-made fixtures do. diffusers ignores the key: it cannot
  // load this transformer.
  write_random_component(out / "transformer",
                         {{"_class_name", "HunyuanVideo15Transformer3DModel"},
                          {"_diffusers_version", version},
                          {"attention_head_dim", 8},
                          {"image_embed_dim", image_dim},
                          {"in_channels", 9},
                          {"mlp_ratio", 2.0},
                          {"num_attention_heads", 2},
                          {"num_layers", 2},
                          {"num_refiner_layers", 1},
                          {"out_channels", 4},
                          {"patch_size", 1},
                          {"patch_size_t", 1},
                          {"qk_norm", "rms_norm"},
                          {"rope_axes_dim", {2, 2, 4}},
                          {"rope_theta", 256.0},
                          {"target_size", image_to_video ? 48 : 640},
                          {"task_type", image_to_video ? "i2v" : "t2v"},
                          {"text_embed_2_dim", byt5_dim},
                          {"text_embed_dim", text_dim},
                          {"use_meanflow", image_to_video},
                          {"xfuser_byt5_hidden_size", 32}},
                         "diffusion_pytorch_model.safetensors", seed + 24);

  write_random_component(out / "vae",
                         {{"_class_name", "AutoencoderKLHunyuanVideo15"},
                          {"_diffusers_version", version},
                          {"block_out_channels", {4, 4, 8, 8, 8}},
                          {"downsample_match_channel", true},
                          {"in_channels", 3},
                          {"latent_channels", 4},
                          {"layers_per_block", 1},
                          {"out_channels", 3},
                          {"scaling_factor", 1.03682},
                          {"spatial_compression_ratio", 16},
                          {"temporal_compression_ratio", 4},
                          {"upsample_match_channel", true}},
                         "diffusion_pytorch_model.safetensors", seed + 25);
}

}  // namespace xfuser::models::hunyuan_video15
