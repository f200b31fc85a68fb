// Registers the CLIP image towers with the ComponentRegistry: CLIPVisionModel and
// CLIPVisionModelWithProjection (models/image/clip_vision.h).
#pragma once

namespace xfuser::models {

// Called from register_builtin_components().
void register_image_encoders();

}  // namespace xfuser::models
