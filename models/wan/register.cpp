#include "models/wan/register.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "models/dit/dit.h"
#include "models/wan/wan_transformer.h"
#include "models/wan/wan_vae.h"

namespace xfuser::models::wan {

void register_wan_components() {
  dit::register_dit_component("WanTransformer3DModel", make_wan_transformer);
  ComponentRegistry::add(
      "AutoencoderKLWan", [](const nlohmann::json& config, const std::string& config_path) {
        return std::make_shared<AutoencoderKLWan>(WanVAEConfig::from_json(config, config_path));
      });
}

}  // namespace xfuser::models::wan
