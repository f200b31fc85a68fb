#include "models/vae/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/vae/autoencoder_kl.h"

namespace xfuser::models {

void register_vae() {
  ComponentRegistry::add("AutoencoderKL",
                         [](const nlohmann::json& config, const std::string& config_path) {
                           return std::make_shared<vae::AutoencoderKL>(
                               vae::AutoencoderKLConfig::from_json(config, config_path));
                         });
}

}  // namespace xfuser::models
