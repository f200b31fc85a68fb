// Registers the HunyuanVideo family's shared components.
#pragma once

namespace xfuser::models::hunyuan_video {

// AutoencoderKLHunyuanVideo with the ComponentRegistry (its config.json's `_class_name`). Called
// once from the family's register_components (family.cpp).
void register_hunyuan_video_components();

}  // namespace xfuser::models::hunyuan_video
