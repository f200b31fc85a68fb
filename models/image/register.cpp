#include "models/image/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/image/clip_vision.h"

namespace xfuser::models {

void register_image_encoders() {
  using image::ClipVisionConfig;
  using image::ClipVisionModel;
  ComponentRegistry::add(
      "CLIPVisionModel", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<ClipVisionModel>(ClipVisionConfig::from_json(config, path), false);
      });
  ComponentRegistry::add(
      "CLIPVisionModelWithProjection", [](const nlohmann::json& config, const std::string& path) {
        return std::make_shared<ClipVisionModel>(ClipVisionConfig::from_json(config, path), true);
      });
}

}  // namespace xfuser::models
