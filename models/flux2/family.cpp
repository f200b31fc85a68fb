// The FLUX.2 family: FLUX.2-dev and the embedded tiny-flux2 (Flux2Pipeline),
// Flux2Transformer2DModel and AutoencoderKLFlux2, and the tiny layout of `xfuser make-tiny`.
#include "models/flux2/flux2_pipeline.h"
#include "models/flux2/flux2_vae.h"
#include "models/flux2/register.h"
#include "models/flux2/tiny_flux2.h"
#include "models/registry.h"

namespace xfuser::models::flux2 {

void register_family() {
  Family family;
  family.name = "flux2";
  family.models = model_specs();
  family.register_components = [] {
    register_flux2_components();
    register_flux2_vae_components();
  };
  family.tiny_archs = {
      {"flux2",
       "FLUX.2 text-to-image / editing: a 30-layer Mistral3ForConditionalGeneration text encoder "
       "with a Tekken-style PixtralProcessor, Flux2Transformer2DModel (1 double + 1 single "
       "block), AutoencoderKLFlux2 (2x2 patches, batch norm), FlowMatchEuler (dynamic shift)",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_flux2(dir, seed); }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::flux2
