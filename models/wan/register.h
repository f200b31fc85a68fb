// Registers the Wan family's components.
#pragma once

namespace xfuser::models::wan {

// WanTransformer3DModel as a DiT (models/dit/dit.h) and as a Component. Called once from
// register_builtin_components().
void register_wan_components();

}  // namespace xfuser::models::wan
