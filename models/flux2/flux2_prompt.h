// FLUX.2's prompt encoding, as diffusers 0.36.0's Flux2Pipeline._get_mistral_3_small_prompt_embeds:
//   - each prompt (every "[IMG]" removed) becomes the conversation [system: SYSTEM_MESSAGE,
//     user: prompt], rendered by Mistral-Small-3.1's chat template (v7) as
//       <bos>[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{prompt}[/INST]
//     and tokenized by the processor's tokenizer without added special tokens (the template
//     writes the bos), truncated to max_sequence_length and padded to it (padding="max_length",
//     on the tokenizer's padding side: FLUX.2-dev's pads on the left);
//   - the Mistral 3 language model runs with that attention mask; hidden_states[10], [20] and
//     [30] (layer outputs, not normed) are stacked per token: prompt_embeds [B, L, 3 * d],
//     token t holding [h10[t], h20[t], h30[t]].
// Every token, pads included, goes to the transformer (no text mask in FLUX.2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::text_encoders {
class LlamaEncoder;
}

namespace xfuser::models::flux2 {

// diffusers' SYSTEM_MESSAGE (pipelines/flux2/system_messages.py, from BFL's flux2 repository).
extern const char* const kSystemMessage;
// The hidden states the pipeline stacks (text_encoder_out_layers).
inline const std::vector<int64_t> kTextEncoderOutLayers = {10, 20, 30};

// The rendered conversation after the bos token (the bos is a separate id).
std::string chat_text(const std::string& prompt,
                      const std::string& system_message = kSystemMessage);

// input_ids / attention_mask of one prompt, max_length long: [bos] + text ids of chat_text(),
// truncated on the tokenizer's truncation side, padded on its padding side with its pad id.
tokenizers::Encoding prompt_tokens(const tokenizers::Tokenizer& tokenizer,
                                   const std::string& prompt, int64_t max_length,
                                   const std::string& system_message = kSystemMessage);

// prompt_embeds [B, L, layers.size() * d] in the encoder's dtype from input_ids / attention_mask
// [B, L] (int64 on the encoder's device).
at::Tensor prompt_embeds(const text_encoders::LlamaEncoder& encoder, const at::Tensor& input_ids,
                         const at::Tensor& attention_mask,
                         const std::vector<int64_t>& layers = kTextEncoderOutLayers);

}  // namespace xfuser::models::flux2
