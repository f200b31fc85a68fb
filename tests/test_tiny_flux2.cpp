// The tiny Flux2Pipeline folder (models/flux2/tiny_flux2.h): the layout diffusers' Flux2Pipeline
// expects, every component through our loaders, the Tekken-style tokenizer on FLUX.2 prompts (the
// control tokens 0..10, left padding), determinism in the seed, and a finite transformer forward
// on the text encoder's prompt embeddings.
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux2/flux2_prompt.h"
#include "models/flux2/tiny_flux2.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/tokenizers/bpe_trainer.h"
#include "models/tokenizers/tokenizer.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {
namespace fs = std::filesystem;
using xfuser::models::load_component;
using xfuser::testing::read_json;
using xfuser::testing::TempDir;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// One folder per test binary: writing it takes a few seconds.
const fs::path& folder() {
  static TempDir tmp("xfuser-tiny-flux2");
  static const fs::path dir = [] {
    const fs::path d = tmp / "tiny-flux2";
    xfuser::models::flux2::write_tiny_flux2(d, 0);
    return d;
  }();
  return dir;
}

class TinyFlux2 : public ::testing::Test {
 protected:
  c10::InferenceMode guard_;
};

TEST_F(TinyFlux2, Layout) {
  const fs::path dir = folder();
  auto index = read_json(dir / "model_index.json");
  EXPECT_EQ(index["_class_name"], "Flux2Pipeline");
  const std::map<std::string, std::string> expected = {
      {"scheduler", "FlowMatchEulerDiscreteScheduler"},
      {"text_encoder", "Mistral3ForConditionalGeneration"},
      {"tokenizer", "PixtralProcessor"},
      {"transformer", "Flux2Transformer2DModel"},
      {"vae", "AutoencoderKLFlux2"}};
  for (const auto& [name, cls] : expected) {
    ASSERT_TRUE(index.contains(name)) << name;
    EXPECT_EQ(index[name][1], cls) << name;
    EXPECT_TRUE(fs::is_directory(dir / name)) << name;
  }
  auto sched = read_json(dir / "scheduler" / "scheduler_config.json");
  EXPECT_TRUE(sched["use_dynamic_shifting"].get<bool>());
  EXPECT_DOUBLE_EQ(sched["max_shift"].get<double>(), 1.15);
  auto te = read_json(dir / "text_encoder" / "config.json");
  EXPECT_EQ(te["text_config"]["num_hidden_layers"], 30);
  auto tok = read_json(dir / "tokenizer" / "tokenizer.json");
  EXPECT_EQ(te["text_config"]["vocab_size"], tok["model"]["vocab"].size());
  EXPECT_TRUE(tok["post_processor"].is_null());

  // The VAE: AutoencoderKLFlux2's batch-norm statistics next to AutoencoderKL's tensors.
  xfuser::models::SafetensorsFile vae(
      (dir / "vae" / "diffusion_pytorch_model.safetensors").string());
  ASSERT_TRUE(vae.contains("bn.running_var"));
  EXPECT_EQ(vae.get("bn.running_mean").sizes(), at::IntArrayRef({16}));
  EXPECT_GT(vae.get("bn.running_var").min().item<float>(), 0.0f);
  EXPECT_EQ(vae.get("bn.num_batches_tracked").scalar_type(), at::kLong);
  EXPECT_EQ(vae.get("bn.num_batches_tracked").dim(), 0);
  EXPECT_EQ(vae.get("quant_conv.weight").sizes(), at::IntArrayRef({8, 8, 1, 1}));
  EXPECT_EQ(vae.get("post_quant_conv.weight").sizes(), at::IntArrayRef({4, 4, 1, 1}));
  EXPECT_EQ(vae.get("encoder.conv_out.weight").sizes(), at::IntArrayRef({8, 16, 3, 3}));
  xfuser::models::SafetensorsFile text((dir / "text_encoder" / "model.safetensors").string());
  for (const char* name :
       {"language_model.lm_head.weight", "language_model.model.embed_tokens.weight",
        "language_model.model.layers.29.mlp.down_proj.weight", "vision_tower.patch_conv.weight",
        "multi_modal_projector.patch_merger.merging_layer.weight"}) {
    EXPECT_TRUE(text.contains(name)) << name;
  }
}

TEST_F(TinyFlux2, TokenizerEncodesFlux2Prompts) {
  auto tokenizer = xfuser::models::tokenizers::load_tokenizer(folder() / "tokenizer");
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->pad_id(), 6);
  EXPECT_TRUE(tokenizer->padding_left());
  // Specials round-trip to their ids 0..10 as single tokens.
  const std::vector<std::string> specials = {
      "<unk>", "<s>",         "</s>",      "[INST]",          "[/INST]",         "[IMG]",
      "<pad>", "[IMG_BREAK]", "[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"};
  for (size_t i = 0; i < specials.size(); ++i) {
    EXPECT_EQ(tokenizer->text_ids(specials[i]), std::vector<int64_t>{static_cast<int64_t>(i)})
        << specials[i];
  }
  const auto enc =
      xfuser::models::flux2::prompt_tokens(*tokenizer, "a cat sits on a red chair", 512);
  ASSERT_EQ(enc.input_ids.size(), 512u);
  int64_t valid = 0;
  for (auto m : enc.attention_mask) valid += m;
  // The corpus holds the system message: merges make far fewer tokens than bytes.
  const std::string chat = xfuser::models::flux2::chat_text("a cat sits on a red chair");
  EXPECT_LT(valid, static_cast<int64_t>(chat.size()) / 2) << chat;
  EXPECT_EQ(enc.attention_mask.front(), 0);  // left padding
  EXPECT_EQ(enc.input_ids.front(), 6);       // <pad>
  // <s> [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT] [INST] ... [/INST]: the only control ids.
  std::vector<int64_t> controls;
  for (int64_t i = 512 - valid; i < 512; ++i) {
    if (enc.input_ids[i] <= 10) controls.push_back(enc.input_ids[i]);
  }
  EXPECT_EQ(controls, (std::vector<int64_t>{1, 9, 10, 3, 4}));
  EXPECT_EQ(enc.input_ids[512 - valid], 1);
  EXPECT_EQ(enc.input_ids.back(), 4);
}

TEST_F(TinyFlux2, DeterministicInTheSeed) {
  TempDir tmp("xfuser-tiny-flux2-seed");
  xfuser::models::flux2::write_tiny_flux2(tmp / "a", 0);
  xfuser::models::flux2::write_tiny_flux2(tmp / "b", 1);
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(folder())) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), folder());
    EXPECT_EQ(file_bytes(e.path()), file_bytes(tmp / "a" / rel)) << rel;
    ++files;
    if (rel.extension() == ".safetensors") {
      EXPECT_NE(file_bytes(e.path()), file_bytes(tmp / "b" / rel)) << rel;
    } else {
      EXPECT_EQ(file_bytes(e.path()), file_bytes(tmp / "b" / rel)) << rel;
    }
  }
  EXPECT_EQ(files, 15u);
  uintmax_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(folder())) {
    if (e.is_regular_file()) total += e.file_size();
  }
  EXPECT_LT(total, 1500000u);
}

TEST_F(TinyFlux2, TransformerRunsOnPromptEmbeds) {
  auto tokenizer = xfuser::models::tokenizers::load_tokenizer(folder() / "tokenizer");
  auto encoder_component = load_component((folder() / "text_encoder").string(), at::kFloat);
  auto encoder =
      std::dynamic_pointer_cast<xfuser::models::text_encoders::LlamaEncoder>(encoder_component);
  ASSERT_NE(encoder, nullptr);
  const int64_t L = 160;
  const auto enc = xfuser::models::flux2::prompt_tokens(*tokenizer, "a red car", L);
  const auto ids = at::tensor(enc.input_ids, at::kLong).view({1, L});
  const auto mask = at::tensor(enc.attention_mask, at::kLong).view({1, L});
  const at::Tensor embeds = xfuser::models::flux2::prompt_embeds(*encoder, ids, mask);
  ASSERT_EQ(embeds.sizes(), at::IntArrayRef({1, L, 48}));
  EXPECT_TRUE(at::isfinite(embeds).all().item<bool>());

  auto transformer = load_component((folder() / "transformer").string(), at::kFloat);
  EXPECT_EQ(transformer->class_name(), "Flux2Transformer2DModel");
  at::manual_seed(0);
  const int64_t h = 4, w = 6, n = h * w;
  auto img_ids = at::zeros({n, 4}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    img_ids[i][1] = i / w;
    img_ids[i][2] = i % w;
  }
  auto txt_ids = at::zeros({L, 4}, at::kLong);
  txt_ids.select(1, 3).copy_(at::arange(L, at::kLong));
  xfuser::models::TensorMap inputs = {{"hidden_states", at::randn({1, n, 16})},
                                      {"encoder_hidden_states", embeds},
                                      {"timestep", at::full({1}, 0.7)},
                                      {"img_ids", img_ids},
                                      {"txt_ids", txt_ids},
                                      {"guidance", at::full({1}, 4.0)}};
  const auto out = transformer->call("forward", inputs).at("sample");
  EXPECT_EQ(out.sizes(), at::IntArrayRef({1, n, 16}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  EXPECT_GT(out.abs().max().item<float>(), 0.0f);
}

TEST(BpeTrainer, OptionsAndErrors) {
  namespace tk = xfuser::models::tokenizers;
  tk::BpeTrainerOptions options;
  options.split_pattern = " ?[a-z]+|\\s+";
  options.special_tokens = {"<a>", "<b>"};
  options.num_merges = 3;
  options.specials_first = true;
  auto first = nlohmann::json::parse(tk::train_byte_level_bpe("aa aa aa bb", options));
  EXPECT_EQ(first["added_tokens"][1]["id"], 1);
  EXPECT_EQ(first["model"]["vocab"]["<b>"], 1);
  // "a a" (3 times), then "Ġ aa" (twice); every other pair occurs once: training stops early.
  EXPECT_EQ(first["model"]["merges"], (nlohmann::json{"a a", "Ġ aa"}));
  options.specials_first = false;
  auto last = nlohmann::json::parse(tk::train_byte_level_bpe("aa aa aa bb", options));
  EXPECT_EQ(last["added_tokens"][0]["id"], 256 + 2);
  EXPECT_FALSE(last["model"]["vocab"].contains("<a>"));
  // Gaps between matches are pieces too (the Split pre-tokenizer's Isolated behaviour).
  EXPECT_EQ(tk::split_isolated("ab,cd", "[a-z]+"), (std::vector<std::string>{"ab", ",", "cd"}));
  options.split_pattern = "([a-z";
  EXPECT_THROW(tk::train_byte_level_bpe("x", options), xfuser::Error);
  options.split_pattern = "";
  EXPECT_THROW(tk::train_byte_level_bpe("x", options), xfuser::Error);
}

}  // namespace
