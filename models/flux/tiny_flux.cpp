#include "models/flux/tiny_flux.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/common/tiny_pipeline.h"
#include "models/common/trained_pipeline.h"
#include "models/tokenizers/spm_library.h"
#include "models/weights/safetensors.h"

namespace xfuser::models::flux {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A small built-in corpus: enough words for BPE merges and a SentencePiece vocabulary.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = {
      "a photo of a cat sitting on a wooden table in the morning light",
      "a majestic mountain landscape at sunset with snow on the peaks",
      "an astronaut riding a horse on the moon, digital art",
      "a bowl of fresh fruit: apples, oranges, bananas and grapes",
      "portrait of an old man with a grey beard, oil painting",
      "a city street at night with neon signs and rain reflections",
      "a red sports car parked in front of a modern glass building",
      "the quick brown fox jumps over the lazy dog",
      "a cozy cabin in the forest surrounded by tall pine trees",
      "watercolor painting of a lighthouse on a rocky coast",
      "a cup of coffee with latte art on a marble counter",
      "children playing in a park on a sunny summer afternoon",
      "a dragon flying over a medieval castle, fantasy illustration",
      "macro photograph of a dew drop on a green leaf",
      "a futuristic robot walking through a field of flowers",
      "an owl perched on a branch under a full moon",
      "a plate of spaghetti with tomato sauce and basil",
      "a sailing boat on a calm blue lake with mountains behind",
      "black and white photo of a jazz musician playing the saxophone",
      "a golden retriever puppy running on the beach",
      "a vintage typewriter on a desk next to a stack of books",
      "hot air balloons floating over a valley at dawn",
      "a snowy village with warm lights in the windows at christmas",
      "an underwater scene with colorful coral and tropical fish",
      "a bicycle leaning against a brick wall covered in ivy",
      "a field of sunflowers under a bright blue sky",
      "a steaming bowl of ramen with egg and green onions",
      "an ancient temple hidden in the jungle, cinematic lighting",
      "a cat and a dog sleeping together on a sofa",
      "a waterfall in a lush green canyon, long exposure",
      "a chef preparing sushi in a small restaurant kitchen",
      "the northern lights over a frozen lake in winter",
      "a small house with a red door and a white fence",
      "a train crossing a stone bridge in the countryside",
      "an abstract painting with bold colors and geometric shapes",
      "a panda eating bamboo in a misty forest",
      "a wizard reading a glowing book in a dark library",
      "a desert with sand dunes and a single cactus at noon",
      "a glass of orange juice next to pancakes with berries",
      "a lighthouse, a harbor, and fishing boats in the fog",
      "12 apples, 3 pears and 7 plums on a table",
      "hello world! this is a test: 1, 2, 3... done?",
  };
  return lines;
}

// GPT-2 / CLIP bytes_to_unicode, in the order of its dict (printable bytes first).
std::vector<std::pair<int, std::string>> bytes_to_unicode() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::vector<std::pair<int, std::string>> out;
  for (size_t i = 0; i < bs.size(); ++i) out.emplace_back(bs[i], utf8(cs[i]));
  return out;
}

json special_token(const std::string& content) {
  return {{"content", content},
          {"lstrip", false},
          {"normalized", true},
          {"rstrip", false},
          {"single_word", false}};
}

}  // namespace

std::pair<std::vector<std::string>, std::vector<std::pair<std::string, std::string>>>
train_byte_bpe(const std::vector<std::string>& lines, int num_merges) {
  const auto byte_map = bytes_to_unicode();
  std::map<int, std::string> byte_to_sym(byte_map.begin(), byte_map.end());
  // Words: lower-cased runs of letters, single digits, runs of other non-space characters
  // (CLIP's split, restricted to ASCII for the built-in corpus).
  std::map<std::vector<std::string>, int64_t> words;
  for (const auto& line : lines) {
    size_t i = 0;
    while (i < line.size()) {
      unsigned char ch = static_cast<unsigned char>(line[i]);
      if (std::isspace(ch)) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      if (std::isalpha(ch)) {
        while (j < line.size() && std::isalpha(static_cast<unsigned char>(line[j]))) ++j;
      } else if (!std::isdigit(ch)) {
        while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j])) &&
               !std::isalnum(static_cast<unsigned char>(line[j])))
          ++j;
      }
      std::vector<std::string> symbols;
      for (size_t k = i; k < j; ++k) {
        symbols.push_back(byte_to_sym[std::tolower(static_cast<unsigned char>(line[k])) & 0xFF]);
      }
      symbols.back() += "</w>";
      ++words[symbols];
      i = j;
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> counts;
    for (const auto& [symbols, freq] : words) {
      for (size_t k = 0; k + 1 < symbols.size(); ++k) counts[{symbols[k], symbols[k + 1]}] += freq;
    }
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;  // map order breaks ties lexicographically
    }
    const auto pair = best->first;
    merges.push_back(pair);
    std::map<std::vector<std::string>, int64_t> merged;
    for (const auto& [symbols, freq] : words) {
      std::vector<std::string> out;
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && symbols[k] == pair.first && symbols[k + 1] == pair.second) {
          out.push_back(pair.first + pair.second);
          ++k;
        } else {
          out.push_back(symbols[k]);
        }
      }
      merged[out] += freq;
    }
    words = std::move(merged);
  }
  std::vector<std::string> vocab;
  for (const auto& [b, sym] : byte_map) vocab.push_back(sym);
  for (const auto& [b, sym] : byte_map) vocab.push_back(sym + "</w>");
  for (const auto& [a, b] : merges) vocab.push_back(a + b);
  vocab.push_back("<|startoftext|>");
  vocab.push_back("<|endoftext|>");
  return {vocab, merges};
}

void make_tiny_flux(const fs::path& out, uint64_t seed) {
  XF_CONTEXT("writing the tiny FLUX pipeline to ", out.string());
  register_builtin_components();
  std::error_code ec;
  if (fs::exists(out, ec)) {
    XF_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), out.string(),
             " already exists and is not an empty folder");
  }
  fs::create_directories(out, ec);
  XF_CHECK(!ec, "cannot create ", out.string(), ": ", ec.message());

  write_json_file(out / "model_index.json",
                  {{"_class_name", "FluxPipeline"},
                   {"_diffusers_version", "0.33.1"},
                   {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                   {"text_encoder", {"transformers", "CLIPTextModel"}},
                   {"text_encoder_2", {"transformers", "T5EncoderModel"}},
                   {"tokenizer", {"transformers", "CLIPTokenizer"}},
                   {"tokenizer_2", {"transformers", "T5TokenizerFast"}},
                   {"transformer", {"diffusers", "FluxTransformer2DModel"}},
                   {"vae", {"diffusers", "AutoencoderKL"}}});

  fs::create_directories(out / "scheduler");
  write_json_file(out / "scheduler" / "scheduler_config.json",
                  {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                   {"_diffusers_version", "0.33.1"},
                   {"base_image_seq_len", 256},
                   {"base_shift", 0.5},
                   {"max_image_seq_len", 4096},
                   {"max_shift", 1.15},
                   {"num_train_timesteps", 1000},
                   {"shift", 3.0},
                   {"use_dynamic_shifting", true}});

  // tokenizer/: byte-level BPE learned from the corpus.
  auto [vocab, merges] = train_byte_bpe(corpus(), 300);
  fs::create_directories(out / "tokenizer");
  {
    json v = json::object();
    for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
    write_text_file(out / "tokenizer" / "vocab.json", v.dump() + "\n");
    std::string m = "#version: 0.2\n";
    for (const auto& [a, b] : merges) m += a + " " + b + "\n";
    write_text_file(out / "tokenizer" / "merges.txt", m);
    write_json_file(out / "tokenizer" / "special_tokens_map.json",
                    {{"bos_token", special_token("<|startoftext|>")},
                     {"eos_token", special_token("<|endoftext|>")},
                     {"pad_token", "<|endoftext|>"},
                     {"unk_token", special_token("<|endoftext|>")}});
    write_json_file(out / "tokenizer" / "tokenizer_config.json",
                    {{"tokenizer_class", "CLIPTokenizer"},
                     {"model_max_length", 77},
                     {"bos_token", "<|startoftext|>"},
                     {"eos_token", "<|endoftext|>"},
                     {"pad_token", "<|endoftext|>"},
                     {"unk_token", "<|endoftext|>"}});
  }
  const int64_t clip_vocab = static_cast<int64_t>(vocab.size());

  // tokenizer_2/: SentencePiece unigram model trained on the corpus.
  fs::create_directories(out / "tokenizer_2");
  {
    const fs::path corpus_file = out / "tokenizer_2" / ".corpus.txt";
    std::string text;
    for (const auto& line : corpus()) text += line + "\n";
    write_text_file(corpus_file, text);
    // T5's id layout: <pad> 0, </s> 1, <unk> 2, no BOS.
    tokenizers::train_sentencepiece(corpus_file, out / "tokenizer_2" / "spiece", 200, "unigram",
                                    {{"pad_id", "0"},
                                     {"eos_id", "1"},
                                     {"unk_id", "2"},
                                     {"bos_id", "-1"},
                                     {"pad_piece", "<pad>"},
                                     {"eos_piece", "</s>"},
                                     {"unk_piece", "<unk>"}});
    fs::remove(corpus_file);
    fs::remove(out / "tokenizer_2" / "spiece.vocab");
    write_json_file(out / "tokenizer_2" / "special_tokens_map.json",
                    {{"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}});
    write_json_file(out / "tokenizer_2" / "tokenizer_config.json",
                    {{"tokenizer_class", "T5Tokenizer"},
                     {"model_max_length", 512},
                     {"eos_token", "</s>"},
                     {"pad_token", "<pad>"},
                     {"unk_token", "<unk>"},
                     {"extra_ids", 0}});
  }
  auto spm = tokenizers::SentencePieceModel::load(out / "tokenizer_2" / "spiece.model");
  const int64_t t5_vocab = spm->piece_size();

  write_random_component(out / "text_encoder",
                         {{"architectures", {"CLIPTextModel"}},
                          {"model_type", "clip_text_model"},
                          {"vocab_size", clip_vocab},
                          {"hidden_size", 32},
                          {"intermediate_size", 64},
                          {"projection_dim", 32},
                          {"num_hidden_layers", 2},
                          {"num_attention_heads", 4},
                          {"max_position_embeddings", 77},
                          {"hidden_act", "quick_gelu"},
                          {"layer_norm_eps", 1e-5},
                          {"bos_token_id", clip_vocab - 2},
                          {"eos_token_id", clip_vocab - 1},
                          {"pad_token_id", clip_vocab - 1},
                          {"torch_dtype", "float32"}},
                         "model.safetensors", seed + 1);
  write_random_component(out / "text_encoder_2",
                         {{"architectures", {"T5EncoderModel"}},
                          {"model_type", "t5"},
                          {"vocab_size", t5_vocab},
                          {"d_model", 32},
                          {"d_kv", 8},
                          {"d_ff", 64},
                          {"num_layers", 2},
                          {"num_heads", 4},
                          {"relative_attention_num_buckets", 32},
                          {"relative_attention_max_distance", 128},
                          {"feed_forward_proj", "gated-gelu"},
                          {"layer_norm_epsilon", 1e-6},
                          {"eos_token_id", 1},
                          {"pad_token_id", 0},
                          {"torch_dtype", "float32"}},
                         "model.safetensors", seed + 2);
  write_random_component(out / "transformer",
                         {{"_class_name", "FluxTransformer2DModel"},
                          {"_diffusers_version", "0.33.1"},
                          {"patch_size", 1},
                          {"in_channels", 64},
                          {"out_channels", nullptr},
                          {"num_layers", 2},
                          {"num_single_layers", 2},
                          {"attention_head_dim", 16},
                          {"num_attention_heads", 2},
                          {"joint_attention_dim", 32},
                          {"pooled_projection_dim", 32},
                          {"guidance_embeds", true},
                          {"axes_dims_rope", {4, 6, 6}}},
                         "diffusion_pytorch_model.safetensors", seed + 3);
  write_random_component(
      out / "vae",
      {{"_class_name", "AutoencoderKL"},
       {"_diffusers_version", "0.33.1"},
       {"in_channels", 3},
       {"out_channels", 3},
       {"down_block_types",
        {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
       {"up_block_types",
        {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
       {"block_out_channels", {8, 16, 16, 16}},
       {"layers_per_block", 1},
       {"act_fn", "silu"},
       {"latent_channels", 16},
       {"norm_num_groups", 8},
       {"sample_size", 256},
       {"scaling_factor", 0.3611},
       {"shift_factor", 0.1159},
       {"use_quant_conv", false},
       {"use_post_quant_conv", false},
       {"mid_block_add_attention", true},
       {"force_upcast", true}},
      "diffusion_pytorch_model.safetensors", seed + 4);
}

fs::path ensure_tiny_flux(uint64_t seed) {
  // Versioned by layout so a future change of the tiny model never reuses an old folder.
  return ensure_cached_pipeline("tiny-flux-v1-seed" + std::to_string(seed),
                                [seed](const fs::path& dir) { make_tiny_flux(dir, seed); });
}

fs::path tiny_shapes_dir() {
  return trained_pipeline_dir("tiny-shapes", "models/flux/tiny_shapes", "tiny_shapes");
}

}  // namespace xfuser::models::flux
