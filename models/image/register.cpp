#include "models/image/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/image/clip_vision.h"
#include "models/image/siglip_vision.h"

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
  ComponentRegistry::add("SiglipVisionModel",
                         [](const nlohmann::json& config, const std::string& path) {
                           return std::make_shared<image::SiglipVisionModel>(
                               image::SiglipVisionConfig::from_json(config, path));
                         });
}

}  // namespace xfuser::models
