// The Wan family (Wan 2.1 / 2.2): WanTransformer3DModel for the component and DiT registries. No
// pipeline yet, so no models.
#include "models/registry.h"
#include "models/wan/register.h"

namespace xfuser::models::wan {

void register_family() {
  Family family;
  family.name = "wan";
  family.register_components = register_wan_components;
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::wan
