// HunyuanVideo-1.5's prompt encoding, as diffusers 0.36.0's HunyuanVideo15Pipeline computes it
// (pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py):
//   - _get_mllm_prompt_embeds: each prompt ("" becomes " ") is the conversation [system:
//     kSystemMessage, user: prompt] rendered by Qwen2.5-VL's chat template with the generation
//     prompt,
//       <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n
//       <|im_start|>assistant\n
//     tokenized without added special tokens, truncated and padded to tokenizer_max_length +
//     crop_start (the tokenizer's sides; Qwen2Tokenizer pads on the right); the
//     Qwen2_5_VLTextModel runs with that mask and hidden_states[-(num_hidden_layers_to_skip + 1)]
//     (a layer output, not normed) is taken; the first crop_start tokens (the system part of the
//     template: 108 with HunyuanVideo-1.5's tokenizer) are cut from the embeds and the mask.
//   - _get_byt5_prompt_embeds: the quoted texts of each prompt (extract_glyph_texts) formatted as
//     'Text "a". Text "b". ', tokenized by ByT5 (</s> added, truncated and padded to
//     tokenizer_max_length), encoded by the T5 encoder with that mask; a prompt with no quoted
//     text gets zero embeds and a zero mask.
// Masks are int64 (0 / 1) as the tokenizers give them; the pipeline casts them to the transformer
// dtype afterwards.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::text_encoders {
class LlamaEncoder;
class T5Encoder;
}  // namespace xfuser::models::text_encoders

namespace xfuser::models::hunyuan_video15 {

// The pipeline's system_message (its source's line continuations keep 8 spaces before each
// numbered item).
extern const char* const kSystemMessage;
inline constexpr int64_t kCropStart = 108;            // prompt_template_encode_start_idx
inline constexpr int64_t kTokenizerMaxLength = 1000;  // tokenizer_max_length
inline constexpr int64_t kNumHiddenLayersToSkip = 2;  // hidden_states[-3]
inline constexpr int64_t kByT5MaxLength = 256;        // tokenizer_2_max_length

struct PromptEmbeds {
  at::Tensor embeds;  // [B, L, d] in the encoder's dtype
  at::Tensor mask;    // [B, L] int64
};

// ---- Qwen2.5-VL (text_encoder) ----

// The rendered conversation (format_text_input + the chat template, add_generation_prompt).
std::string chat_text(const std::string& prompt,
                      const std::string& system_message = kSystemMessage);

// input_ids / attention_mask of one prompt, max_length + crop_start long (not yet cropped).
tokenizers::Encoding mllm_prompt_tokens(const tokenizers::Tokenizer& tokenizer,
                                        const std::string& prompt,
                                        int64_t max_length = kTokenizerMaxLength,
                                        int64_t crop_start = kCropStart,
                                        const std::string& system_message = kSystemMessage);

// Encodings stacked as int64 [B, L] tensors on `device`.
std::pair<at::Tensor, at::Tensor> stack_encodings(const std::vector<tokenizers::Encoding>& rows,
                                                  const c10::Device& device);

// The embeds and mask from input_ids / attention_mask [B, max_length + crop_start] (int64 on the
// encoder's device): hidden_states[-(num_hidden_layers_to_skip + 1)] and the mask, both cropped.
PromptEmbeds mllm_prompt_embeds(const text_encoders::LlamaEncoder& encoder,
                                const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                int64_t crop_start = kCropStart,
                                int64_t num_hidden_layers_to_skip = kNumHiddenLayersToSkip);

// Both steps for a batch of prompts; `device` is the encoder's.
PromptEmbeds encode_mllm_prompts(const tokenizers::Tokenizer& tokenizer,
                                 const text_encoders::LlamaEncoder& encoder,
                                 const std::vector<std::string>& prompts, const c10::Device& device,
                                 int64_t max_length = kTokenizerMaxLength,
                                 int64_t crop_start = kCropStart,
                                 const std::string& system_message = kSystemMessage,
                                 int64_t num_hidden_layers_to_skip = kNumHiddenLayersToSkip);

// ---- ByT5 (text_encoder_2) ----

// extract_glyph_texts: the texts between "..." or “...” (Python's re.findall of
// r"\"(.*?)\"|“(.*?)”": shortest, not across a newline, left to right without overlap),
// deduplicated in first-seen order when more than one, formatted as 'Text "a". Text "b". ';
// nullopt when the prompt quotes nothing.
std::optional<std::string> extract_glyph_texts(const std::string& prompt);

// Embeds [B, max_length, d_model] and mask [B, max_length] of the prompts' glyph texts.
// `options`: the encoder's device and dtype (for the zero embeds of prompts without quotes).
PromptEmbeds byt5_prompt_embeds(const tokenizers::Tokenizer& tokenizer,
                                const text_encoders::T5Encoder& encoder,
                                const std::vector<std::string>& prompts,
                                const at::TensorOptions& options,
                                int64_t max_length = kByT5MaxLength);

}  // namespace xfuser::models::hunyuan_video15
