#include "models/hunyuan_video/tiny_hunyuan_video.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/tiny_pipeline.h"
#include "models/flux/tiny_flux.h"
#include "models/hunyuan_video/hunyuan_video_pipeline.h"
#include "models/tokenizers/bpe_trainer.h"

namespace xfuser::models::hunyuan_video {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Llama 3's pre-tokenizer regex (tokenizer.json's Split pattern).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// The special tokens, in id order after the merges (Llama 3's names; <pad> as llava-llama-3's).
const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> tokens = {"<|begin_of_text|>",   "<|end_of_text|>",
                                                  "<|start_header_id|>", "<|end_header_id|>",
                                                  "<|eot_id|>",          "<pad>"};
  return tokens;
}

// ASCII pieces close to the Llama 3 split (kept as the merges were first learned, so the
// tokenizer.json stays the same; the ICU split of the regex gives one merge more) (a leading
// non-letter glued to letters, digits by up to three, punctuation runs with an optional leading
// space, whitespace): only for learning merges.
std::vector<std::string> training_pieces(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = text.size();
  auto letter = [&](size_t k) {
    return k < n && std::isalpha(static_cast<unsigned char>(text[k]));
  };
  auto digit = [&](size_t k) { return k < n && std::isdigit(static_cast<unsigned char>(text[k])); };
  auto space = [&](size_t k) { return k < n && std::isspace(static_cast<unsigned char>(text[k])); };
  while (i < n) {
    size_t j = i;
    if (letter(i) || (!digit(i) && text[i] != '\n' && letter(i + 1))) {
      j = i + 1;
      while (letter(j)) ++j;
    } else if (digit(i)) {
      while (digit(j) && j - i < 3) ++j;
    } else if (space(i)) {
      while (space(j) && !letter(j + 1) && !(space(j) && j + 1 < n && !space(j + 1))) ++j;
      if (j == i) j = i + 1;
    } else {
      while (j < n && !letter(j) && !digit(j) && !space(j)) ++j;
    }
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

// The built-in corpus: the prompt template (its special tokens left out) and prompt words.
std::string corpus() {
  std::string text = kDefaultPromptTemplate;
  for (const auto& special : special_tokens()) {
    for (size_t at = text.find(special); at != std::string::npos; at = text.find(special)) {
      text.replace(at, special.size(), " ");
    }
  }
  text +=
      "\na cat walks on the grass, a dog runs in the park. A woman with a red umbrella walks "
      "through the rain at night, neon lights reflect on the wet street. The camera slowly pans "
      "across a mountain lake at sunrise; birds fly over the water. Two people dance in a "
      "golden field, cinematic lighting, 4k, high quality video of a small boat on the ocean "
      "waves, close up shot of a flower opening, time lapse of clouds moving over a city.\n";
  return text;
}

}  // namespace

std::string tiny_llama3_tokenizer_json(const std::string& text, int num_merges) {
  const std::string bos = "<|begin_of_text|>";
  // <|begin_of_text|>'s id: after the 256 byte symbols and the merges' tokens (trained first).
  tokenizers::BpeTrainerOptions options;
  options.split_pattern = kLlama3Pattern;
  options.special_tokens = special_tokens();
  options.specials_first = false;
  options.num_merges = num_merges;
  options.pieces = training_pieces;
  const json untemplated = json::parse(tokenizers::train_byte_level_bpe(text, options));
  const json bos_id = untemplated.at("added_tokens").at(0).at("id");
  options.post_processor = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"},
         {"add_prefix_space", true},
         {"trim_offsets", false},
         {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair",
          {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
           {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
         {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}}}}};
  return tokenizers::train_byte_level_bpe(text, options);
}

void write_tiny_hunyuan_video(const fs::path& out, uint64_t seed) {
  XF_CONTEXT("writing the tiny HunyuanVideo pipeline to ", out.string());
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());

  // tokenizer_2 / text_encoder_2: the tiny FLUX pipeline's CLIP (a CLIPTextModel as diffusers'
  // HunyuanVideo folders hold).
  const fs::path flux = out / (".tiny-flux-" + std::to_string(::getpid()));
  flux::make_tiny_flux(flux, seed);
  fs::copy(flux / "tokenizer", out / "tokenizer_2", fs::copy_options::recursive);
  fs::copy(flux / "text_encoder", out / "text_encoder_2", fs::copy_options::recursive);
  fs::remove_all(flux, ec);
  json clip_config;
  {
    std::ifstream in(out / "text_encoder_2" / "config.json");
    XF_CHECK(in.good(), "cannot read ", (out / "text_encoder_2" / "config.json").string());
    clip_config = json::parse(in);
  }
  const int64_t pooled_dim = clip_config.at("hidden_size").get<int64_t>();

  write_json_file(out / "model_index.json",
                  {{"_class_name", "HunyuanVideoPipeline"},
                   {"_diffusers_version", "0.33.1"},
                   {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                   {"text_encoder", {"transformers", "LlamaModel"}},
                   {"text_encoder_2", {"transformers", "CLIPTextModel"}},
                   {"tokenizer", {"transformers", "PreTrainedTokenizerFast"}},
                   {"tokenizer_2", {"transformers", "CLIPTokenizer"}},
                   {"transformer", {"diffusers", "HunyuanVideoTransformer3DModel"}},
                   {"vae", {"diffusers", "AutoencoderKLHunyuanVideo"}}});
  fs::create_directories(out / "scheduler");
  write_json_file(out / "scheduler" / "scheduler_config.json",
                  {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                   {"_diffusers_version", "0.33.1"},
                   {"num_train_timesteps", 1000},
                   {"shift", 7.0},
                   {"use_dynamic_shifting", false}});

  // tokenizer/: Llama 3 style tokenizer.json.
  fs::create_directories(out / "tokenizer");
  const std::string tokenizer_json = tiny_llama3_tokenizer_json(corpus(), 400);
  write_text_file(out / "tokenizer" / "tokenizer.json", tokenizer_json);
  const int64_t vocab_size = [&] {
    const json t = json::parse(tokenizer_json);
    return t.at("added_tokens").back().at("id").get<int64_t>() + 1;
  }();
  write_json_file(out / "tokenizer" / "special_tokens_map.json",
                  {{"bos_token", "<|begin_of_text|>"},
                   {"eos_token", "<|end_of_text|>"},
                   {"pad_token", "<pad>"}});
  write_json_file(out / "tokenizer" / "tokenizer_config.json",
                  {{"tokenizer_class", "PreTrainedTokenizerFast"},
                   {"bos_token", "<|begin_of_text|>"},
                   {"eos_token", "<|end_of_text|>"},
                   {"pad_token", "<pad>"},
                   {"padding_side", "right"},
                   {"clean_up_tokenization_spaces", true},
                   {"model_input_names", {"input_ids", "attention_mask"}},
                   {"model_max_length", 1000000000000000019884624838656.0}});

  // text_encoder/: LlamaModel (3 layers: hidden_states[-3] is layer 1's output).
  const int64_t text_dim = 32;
  write_random_component(out / "text_encoder",
                         {{"architectures", {"LlamaModel"}},
                          {"model_type", "llama"},
                          {"vocab_size", vocab_size},
                          {"hidden_size", text_dim},
                          {"intermediate_size", 64},
                          {"num_hidden_layers", 3},
                          {"num_attention_heads", 4},
                          {"num_key_value_heads", 2},
                          {"hidden_act", "silu"},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 500000.0},
                          {"max_position_embeddings", 1024},
                          {"attention_bias", false},
                          {"mlp_bias", false},
                          {"bos_token_id", vocab_size - 6},
                          {"eos_token_id", vocab_size - 5},
                          {"torch_dtype", "float32"}},
                         "model.safetensors", seed + 11);

  write_random_component(out / "transformer",
                         {{"_class_name", "HunyuanVideoTransformer3DModel"},
                          {"_diffusers_version", "0.33.1"},
                          {"in_channels", 4},
                          {"out_channels", 4},
                          {"num_attention_heads", 2},
                          {"attention_head_dim", 8},
                          {"num_layers", 1},
                          {"num_single_layers", 1},
                          {"num_refiner_layers", 1},
                          {"mlp_ratio", 4.0},
                          {"patch_size", 1},
                          {"patch_size_t", 1},
                          {"qk_norm", "rms_norm"},
                          {"guidance_embeds", true},
                          {"text_embed_dim", text_dim},
                          {"pooled_projection_dim", pooled_dim},
                          {"rope_theta", 256.0},
                          {"rope_axes_dim", {2, 2, 4}},
                          {"image_condition_type", nullptr}},
                         "diffusion_pytorch_model.safetensors", seed + 12);
  const std::vector<std::string> down(4, "HunyuanVideoDownBlock3D");
  const std::vector<std::string> up(4, "HunyuanVideoUpBlock3D");
  write_random_component(out / "vae",
                         {{"_class_name", "AutoencoderKLHunyuanVideo"},
                          {"_diffusers_version", "0.33.1"},
                          {"in_channels", 3},
                          {"out_channels", 3},
                          {"latent_channels", 4},
                          {"down_block_types", down},
                          {"up_block_types", up},
                          {"block_out_channels", {8, 8, 16, 16}},
                          {"layers_per_block", 1},
                          {"act_fn", "silu"},
                          {"norm_num_groups", 4},
                          {"scaling_factor", 0.476986},
                          {"spatial_compression_ratio", 8},
                          {"temporal_compression_ratio", 4},
                          {"mid_block_add_attention", true}},
                         "diffusion_pytorch_model.safetensors", seed + 13);
}

}  // namespace xfuser::models::hunyuan_video
