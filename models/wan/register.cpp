#include "models/wan/register.h"

#include "models/dit/dit.h"
#include "models/wan/wan_transformer.h"

namespace xfuser::models::wan {

void register_wan_components() {
  dit::register_dit_component("WanTransformer3DModel", make_wan_transformer);
}

}  // namespace xfuser::models::wan
