#include "models/hunyuan_video/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/hunyuan_video/hunyuan_video_vae.h"

namespace xfuser::models::hunyuan_video {

void register_hunyuan_video_components() {
  ComponentRegistry::add("AutoencoderKLHunyuanVideo",
                         [](const nlohmann::json& config, const std::string& config_path) {
                           return std::make_shared<AutoencoderKLHunyuanVideo>(
                               HunyuanVideoVAEConfig::from_json(config, config_path));
                         });
}

}  // namespace xfuser::models::hunyuan_video
