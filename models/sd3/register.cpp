#include "models/sd3/register.h"

#include "models/dit/dit.h"
#include "models/sd3/sd3_transformer.h"

namespace xfuser::models::sd3 {

void register_sd3_components() {
  dit::register_dit_component("SD3Transformer2DModel", make_sd3_transformer);
}

}  // namespace xfuser::models::sd3
