// The HunyuanVideo-1.5 family: HunyuanVideo15Transformer3DModel for the component and DiT
// registries. The pipeline (and with it the ModelSpecs and the tiny layout) comes later.
#include "models/hunyuan_video15/register.h"
#include "models/registry.h"

namespace xfuser::models::hunyuan_video15 {

void register_family() {
  Family family;
  family.name = "hunyuan_video15";
  family.register_components = [] { register_hunyuan_video15_components(); };
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::hunyuan_video15
