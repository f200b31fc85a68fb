#include "models/flux2/flux2_prompt.h"

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/text_encoders/llama_encoder.h"

namespace xfuser::models::flux2 {

const char* const kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing "
    "on object relationships, object\nattribution and actions without speculation.";

std::string chat_text(const std::string& prompt, const std::string& system_message) {
  // format_input: prompt.replace("[IMG]", "") (Pixtral's processor counts [IMG] tokens).
  std::string cleaned = prompt;
  for (size_t at = cleaned.find("[IMG]"); at != std::string::npos; at = cleaned.find("[IMG]", at)) {
    cleaned.erase(at, 5);
  }
  return "[SYSTEM_PROMPT]" + system_message + "[/SYSTEM_PROMPT][INST]" + cleaned + "[/INST]";
}

tokenizers::Encoding prompt_tokens(const tokenizers::Tokenizer& tokenizer,
                                   const std::string& prompt, int64_t max_length,
                                   const std::string& system_message) {
  XF_CHECK(max_length >= 1, "FLUX.2 prompt: max_sequence_length must be >= 1, got ", max_length);
  XF_CHECK(tokenizer.bos_id().has_value(),
           "FLUX.2 prompt: the tokenizer has no bos_token, which Mistral's chat template writes "
           "first (tokenizer_config.json / special_tokens_map.json)");
  std::vector<int64_t> ids = {*tokenizer.bos_id()};
  const auto text = tokenizer.text_ids(chat_text(prompt, system_message));
  ids.insert(ids.end(), text.begin(), text.end());
  if (static_cast<int64_t>(ids.size()) > max_length) {
    const auto drop = static_cast<int64_t>(ids.size()) - max_length;
    if (tokenizer.truncation_left()) {
      ids.erase(ids.begin(), ids.begin() + drop);
    } else {
      ids.resize(static_cast<size_t>(max_length));
    }
  }
  tokenizers::Encoding out;
  out.input_ids = std::move(ids);
  out.attention_mask.assign(out.input_ids.size(), 1);
  const auto pad = static_cast<size_t>(max_length) - out.input_ids.size();
  if (pad > 0) {
    XF_CHECK(tokenizer.pad_id().has_value(),
             "FLUX.2 prompt: the tokenizer has no pad_token to pad the prompt to "
             "max_sequence_length ",
             max_length);
    if (tokenizer.padding_left()) {
      out.input_ids.insert(out.input_ids.begin(), pad, *tokenizer.pad_id());
      out.attention_mask.insert(out.attention_mask.begin(), pad, 0);
    } else {
      out.input_ids.insert(out.input_ids.end(), pad, *tokenizer.pad_id());
      out.attention_mask.insert(out.attention_mask.end(), pad, 0);
    }
  }
  return out;
}

at::Tensor prompt_embeds(const text_encoders::LlamaEncoder& encoder, const at::Tensor& input_ids,
                         const at::Tensor& attention_mask, const std::vector<int64_t>& layers) {
  const int64_t num_layers = encoder.config().num_hidden_layers;
  for (const int64_t l : layers) {
    XF_CHECK(l >= 0 && l <= num_layers, "FLUX.2 takes the text encoder's hidden_states[", l,
             "], but ", encoder.class_name(), " has ", num_layers, " layers (hidden_states 0..",
             num_layers, ")");
  }
  // torch.stack([hidden_states[k] for k in layers], dim=1) [B, n, L, d] -> permute(0, 2, 1, 3)
  // -> [B, L, n * d].
  const auto states = encoder.forward_hidden_states(input_ids, attention_mask, layers);
  const at::Tensor stacked = at::stack(states, 1);
  const int64_t b = stacked.size(0), n = stacked.size(1), l = stacked.size(2), d = stacked.size(3);
  return stacked.permute({0, 2, 1, 3}).reshape({b, l, n * d});
}

}  // namespace xfuser::models::flux2
