#include "models/flux2/tiny_flux2.h"

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/tiny_pipeline.h"
#include "models/flux2/flux2_prompt.h"
#include "models/tokenizers/bpe_trainer.h"
#include "models/weights/safetensors.h"

namespace xfuser::models::flux2 {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Mistral-Small-3.1's Tekken pre-tokenizer regex (tokenizer.json's Split pattern).
constexpr const char* kTekkenPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The control tokens, ids 0..10 (Mistral's order; FLUX.2's prompt uses <s>, [INST], [/INST],
// [SYSTEM_PROMPT], [/SYSTEM_PROMPT]; the processor needs the [IMG] ones).
const std::vector<std::string>& control_tokens() {
  static const std::vector<std::string> tokens = {
      "<unk>", "<s>",         "</s>",      "[INST]",          "[/INST]",         "[IMG]",
      "<pad>", "[IMG_BREAK]", "[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"};
  return tokens;
}

constexpr const char* kChatTemplate =
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + content + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + content + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- content + eos_token }}{%- endif %}"
    "{%- endfor %}";

std::string corpus() {
  return std::string(kSystemMessage) +
         "\na cat sits on a red chair. A dog runs on the beach at sunset, waves in the "
         "background. A woman with a blue umbrella walks through the rain at night; neon lights "
         "reflect on the wet street. Make the cat blue, put the two together, change the "
         "background to a forest. A photo of a mountain lake at sunrise, birds fly over the "
         "water. Two people dance in a golden field, cinematic lighting, 4k, high quality, close "
         "up shot of a flower, an old man reading a book in a library, a red car on a city "
         "street.\n";
}

// N(0, std) from a seeded CPU generator (the file writer's own tensors: they go to disk).
at::Tensor seeded_randn(at::IntArrayRef shape, at::Generator& gen, double std) {
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * std;
}

void write_tensors(const fs::path& file, const std::map<std::string, at::Tensor>& tensors) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : tensors) out[name] = t.contiguous();
  save_safetensors(file.string(), out, {{"format", "pt"}});
}

// A component's named parameters with seeded random weights (norm scales ~1), as
// write_random_component makes them.
std::map<std::string, at::Tensor> random_parameters(const json& config, const std::string& cls,
                                                    const std::string& where, uint64_t seed) {
  auto component = ComponentRegistry::create(cls, config, where);
  component->init_random(seed, 0.05);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, slot] : component->named_parameters()) {
    at::Tensor t = slot->tensor.to(at::kFloat);
    const bool is_norm_scale = t.dim() == 1 && name.find("norm") != std::string::npos &&
                               name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (is_norm_scale) t = t + 1.0;
    tensors[name] = t;
  }
  return tensors;
}

}  // namespace

std::string tiny_flux2_tokenizer_json() {
  tokenizers::BpeTrainerOptions options;
  options.split_pattern = kTekkenPattern;
  options.special_tokens = control_tokens();
  options.specials_first = true;
  options.post_processor = nullptr;
  options.num_merges = 400;
  return tokenizers::train_byte_level_bpe(corpus(), options);
}

void write_tiny_flux2(const fs::path& out, uint64_t seed) {
  XF_CONTEXT("writing the tiny FLUX.2 pipeline to ", out.string());
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());
  const std::string version = "0.36.0";

  write_json_file(out / "model_index.json",
                  {{"_class_name", "Flux2Pipeline"},
                   {"_diffusers_version", version},
                   {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                   {"text_encoder", {"transformers", "Mistral3ForConditionalGeneration"}},
                   {"tokenizer", {"transformers", "PixtralProcessor"}},
                   {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
                   {"vae", {"diffusers", "AutoencoderKLFlux2"}}});
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
                   {"shift", 3.0},
                   {"shift_terminal", nullptr},
                   {"stochastic_sampling", false},
                   {"time_shift_type", "exponential"},
                   {"use_beta_sigmas", false},
                   {"use_dynamic_shifting", true},
                   {"use_exponential_sigmas", false},
                   {"use_karras_sigmas", false}});

  // tokenizer/: PixtralProcessor (Tekken-style tokenizer.json, left padding, v7 template).
  const fs::path tok = out / "tokenizer";
  fs::create_directories(tok);
  const std::string tokenizer_json = tiny_flux2_tokenizer_json();
  write_text_file(tok / "tokenizer.json", tokenizer_json);
  const int64_t vocab_size = json::parse(tokenizer_json).at("model").at("vocab").size();
  const auto& specials = control_tokens();
  json decoder = json::object();
  for (size_t i = 0; i < specials.size(); ++i) {
    decoder[std::to_string(i)] = {{"content", specials[i]}, {"lstrip", false},
                                  {"normalized", false},    {"rstrip", false},
                                  {"single_word", false},   {"special", true}};
  }
  write_json_file(tok / "tokenizer_config.json",
                  {{"added_tokens_decoder", decoder},
                   {"bos_token", "<s>"},
                   {"clean_up_tokenization_spaces", false},
                   {"eos_token", "</s>"},
                   {"extra_special_tokens", json::object()},
                   {"model_max_length", 1000000000000000019884624838656.0},
                   {"pad_token", "<pad>"},
                   {"padding_side", "left"},
                   {"processor_class", "PixtralProcessor"},
                   {"tokenizer_class", "PreTrainedTokenizerFast"},
                   {"unk_token", "<unk>"}});
  write_json_file(tok / "special_tokens_map.json", {{"bos_token", "<s>"},
                                                    {"eos_token", "</s>"},
                                                    {"pad_token", "<pad>"},
                                                    {"unk_token", "<unk>"}});
  write_text_file(tok / "chat_template.jinja", kChatTemplate);
  write_json_file(tok / "processor_config.json", {{"image_break_token", "[IMG_BREAK]"},
                                                  {"image_end_token", "[IMG_END]"},
                                                  {"image_token", "[IMG]"},
                                                  {"patch_size", 4},
                                                  {"processor_class", "PixtralProcessor"},
                                                  {"spatial_merge_size", 2}});
  write_json_file(tok / "preprocessor_config.json",
                  {{"do_convert_rgb", true},
                   {"do_normalize", true},
                   {"do_rescale", true},
                   {"do_resize", true},
                   {"image_mean", {0.48145466, 0.4578275, 0.40821073}},
                   {"image_processor_type", "PixtralImageProcessor"},
                   {"image_std", {0.26862954, 0.26130258, 0.27577711}},
                   {"patch_size", {{"height", 4}, {"width", 4}}},
                   {"processor_class", "PixtralProcessor"},
                   {"resample", 3},
                   {"rescale_factor", 0.00392156862745098},
                   {"size", {{"longest_edge", 64}}}});

  // text_encoder/: Mistral3ForConditionalGeneration (the language model from our encoder's
  // parameters; lm_head, the Pixtral vision tower and the projector written here).
  const int64_t d = 16, vd = 16, vff = 32, patch = 4, merge = 2;
  const json text_config = {{"attention_dropout", 0.0},
                            {"head_dim", 8},
                            {"hidden_act", "silu"},
                            {"hidden_size", d},
                            {"initializer_range", 0.02},
                            {"intermediate_size", 32},
                            {"max_position_embeddings", 1024},
                            {"model_type", "mistral"},
                            {"num_attention_heads", 2},
                            {"num_hidden_layers", 30},
                            {"num_key_value_heads", 1},
                            {"pad_token_id", 6},
                            {"bos_token_id", 1},
                            {"eos_token_id", 2},
                            {"rms_norm_eps", 1e-5},
                            {"rope_theta", 1000000000.0},
                            {"sliding_window", nullptr},
                            {"use_cache", true},
                            {"vocab_size", vocab_size}};
  const json te_config = {{"architectures", {"Mistral3ForConditionalGeneration"}},
                          {"dtype", "float32"},
                          {"image_token_index", 5},
                          {"model_type", "mistral3"},
                          {"multimodal_projector_bias", false},
                          {"projector_hidden_act", "gelu"},
                          {"spatial_merge_size", merge},
                          {"text_config", text_config},
                          {"transformers_version", "4.57.1"},
                          {"vision_config",
                           {{"attention_dropout", 0.0},
                            {"head_dim", 8},
                            {"hidden_act", "gelu"},
                            {"hidden_size", vd},
                            {"image_size", 16},
                            {"initializer_range", 0.02},
                            {"intermediate_size", vff},
                            {"model_type", "pixtral"},
                            {"num_attention_heads", 2},
                            {"num_channels", 3},
                            {"num_hidden_layers", 1},
                            {"patch_size", patch},
                            {"rope_theta", 10000.0}}},
                          {"vision_feature_layer", -1}};
  const fs::path te = out / "text_encoder";
  fs::create_directories(te);
  write_json_file(te / "config.json", te_config);
  write_json_file(te / "generation_config.json", {{"_from_model_config", true},
                                                  {"bos_token_id", 1},
                                                  {"eos_token_id", 2},
                                                  {"pad_token_id", 6},
                                                  {"transformers_version", "4.57.1"}});
  {
    std::map<std::string, at::Tensor> tensors;
    for (auto& [name, t] : random_parameters(te_config, "Mistral3ForConditionalGeneration",
                                             (te / "config.json").string(), seed + 11)) {
      std::string key = name;
      if (key.rfind("language_model.", 0) != 0) {
        key = key.rfind("model.", 0) == 0 ? "language_model." + key : "language_model.model." + key;
      }
      tensors[key] = t;
    }
    XF_CHECK(tensors.count("language_model.model.embed_tokens.weight"),
             "the Mistral 3 encoder's parameters have no embed_tokens.weight");
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 14);
    const double s = 0.05;
    if (!tensors.count("language_model.lm_head.weight")) {
      tensors["language_model.lm_head.weight"] = seeded_randn({vocab_size, d}, gen, s);
    }
    const auto ones = [&](int64_t n) { return seeded_randn({n}, gen, s) + 1.0; };
    tensors["multi_modal_projector.linear_1.weight"] = seeded_randn({d, vd}, gen, s);
    tensors["multi_modal_projector.linear_2.weight"] = seeded_randn({d, d}, gen, s);
    tensors["multi_modal_projector.norm.weight"] = ones(vd);
    tensors["multi_modal_projector.patch_merger.merging_layer.weight"] =
        seeded_randn({vd, vd * merge * merge}, gen, s);
    tensors["vision_tower.ln_pre.weight"] = ones(vd);
    tensors["vision_tower.patch_conv.weight"] = seeded_randn({vd, 3, patch, patch}, gen, s);
    const std::string l = "vision_tower.transformer.layers.0.";
    for (const char* p : {"k_proj", "o_proj", "q_proj", "v_proj"}) {
      tensors[l + "attention." + p + ".weight"] = seeded_randn({vd, vd}, gen, s);
    }
    tensors[l + "attention_norm.weight"] = ones(vd);
    tensors[l + "feed_forward.down_proj.weight"] = seeded_randn({vd, vff}, gen, s);
    tensors[l + "feed_forward.gate_proj.weight"] = seeded_randn({vff, vd}, gen, s);
    tensors[l + "feed_forward.up_proj.weight"] = seeded_randn({vff, vd}, gen, s);
    tensors[l + "ffn_norm.weight"] = ones(vd);
    write_tensors(te / "model.safetensors", tensors);
  }

  write_random_component(out / "transformer",
                         {{"_class_name", "Flux2Transformer2DModel"},
                          {"_diffusers_version", version},
                          {"attention_head_dim", 16},
                          {"axes_dims_rope", {4, 4, 4, 4}},
                          {"eps", 1e-6},
                          {"in_channels", 16},
                          {"joint_attention_dim", 48},
                          {"mlp_ratio", 3.0},
                          {"num_attention_heads", 2},
                          {"num_layers", 1},
                          {"num_single_layers", 1},
                          {"out_channels", nullptr},
                          {"patch_size", 1},
                          {"rope_theta", 2000},
                          {"timestep_guidance_channels", 32}},
                         "diffusion_pytorch_model.safetensors", seed + 12);

  // vae/: AutoencoderKLFlux2. Its encoder / decoder / quant convs are AutoencoderKL's (same
  // names and shapes), plus the batch norm over the 2x2-patchified latents.
  const std::vector<std::string> down(4, "DownEncoderBlock2D");
  const std::vector<std::string> up(4, "UpDecoderBlock2D");
  const int64_t latent = 4;
  const json vae_config = {{"_class_name", "AutoencoderKLFlux2"},
                           {"_diffusers_version", version},
                           {"act_fn", "silu"},
                           {"batch_norm_eps", 0.0001},
                           {"batch_norm_momentum", 0.1},
                           {"block_out_channels", {8, 8, 16, 16}},
                           {"down_block_types", down},
                           {"force_upcast", true},
                           {"in_channels", 3},
                           {"latent_channels", latent},
                           {"layers_per_block", 1},
                           {"mid_block_add_attention", true},
                           {"norm_num_groups", 4},
                           {"out_channels", 3},
                           {"patch_size", {2, 2}},
                           {"sample_size", 1024},
                           {"up_block_types", up},
                           {"use_post_quant_conv", true},
                           {"use_quant_conv", true}};
  const fs::path vae = out / "vae";
  fs::create_directories(vae);
  write_json_file(vae / "config.json", vae_config);
  {
    json kl = {{"_class_name", "AutoencoderKL"},
               {"act_fn", "silu"},
               {"block_out_channels", {8, 8, 16, 16}},
               {"down_block_types", down},
               {"up_block_types", up},
               {"in_channels", 3},
               {"out_channels", 3},
               {"latent_channels", latent},
               {"layers_per_block", 1},
               {"mid_block_add_attention", true},
               {"norm_num_groups", 4},
               {"sample_size", 1024},
               {"scaling_factor", 1.0},
               {"use_quant_conv", true},
               {"use_post_quant_conv", true}};
    auto tensors =
        random_parameters(kl, "AutoencoderKL", (vae / "config.json").string(), seed + 13);
    XF_CHECK(tensors.count("quant_conv.weight") && tensors.count("post_quant_conv.weight"),
             "the AutoencoderKL parameters lack quant_conv / post_quant_conv");
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 15);
    const int64_t bn = latent * 4;  // 2x2 patches
    tensors["bn.running_mean"] = seeded_randn({bn}, gen, 0.3);
    tensors["bn.running_var"] =
        at::rand({bn}, gen, at::TensorOptions().dtype(at::kFloat)) * 1.5 + 0.5;
    tensors["bn.num_batches_tracked"] = at::zeros({}, at::TensorOptions().dtype(at::kLong));
    write_tensors(vae / "diffusion_pytorch_model.safetensors", tensors);
  }
}

}  // namespace xfuser::models::flux2
