#include "models/text_encoders/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/text_encoders/clip_text.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/text_encoders/t5_encoder.h"

namespace xfuser::models {

void register_text_encoders() {
  using text_encoders::ClipTextConfig;
  using text_encoders::ClipTextModel;
  using text_encoders::T5Encoder;
  using text_encoders::T5EncoderConfig;
  ComponentRegistry::add(
      "CLIPTextModel", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<ClipTextModel>(ClipTextConfig::from_json(config, path), false);
      });
  ComponentRegistry::add(
      "CLIPTextModelWithProjection", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<ClipTextModel>(ClipTextConfig::from_json(config, path), true);
      });
  ComponentRegistry::add(
      "T5EncoderModel", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<T5Encoder>(T5EncoderConfig::from_json(config, path, false));
      });
  ComponentRegistry::add(
      "UMT5EncoderModel", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<T5Encoder>(T5EncoderConfig::from_json(config, path, true));
      });
  for (const char* name : {"LlamaModel", "LlamaForCausalLM", "MistralModel", "MistralForCausalLM",
                           "Mistral3ForConditionalGeneration", "Qwen2_5_VLTextModel",
                           "Qwen2_5_VLForConditionalGeneration"}) {
    const std::string architecture = name;
    ComponentRegistry::add(
        architecture, [architecture](const nlohmann::json& config, const std::string& path) {
          return std::make_shared<text_encoders::LlamaEncoder>(
              text_encoders::LlamaEncoderConfig::from_json(config, path, architecture));
        });
  }
}

}  // namespace xfuser::models
