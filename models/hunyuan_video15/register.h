// Registers the HunyuanVideo-1.5 family's component classes.
#pragma once

namespace xfuser::models::hunyuan_video15 {

// HunyuanVideo15Transformer3DModel with the DiTRegistry and the ComponentRegistry (its
// config.json's `_class_name`). Called once from the family's register_components (family.cpp).
void register_hunyuan_video15_components();

}  // namespace xfuser::models::hunyuan_video15
