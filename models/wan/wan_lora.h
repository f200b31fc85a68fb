// The LoRA layouts the Wan family reads besides diffusers' own (models/common/lora.h).
#pragma once

#include <vector>

#include "models/common/lora.h"

namespace xfuser::models::wan {

// The original Wan checkpoint's names ("diffusion_model.blocks.0.self_attn.q.lora_A.weight",
// lora_down / lora_up, alpha, the lora_B bias as `diff_b`: the Lightning and CausVid adapters),
// and musubi-tuner's kohya-style names ("lora_unet_blocks_0_self_attn_q.lora_down.weight").
std::vector<LoraLayout> wan_lora_layouts();

}  // namespace xfuser::models::wan
