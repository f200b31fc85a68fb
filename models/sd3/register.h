// Registers the SD3 family's components.
#pragma once

namespace xfuser::models::sd3 {

// SD3Transformer2DModel as a DiT (models/dit/dit.h) and as a Component. Called once from
// register_builtin_components().
void register_sd3_components();

}  // namespace xfuser::models::sd3
