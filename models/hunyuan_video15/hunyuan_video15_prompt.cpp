#include "models/hunyuan_video15/hunyuan_video15_prompt.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "backends/error.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/text_encoders/t5_encoder.h"

namespace xfuser::models::hunyuan_video15 {

const char* const kSystemMessage =
    "You are a helpful assistant. Describe the video by detailing the following aspects:         "
    "1. The main content and theme of the video.         2. The color, shape, size, texture, "
    "quantity, text, and spatial relationships of the objects.         3. Actions, events, "
    "behaviors temporal relationships, physical movement changes of the objects.         4. "
    "background environment, light, style and atmosphere.         5. camera angles, movements, "
    "and transitions used in the video.";

std::string chat_text(const std::string& prompt, const std::string& system_message) {
  // format_text_input: an empty prompt becomes " ".
  return "<|im_start|>system\n" + system_message + "<|im_end|>\n<|im_start|>user\n" +
         (prompt.empty() ? std::string(" ") : prompt) + "<|im_end|>\n<|im_start|>assistant\n";
}

tokenizers::Encoding mllm_prompt_tokens(const tokenizers::Tokenizer& tokenizer,
                                        const std::string& prompt, int64_t max_length,
                                        int64_t crop_start, const std::string& system_message) {
  XF_CHECK(max_length >= 1, "HunyuanVideo-1.5 prompt: tokenizer_max_length must be >= 1, got ",
           max_length);
  XF_CHECK(crop_start >= 0, "HunyuanVideo-1.5 prompt: crop_start must be >= 0, got ", crop_start);
  // apply_chat_template(tokenize=True) calls the tokenizer with add_special_tokens=False.
  return tokenizer.encode(chat_text(prompt, system_message), max_length + crop_start,
                          /*add_special_tokens=*/false);
}

std::pair<at::Tensor, at::Tensor> stack_encodings(const std::vector<tokenizers::Encoding>& rows,
                                                  const c10::Device& device) {
  XF_CHECK(!rows.empty(), "HunyuanVideo-1.5 prompt: no prompt to encode");
  std::vector<at::Tensor> ids, mask;
  const auto opts = at::TensorOptions().dtype(at::kLong);  // host staging, moved to `device`
  for (const auto& row : rows) {
    XF_CHECK(row.input_ids.size() == rows[0].input_ids.size(),
             "HunyuanVideo-1.5 prompt: token rows of different lengths (", row.input_ids.size(),
             " vs ", rows[0].input_ids.size(), ")");
    ids.push_back(at::tensor(row.input_ids, opts));
    mask.push_back(at::tensor(row.attention_mask, opts));
  }
  return {at::stack(ids).to(device), at::stack(mask).to(device)};
}

PromptEmbeds mllm_prompt_embeds(const text_encoders::LlamaEncoder& encoder,
                                const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                int64_t crop_start, int64_t num_hidden_layers_to_skip) {
  const int64_t num_layers = encoder.config().num_hidden_layers;
  XF_CHECK(num_hidden_layers_to_skip >= 0 && num_hidden_layers_to_skip <= num_layers,
           "HunyuanVideo-1.5 takes the text encoder's hidden_states[-",
           num_hidden_layers_to_skip + 1, "], but ", encoder.class_name(), " has ", num_layers,
           " layers (hidden_states -1..-", num_layers + 1, ")");
  XF_CHECK(input_ids.defined() && input_ids.dim() == 2,
           "HunyuanVideo-1.5 prompt: input_ids must "
           "be [B, L]");
  XF_CHECK(attention_mask.defined() && attention_mask.sizes() == input_ids.sizes(),
           "HunyuanVideo-1.5 prompt: attention_mask must match input_ids ", input_ids.sizes());
  XF_CHECK(crop_start >= 0 && crop_start < input_ids.size(1),
           "HunyuanVideo-1.5 prompt: crop_start ", crop_start, " leaves no token of the ",
           input_ids.size(1), " given");
  c10::InferenceMode guard;
  const auto states =
      encoder.forward_hidden_states(input_ids, attention_mask, {-(num_hidden_layers_to_skip + 1)});
  const int64_t keep = input_ids.size(1) - crop_start;
  return {states[0].narrow(1, crop_start, keep),
          attention_mask.narrow(1, crop_start, keep).to(at::kLong)};
}

PromptEmbeds encode_mllm_prompts(const tokenizers::Tokenizer& tokenizer,
                                 const text_encoders::LlamaEncoder& encoder,
                                 const std::vector<std::string>& prompts, const c10::Device& device,
                                 int64_t max_length, int64_t crop_start,
                                 const std::string& system_message,
                                 int64_t num_hidden_layers_to_skip) {
  std::vector<tokenizers::Encoding> rows;
  for (size_t i = 0; i < prompts.size(); ++i) {
    XF_CONTEXT("tokenizing prompt ", i, " for the Qwen2.5-VL text encoder");
    rows.push_back(
        mllm_prompt_tokens(tokenizer, prompts[i], max_length, crop_start, system_message));
  }
  const auto [ids, mask] = stack_encodings(rows, device);
  return mllm_prompt_embeds(encoder, ids, mask, crop_start, num_hidden_layers_to_skip);
}

std::optional<std::string> extract_glyph_texts(const std::string& prompt) {
  static const std::string kOpen = "\xE2\x80\x9C", kClose = "\xE2\x80\x9D";  // “ ”
  std::vector<std::string> found;
  const size_t n = prompt.size();
  // The first closing delimiter after `from`, unless a newline comes first ('.' stops at \n).
  const auto closing = [&](size_t from, const std::string& close) -> size_t {
    const size_t at = prompt.find(close, from);
    if (at == std::string::npos) return std::string::npos;
    const size_t newline = prompt.find('\n', from);
    return newline != std::string::npos && newline < at ? std::string::npos : at;
  };
  size_t i = 0;
  while (i < n) {
    // Byte positions are safe: '"' and the lead byte of “ never occur inside a UTF-8 sequence.
    if (prompt[i] == '"') {
      const size_t end = closing(i + 1, "\"");
      if (end != std::string::npos) {
        found.push_back(prompt.substr(i + 1, end - i - 1));
        i = end + 1;
        continue;
      }
    } else if (prompt.compare(i, kOpen.size(), kOpen) == 0) {
      const size_t end = closing(i + kOpen.size(), kClose);
      if (end != std::string::npos) {
        found.push_back(prompt.substr(i + kOpen.size(), end - i - kOpen.size()));
        i = end + kClose.size();
        continue;
      }
    }
    ++i;
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {  // list(dict.fromkeys(result))
    std::vector<std::string> unique;
    for (auto& text : found) {
      if (std::find(unique.begin(), unique.end(), text) == unique.end()) unique.push_back(text);
    }
    found = std::move(unique);
  }
  std::string out;
  for (size_t k = 0; k < found.size(); ++k) {
    if (k > 0) out += ". ";
    out += "Text \"" + found[k] + "\"";
  }
  return out + ". ";
}

PromptEmbeds byt5_prompt_embeds(const tokenizers::Tokenizer& tokenizer,
                                const text_encoders::T5Encoder& encoder,
                                const std::vector<std::string>& prompts,
                                const at::TensorOptions& options, int64_t max_length) {
  XF_CHECK(!prompts.empty(), "HunyuanVideo-1.5 prompt: no prompt to encode");
  XF_CHECK(max_length >= 1, "HunyuanVideo-1.5 prompt: tokenizer_2 max_length must be >= 1, got ",
           max_length);
  c10::InferenceMode guard;
  const int64_t d_model = encoder.config().d_model;
  const auto mask_opts = options.dtype(at::kLong);
  std::vector<at::Tensor> embeds, masks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    XF_CONTEXT("encoding the glyph texts of prompt ", i);
    const auto glyph = extract_glyph_texts(prompts[i]);
    if (!glyph) {
      embeds.push_back(at::zeros({1, max_length, d_model}, options));
      masks.push_back(at::zeros({1, max_length}, mask_opts));
      continue;
    }
    const auto enc = tokenizer.encode(*glyph, max_length);
    auto ids = at::tensor(enc.input_ids, at::TensorOptions().dtype(at::kLong))
                   .to(options.device())
                   .unsqueeze(0);
    auto mask = at::tensor(enc.attention_mask, at::TensorOptions().dtype(at::kLong))
                    .to(options.device())
                    .unsqueeze(0);
    embeds.push_back(encoder.forward(ids, mask.to(at::kFloat)).to(options.dtype()));
    masks.push_back(mask);
  }
  return {at::cat(embeds, 0), at::cat(masks, 0)};
}

}  // namespace xfuser::models::hunyuan_video15
