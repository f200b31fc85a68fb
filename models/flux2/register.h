// Registers the FLUX.2 family's component classes.
#pragma once

namespace xfuser::models::flux2 {

// Flux2Transformer2DModel with the DiTRegistry and the ComponentRegistry (its config.json's
// `_class_name`). Called once from the family's register_components (family.cpp).
void register_flux2_components();

}  // namespace xfuser::models::flux2
