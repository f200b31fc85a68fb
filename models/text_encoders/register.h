// Registers the transformers text encoders with the ComponentRegistry: CLIPTextModel,
// CLIPTextModelWithProjection, T5EncoderModel, UMT5EncoderModel.
#pragma once

namespace xfuser::models {

// Called from register_builtin_components().
void register_text_encoders();

}  // namespace xfuser::models
