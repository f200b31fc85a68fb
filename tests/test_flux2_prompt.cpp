// FLUX.2's prompt encoding against diffusers 0.36.0 / transformers 4.57.1 (the flux2-tiny
// pipeline folder): the chat text and its tokens as PixtralProcessor.apply_chat_template gives
// them (left padding, truncation, [IMG] removed), and prompt_embeds (hidden_states 10, 20, 30 of
// the 30-layer Mistral 3 stacked per token) as Flux2Pipeline.encode_prompt.
#include <cstdio>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/flux2/flux2_prompt.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/tokenizers/tokenizer.h"
#include "models/weights/component_folder.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace flux2 = xfuser::models::flux2;
using xfuser::testing::fixtures_dir;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

fs::path folder() { return fixtures_dir() / "pipelines" / "flux2-tiny"; }

TEST(Flux2Prompt, TokensEqualTheProcessorsChatTemplate) {
  XF_REQUIRE_FIXTURE(folder() / "prompt_tokens.json");
  const auto ref = read_json(folder() / "prompt_tokens.json");
  EXPECT_EQ(ref["system_message"].get<std::string>(), flux2::kSystemMessage);
  const auto tokenizer = xfuser::models::tokenizers::load_tokenizer(folder() / "tokenizer");
  EXPECT_TRUE(tokenizer->padding_left());
  const int64_t max_length = ref["max_sequence_length"].get<int64_t>();
  const auto prompts = ref["prompts"].get<std::vector<std::string>>();
  ASSERT_EQ(prompts.size(), 2u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto got = flux2::prompt_tokens(*tokenizer, prompts[i], max_length);
    EXPECT_EQ(got.input_ids, ref["input_ids"][i].get<std::vector<int64_t>>()) << prompts[i];
    EXPECT_EQ(got.attention_mask, ref["attention_mask"][i].get<std::vector<int64_t>>())
        << prompts[i];
  }
  // The fixture covers both ends: prompt 0 is left-padded, prompt 1 truncated.
  EXPECT_EQ(ref["attention_mask"][0][0].get<int>(), 0);
  EXPECT_EQ(ref["attention_mask"][1][max_length - 1].get<int>(), 1);
  EXPECT_EQ(flux2::chat_text("a [IMG]cat[IMG]", "sys"),
            "[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]a cat[/INST]");
  xfuser::testing::expect_error_containing([&] { flux2::prompt_tokens(*tokenizer, "x", 0); },
                                           {"max_sequence_length"});
}

TEST(Flux2Prompt, EmbedsEqualEncodePrompt) {
  XF_REQUIRE_FIXTURE(folder() / "prompt_embeds.safetensors");
  xfuser::models::register_builtin_components();
  auto encoder = std::dynamic_pointer_cast<xfuser::models::text_encoders::LlamaEncoder>(
      xfuser::models::load_component((folder() / "text_encoder").string(), at::kFloat));
  ASSERT_TRUE(encoder);
  const auto ref = read_json(folder() / "prompt_tokens.json");
  std::vector<at::Tensor> id_rows, mask_rows;
  for (size_t i = 0; i < 2; ++i) {
    id_rows.push_back(at::tensor(ref["input_ids"][i].get<std::vector<int64_t>>(), at::kLong));
    mask_rows.push_back(
        at::tensor(ref["attention_mask"][i].get<std::vector<int64_t>>(), at::kLong));
  }
  const at::Tensor got = flux2::prompt_embeds(*encoder, at::stack(id_rows), at::stack(mask_rows));
  const at::Tensor want = read_tensors(folder() / "prompt_embeds.safetensors").at("prompt_embeds");
  ASSERT_EQ(got.sizes(), want.sizes());
  const double rel = xfuser::testing::max_rel_error(got, want);
  std::printf("FLUX.2 prompt_embeds vs diffusers: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  xfuser::testing::expect_error_containing(
      [&] {
        flux2::prompt_embeds(*encoder, at::stack(id_rows), at::stack(mask_rows), {10, 31});
      },
      {"hidden_states[31]", "30 layers"});
}

}  // namespace
