// HunyuanVideo-1.5's text side against transformers 4.57.1 / diffusers 0.36.0
// fixtures (tests/fixtures/generate.py gen_hunyuan_video15_text):
//   - Qwen2_5_VLTextModel as a LlamaEncoder variant (Q/K/V biases, 1-D RoPE equal to the
//     multimodal one on text, SDPA's zero rule for left pads), also read from a
//     Qwen2_5_VLForConditionalGeneration folder under either weight prefix;
//   - a ByT5-style T5EncoderModel (gated-gelu, untied, byte vocabulary) with a float mask;
//   - Qwen2 tokenizer.json ids (slow Qwen2Tokenizer == fast == ours) and ByT5Tokenizer ids;
//   - the pipeline's prompt functions: chat text, tokens with crop, mllm embeds + mask (right
//     and left padding), extract_glyph_texts, ByT5 embeds + mask;
//   - config, folder and input errors.
#include <cstdio>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/hunyuan_video15/hunyuan_video15_prompt.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/text_encoders/t5_encoder.h"
#include "models/tokenizers/tokenizer.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace hv15 = xfuser::models::hunyuan_video15;
using xfuser::models::TensorMap;
using xfuser::models::TensorMapSource;
using xfuser::models::text_encoders::LlamaEncoder;
using xfuser::models::text_encoders::LlamaEncoderConfig;
using xfuser::models::text_encoders::T5Encoder;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

fs::path case_dir(const std::string& name) {
  return fixtures_dir() / "transformers-v4.57.1" / name;
}
fs::path text_dir() { return fixtures_dir() / "diffusers-v0.36.0" / "hunyuan_video15-text-s1"; }

template <typename T>
std::shared_ptr<T> load_as(const fs::path& dir) {
  xfuser::models::register_builtin_components();
  auto model =
      std::dynamic_pointer_cast<T>(xfuser::models::load_component(dir.string(), at::kFloat));
  EXPECT_TRUE(model) << dir << " did not load as the expected class";
  return model;
}

const nlohmann::json& tokens_json() {
  static const nlohmann::json j = read_json(text_dir() / "tokens.json");
  return j;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// ---- Qwen2.5-VL language model ----------------------------------------------------------------

TEST(HunyuanVideo15Qwen, TextModelFloat32MatchesTransformers) {
  const auto dir = case_dir("qwen2_5_vl_text-tiny-s1");
  XF_REQUIRE_FIXTURE(dir);
  auto model = load_as<LlamaEncoder>(dir);
  ASSERT_TRUE(model);
  const auto& c = model->config();
  EXPECT_EQ(model->class_name(), "Qwen2_5_VLTextModel");
  EXPECT_EQ(c.family, LlamaEncoderConfig::Family::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.fully_masked_rows, LlamaEncoderConfig::FullyMaskedRows::kZero);
  const auto in = read_tensors(dir / "inputs.safetensors");
  const auto ref = read_tensors(dir / "output.safetensors");
  const auto out = model->forward(in.at("input_ids"), in.at("attention_mask"));
  ASSERT_EQ(out.hidden_states.sizes(), ref.at("hidden_states").sizes());
  const double hs = max_rel_error(out.hidden_states, ref.at("hidden_states"));
  const double last = max_rel_error(out.last_hidden_state, ref.at("last_hidden_state"));
  std::printf("Qwen2_5_VLTextModel fp32 vs transformers: hidden_states %.2e, last %.2e\n", hs,
              last);
  EXPECT_LE(hs, 1e-4);
  EXPECT_LE(last, 1e-4);
  // Each hidden state on its own (the pipeline takes hidden_states[-3]).
  for (int64_t l = 0; l <= c.num_hidden_layers; ++l) {
    EXPECT_LE(max_rel_error(out.hidden_states[l], ref.at("hidden_states")[l]), 1e-4) << l;
  }
  // The fixture tells the rules apart: without the q/k/v biases, or attending to every key in
  // the left-padded row's pad rows, the result moves.
  {
    auto config = c;
    config.fully_masked_rows = LlamaEncoderConfig::FullyMaskedRows::kAttendAll;
    LlamaEncoder other(config);
    other.load(xfuser::models::SafetensorsFile((dir / "model.safetensors").string()), at::kFloat);
    const auto got = other.forward(in.at("input_ids"), in.at("attention_mask")).hidden_states;
    EXPECT_GT(max_rel_error(got, ref.at("hidden_states")), 1e-3);
  }
  {
    auto tensors = read_tensors(dir / "model.safetensors");
    TensorMap zero_bias;
    for (auto& [k, v] : tensors)
      zero_bias[k] = k.find("_proj.bias") != std::string::npos ? v * 0 : v;
    LlamaEncoder other(c);
    other.load(TensorMapSource(zero_bias, "zero-bias"), at::kFloat);
    const auto got = other.forward(in.at("input_ids"), in.at("attention_mask")).hidden_states;
    EXPECT_GT(max_rel_error(got, ref.at("hidden_states")), 1e-3);
  }
}

TEST(HunyuanVideo15Qwen, ConditionalGenerationFolderReadsItsLanguageModel) {
  const auto dir = case_dir("qwen2_5_vl-tiny_cond-s1");
  XF_REQUIRE_FIXTURE(dir);
  auto model = load_as<LlamaEncoder>(dir);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->class_name(), "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(model->config().num_hidden_layers, 2);
  EXPECT_EQ(model->config().vocab_size, 64);
  const auto in = read_tensors(dir / "inputs.safetensors");
  const auto ref = read_tensors(dir / "output.safetensors").at("hidden_states");
  const auto got = model->forward(in.at("input_ids"), in.at("attention_mask")).hidden_states;
  const double rel = max_rel_error(got, ref);
  std::printf("Qwen2_5_VLForConditionalGeneration language model fp32: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  // transformers 4.57.1 saves the original checkpoints' layout (the language model under
  // "model.", the vision tower under "visual."); the in-memory layout of transformers >= 4.52
  // ("model.language_model.", "model.visual.") loads too, and so does a config.json with the
  // text keys at the top level (the original checkpoints').
  nlohmann::json config = read_json(dir / "config.json");
  nlohmann::json flat = config["text_config"];
  flat["model_type"] = "qwen2_5_vl";
  flat["vision_config"] = config["vision_config"];
  const auto legacy =
      LlamaEncoderConfig::from_json(flat, "config.json", "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(legacy.num_hidden_layers, 2);
  TensorMap renamed;
  size_t visual = 0, lm_head = 0;
  for (auto& [k, v] : read_tensors(dir / "model.safetensors")) {
    const std::string lm = "model.", vis = "visual.";
    if (k.rfind(lm, 0) == 0) {
      renamed["model.language_model." + k.substr(lm.size())] = v;
    } else if (k.rfind(vis, 0) == 0) {
      renamed["model.visual." + k.substr(vis.size())] = v;
      ++visual;
    } else {
      lm_head += k == "lm_head.weight";
      renamed[k] = v;
    }
  }
  EXPECT_EQ(lm_head, 1u);
  EXPECT_GT(visual, 0u);
  LlamaEncoder old(legacy);
  old.load(TensorMapSource(renamed, "renamed"), at::kFloat);
  EXPECT_TRUE(
      at::equal(old.forward(in.at("input_ids"), in.at("attention_mask")).hidden_states, got));
  TensorMap bare = {
      {"embed_tokens.weight", renamed.at("model.language_model.embed_tokens.weight")}};
  expect_error_containing(
      [&] { LlamaEncoder(legacy).load(TensorMapSource(bare, "bare"), at::kFloat); },
      {"model.language_model.embed_tokens.weight", "model.embed_tokens.weight"});
}

TEST(HunyuanVideo15Qwen, ConfigAndFolderErrorsAreNamed) {
  const auto dir = case_dir("qwen2_5_vl_text-tiny-s1");
  XF_REQUIRE_FIXTURE(dir);
  const nlohmann::json base = read_json(dir / "config.json");
  const auto bad = [&](const std::function<void(nlohmann::json&)>& edit,
                       const std::vector<std::string>& needles) {
    nlohmann::json j = base;
    edit(j);
    expect_error_containing(
        [&] {
          LlamaEncoderConfig::from_json(j, "text_encoder/config.json", "Qwen2_5_VLTextModel");
        },
        needles);
  };
  bad(
      [](auto& j) {
        j["rope_scaling"]["mrope_section"] = {1, 1, 1};
      },
      {"text_encoder/config.json", "mrope_section", "head_dim / 2 = 4"});
  bad(
      [](auto& j) {
        j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
      },
      {"text_encoder/config.json", "yarn"});
  bad(
      [](auto& j) {
        j["use_sliding_window"] = true;
        j["max_window_layers"] = 1;
      },
      {"text_encoder/config.json", "use_sliding_window"});
  bad([](auto& j) { j["layer_types"][1] = "sliding_attention"; },
      {"text_encoder/config.json", "sliding_attention"});
  bad([](auto& j) { j["model_type"] = "llama"; }, {"text_encoder/config.json", "model_type"});
  bad([](auto& j) { j["num_key_value_heads"] = 3; }, {"num_key_value_heads 3"});
  bad([](auto& j) { j["hidden_size"] = 15; }, {"hidden_size 15"});
  // A folder whose weights are missing, or whose weights do not fit the config.
  xfuser::testing::TempDir tmp;
  fs::copy_file(dir / "config.json", tmp / "config.json");
  xfuser::models::register_builtin_components();
  expect_error_containing([&] { xfuser::models::load_component(tmp.path().string(), at::kFloat); },
                          {tmp.path().string()});
  nlohmann::json wide = base;
  wide["intermediate_size"] = 32;
  write_text(tmp / "config.json", wide.dump());
  fs::copy_file(dir / "model.safetensors", tmp / "model.safetensors");
  expect_error_containing([&] { xfuser::models::load_component(tmp.path().string(), at::kFloat); },
                          {"mlp.gate_proj.weight"});
}

// ---- ByT5's T5 encoder ------------------------------------------------------------------------

TEST(HunyuanVideo15ByT5, T5EncoderFloat32MatchesTransformers) {
  const auto dir = case_dir("byt5-tiny-s1");
  XF_REQUIRE_FIXTURE(dir);
  auto model = load_as<T5Encoder>(dir);
  ASSERT_TRUE(model);
  EXPECT_TRUE(model->config().is_gated_act);
  EXPECT_EQ(model->config().vocab_size, 384);
  const auto in = read_tensors(dir / "inputs.safetensors");
  ASSERT_EQ(in.at("attention_mask").scalar_type(), at::kFloat);  // as the pipeline passes it
  const auto ref = read_tensors(dir / "output.safetensors").at("last_hidden_state");
  const auto got = model->forward(in.at("input_ids"), in.at("attention_mask"));
  const double rel = max_rel_error(got, ref);
  std::printf("ByT5-style T5EncoderModel fp32 vs transformers: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  // The mask matters (the second row is padded).
  EXPECT_GT(max_rel_error(model->forward(in.at("input_ids"), at::Tensor()), ref), 1e-3);
  // A wrong activation in config.json is named with the file.
  xfuser::testing::TempDir tmp;
  nlohmann::json config = read_json(dir / "config.json");
  config["feed_forward_proj"] = "gated-nope";
  config.erase("dense_act_fn");
  write_text(tmp / "config.json", config.dump());
  fs::copy_file(dir / "model.safetensors", tmp / "model.safetensors");
  expect_error_containing([&] { xfuser::models::load_component(tmp.path().string(), at::kFloat); },
                          {"config.json", "nope"});
}

// ---- tokenizers -------------------------------------------------------------------------------

TEST(HunyuanVideo15Tokenizers, Qwen2IdsEqualHuggingFace) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokens.json");
  const auto& cases = tokens_json()["qwen2"]["cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const std::string cls : {"", "Qwen2Tokenizer", "Qwen2TokenizerFast"}) {
    const auto tok = xfuser::models::tokenizers::load_tokenizer(text_dir() / "tokenizer", cls);
    EXPECT_EQ(tok->kind(), "bpe");
    EXPECT_FALSE(tok->bos_id().has_value());
    size_t long_ones = 0, non_ascii = 0;
    for (const auto& c : cases) {
      const auto text = c["text"].get<std::string>();
      const auto want = c["input_ids"].get<std::vector<int64_t>>();
      EXPECT_EQ(tok->encode_ids(text), want) << cls << ": " << text;
      long_ones += want.size() > 200;
      non_ascii += std::any_of(text.begin(), text.end(), [](char ch) { return ch & 0x80; });
    }
    EXPECT_GE(long_ones, 4u);  // the system message, the long text and the chat texts
    EXPECT_GE(non_ascii, 5u);
  }
  // A Qwen2 folder without tokenizer.json is refused, naming the folder.
  xfuser::testing::TempDir tmp;
  fs::copy_file(text_dir() / "tokenizer" / "tokenizer_config.json", tmp / "tokenizer_config.json");
  expect_error_containing(
      [&] { xfuser::models::tokenizers::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
      {tmp.path().string(), "tokenizer.json"});
}

TEST(HunyuanVideo15Tokenizers, ByT5IdsEqualHuggingFace) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokenizer_2");
  namespace tk = xfuser::models::tokenizers;
  const auto& ref = tokens_json()["byt5"];
  const auto tok = tk::load_tokenizer(text_dir() / "tokenizer_2");
  EXPECT_EQ(tok->kind(), "byt5");
  EXPECT_EQ(tok->size(), ref["len_tokenizer"].get<int64_t>());
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->encode_ids("<extra_id_0>"), (std::vector<int64_t>{ref["extra_id_0"], 1}));
  EXPECT_EQ(tok->encode_ids("<extra_id_124>"), (std::vector<int64_t>{ref["extra_id_124"], 1}));
  // The class defaults (a folder naming only the class) and an older folder (extra_ids 125, no
  // token lists) give the same ids.
  xfuser::testing::TempDir bare, old;
  write_text(bare / "tokenizer_config.json", R"({"tokenizer_class": "ByT5Tokenizer"})");
  write_text(old / "tokenizer_config.json",
             R"({"tokenizer_class": "ByT5Tokenizer", "extra_ids": 125, "eos_token": "</s>"})");
  for (const auto& dir : {text_dir() / "tokenizer_2", bare.path(), old.path()}) {
    const auto t = tk::load_tokenizer(dir);
    EXPECT_EQ(t->size(), 384) << dir;
    for (const auto& c : ref["cases"]) {
      EXPECT_EQ(t->encode_ids(c["text"].get<std::string>()),
                c["input_ids"].get<std::vector<int64_t>>())
          << dir << ": " << c["text"].get<std::string>();
    }
    const auto& padded = ref["padded"];
    const auto texts = padded["texts"].get<std::vector<std::string>>();
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto e = t->encode(texts[i], padded["max_length"].get<int64_t>());
      EXPECT_EQ(e.input_ids, padded["input_ids"][i].get<std::vector<int64_t>>()) << texts[i];
      EXPECT_EQ(e.attention_mask, padded["attention_mask"][i].get<std::vector<int64_t>>());
    }
  }
  // Bad folders are named.
  xfuser::testing::TempDir wrong;
  write_text(wrong / "tokenizer_config.json",
             R"({"tokenizer_class": "ByT5Tokenizer", "extra_ids": 3,
                 "additional_special_tokens": ["<extra_id_0>"]})");
  expect_error_containing([&] { tk::load_tokenizer(wrong.path()); },
                          {"tokenizer_config.json", "extra_ids"});
  write_text(wrong / "tokenizer_config.json", R"({"tokenizer_class": "ByT5Tokenizer", )");
  expect_error_containing([&] { tk::load_tokenizer(wrong.path()); }, {"tokenizer_config.json"});
  expect_error_containing([&] { tk::load_tokenizer(wrong / "absent"); }, {"absent"});
}

// ---- the pipeline's prompt functions -----------------------------------------------------------

TEST(HunyuanVideo15Prompt, ChatTextAndTokensEqualThePipeline) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokens.json");
  const auto& j = tokens_json();
  EXPECT_EQ(j["system_message"].get<std::string>(), hv15::kSystemMessage);
  const auto& mllm = j["mllm"];
  const auto prompts = mllm["prompts"].get<std::vector<std::string>>();
  const int64_t max_length = mllm["tokenizer_max_length"].get<int64_t>();
  const int64_t crop = mllm["crop_start"].get<int64_t>();
  // The chat texts are the last entries of the Qwen2 cases, in prompt order.
  const auto& cases = j["qwen2"]["cases"];
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(hv15::chat_text(prompts[i]),
              cases[cases.size() - prompts.size() + i]["text"].get<std::string>());
  }
  EXPECT_EQ(hv15::chat_text("X").substr(0, hv15::chat_text("X").find('X')),
            j["chat_prefix"].get<std::string>());
  xfuser::testing::TempDir left;
  fs::copy(text_dir() / "tokenizer", left.path());
  nlohmann::json config = read_json(left / "tokenizer_config.json");
  config["padding_side"] = "left";
  write_text(left / "tokenizer_config.json", config.dump());
  for (const std::string side : {"right", "left"}) {
    const auto tok = xfuser::models::tokenizers::load_tokenizer(
        side == "right" ? text_dir() / "tokenizer" : left.path());
    EXPECT_EQ(tok->padding_left(), side == "left");
    const auto& ref = mllm["tokens"][side];
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto got = hv15::mllm_prompt_tokens(*tok, prompts[i], max_length, crop);
      EXPECT_EQ(got.input_ids, ref["input_ids"][i].get<std::vector<int64_t>>()) << side << i;
      EXPECT_EQ(got.attention_mask, ref["attention_mask"][i].get<std::vector<int64_t>>())
          << side << i;
    }
  }
  // The fixture covers padding and truncation: prompt 2 fills every position.
  const auto& right = mllm["tokens"]["right"]["attention_mask"];
  EXPECT_EQ(right[1].back().get<int>(), 0);
  EXPECT_EQ(right[2].back().get<int>(), 1);
  const auto tok = xfuser::models::tokenizers::load_tokenizer(text_dir() / "tokenizer");
  expect_error_containing([&] { hv15::mllm_prompt_tokens(*tok, "x", 0); },
                          {"tokenizer_max_length"});
}

TEST(HunyuanVideo15Prompt, MllmEmbedsEqualGetMllmPromptEmbeds) {
  XF_REQUIRE_FIXTURE(text_dir() / "prompt_embeds.safetensors");
  const auto& mllm = tokens_json()["mllm"];
  auto encoder = load_as<LlamaEncoder>(case_dir("qwen2_5_vl_text-tiny-s1"));
  ASSERT_TRUE(encoder);
  const auto ref = read_tensors(text_dir() / "prompt_embeds.safetensors");
  const int64_t crop = mllm["crop_start"].get<int64_t>();
  for (const std::string side : {"right", "left"}) {
    std::vector<xfuser::models::tokenizers::Encoding> rows;
    const auto& t = mllm["tokens"][side];
    for (size_t i = 0; i < t["input_ids"].size(); ++i) {
      rows.push_back({t["input_ids"][i].get<std::vector<int64_t>>(),
                      t["attention_mask"][i].get<std::vector<int64_t>>()});
    }
    const auto [ids, mask] = hv15::stack_encodings(rows, at::kCPU);
    const auto got = hv15::mllm_prompt_embeds(*encoder, ids, mask, crop);
    const auto& want = ref.at("mllm_embeds_" + side);
    ASSERT_EQ(got.embeds.sizes(), want.sizes());
    const double rel = max_rel_error(got.embeds, want);
    std::printf("_get_mllm_prompt_embeds (%s padding): %.2e\n", side.c_str(), rel);
    EXPECT_LE(rel, 1e-4);
    EXPECT_TRUE(at::equal(got.mask, ref.at("mllm_mask_" + side)));
    EXPECT_EQ(got.mask.scalar_type(), at::kLong);
  }
  // The whole path from the prompts (right padding, as Qwen2Tokenizer).
  const auto tok = xfuser::models::tokenizers::load_tokenizer(text_dir() / "tokenizer");
  const auto all =
      hv15::encode_mllm_prompts(*tok, *encoder, mllm["prompts"].get<std::vector<std::string>>(),
                                at::kCPU, mllm["tokenizer_max_length"].get<int64_t>(), crop);
  EXPECT_LE(max_rel_error(all.embeds, ref.at("mllm_embeds_right")), 1e-4);
  EXPECT_TRUE(at::equal(all.mask, ref.at("mllm_mask_right")));
  // Bad arguments are named.
  const auto ids = at::zeros({1, 8}, at::kLong), mask = at::ones({1, 8}, at::kLong);
  expect_error_containing([&] { hv15::mllm_prompt_embeds(*encoder, ids, mask, 8); },
                          {"crop_start 8"});
  expect_error_containing([&] { hv15::mllm_prompt_embeds(*encoder, ids, mask, 0, 4); },
                          {"hidden_states[-5]", "3 layers"});
}

TEST(HunyuanVideo15Prompt, GlyphTextsEqualExtractGlyphTexts) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokens.json");
  const auto& cases = tokens_json()["glyph_texts"];
  ASSERT_GE(cases.size(), 15u);
  size_t none = 0;
  for (const auto& c : cases) {
    const auto prompt = c["prompt"].get<std::string>();
    const auto got = hv15::extract_glyph_texts(prompt);
    if (c["glyph_text"].is_null()) {
      EXPECT_FALSE(got.has_value()) << prompt;
      ++none;
    } else {
      ASSERT_TRUE(got.has_value()) << prompt;
      EXPECT_EQ(*got, c["glyph_text"].get<std::string>()) << prompt;
    }
  }
  EXPECT_GE(none, 3u);
}

TEST(HunyuanVideo15Prompt, ByT5EmbedsEqualGetByT5PromptEmbeds) {
  XF_REQUIRE_FIXTURE(text_dir() / "prompt_embeds.safetensors");
  const auto& j = tokens_json()["byt5_prompt"];
  auto encoder = load_as<T5Encoder>(case_dir("byt5-tiny-s1"));
  ASSERT_TRUE(encoder);
  const auto tok = xfuser::models::tokenizers::load_tokenizer(text_dir() / "tokenizer_2");
  const auto ref = read_tensors(text_dir() / "prompt_embeds.safetensors");
  const auto got = hv15::byt5_prompt_embeds(
      *tok, *encoder, j["prompts"].get<std::vector<std::string>>(),
      at::TensorOptions().dtype(at::kFloat), j["tokenizer_max_length"].get<int64_t>());
  const auto& want = ref.at("byt5_embeds");
  ASSERT_EQ(got.embeds.sizes(), want.sizes());
  const double rel = max_rel_error(got.embeds, want);
  std::printf("_get_byt5_prompt_embeds: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  EXPECT_TRUE(at::equal(got.mask, ref.at("byt5_mask")));
  EXPECT_EQ(got.mask.scalar_type(), at::kLong);
  // Prompts 0 and 1 quote nothing: zero embeds and mask; prompts 2-4 quote something.
  EXPECT_EQ(got.mask[0].sum().item<int64_t>(), 0);
  EXPECT_EQ(got.embeds[1].abs().sum().item<double>(), 0.0);
  EXPECT_GT(got.mask[2].sum().item<int64_t>(), 0);
  EXPECT_GT(got.mask[4].sum().item<int64_t>(), 0);
  expect_error_containing(
      [&] { hv15::byt5_prompt_embeds(*tok, *encoder, {}, at::TensorOptions().dtype(at::kFloat)); },
      {"no prompt"});
}

}  // namespace
