// The LoRA layouts the FLUX.1 family reads besides diffusers' own (models/common/lora.h).
#pragma once

#include <vector>

#include "models/common/lora.h"

namespace xfuser::models::flux {

// kohya's sd-scripts / ComfyUI names of BFL's FLUX.1 modules:
// "lora_unet_double_blocks_0_img_attn_qkv" with lora_down / lora_up / alpha, and
// "lora_te1_text_model_..." for the CLIP text encoder.
std::vector<LoraLayout> flux_lora_layouts();

}  // namespace xfuser::models::flux
