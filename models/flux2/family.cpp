// The FLUX.2 family: Flux2Transformer2DModel for the component and DiT registries. No model yet
// (the pipeline, its VAE and the Mistral text encoder come separately).
#include "models/flux2/register.h"
#include "models/registry.h"

namespace xfuser::models::flux2 {

void register_family() {
  Family family;
  family.name = "flux2";
  family.register_components = [] { register_flux2_components(); };
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::flux2
