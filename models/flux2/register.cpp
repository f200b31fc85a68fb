#include "models/flux2/register.h"

#include "models/dit/dit.h"
#include "models/flux2/flux2_transformer.h"

namespace xfuser::models::flux2 {

void register_flux2_components() {
  dit::register_dit_component("Flux2Transformer2DModel", make_flux2_dit);
}

}  // namespace xfuser::models::flux2
