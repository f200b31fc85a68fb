// The FLUX.2 family: Flux2Transformer2DModel for the component and DiT registries. No model yet
// (the pipeline, its VAE and the Mistral text encoder come separately).
#include "models/flux2/register.h"
#include "models/flux2/tiny_flux2.h"
#include "models/registry.h"

namespace xfuser::models::flux2 {

void register_family() {
  Family family;
  family.name = "flux2";
  family.register_components = [] { register_flux2_components(); };
  family.tiny_archs = {
      {"flux2",
       "FLUX.2 text-to-image / editing: a 30-layer Mistral3ForConditionalGeneration text encoder "
       "with a Tekken-style PixtralProcessor, Flux2Transformer2DModel (1 double + 1 single "
       "block), AutoencoderKLFlux2 (2x2 patches, batch norm), FlowMatchEuler (dynamic shift)",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_flux2(dir, seed); }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::flux2
