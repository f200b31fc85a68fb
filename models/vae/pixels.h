// A VAE's decoded pictures ([-1, 1], channels first) as 8-bit pixels (channels last), checked to
// be finite first: converting NaN to a byte gives 0, a black picture with no word of why.
#pragma once

#include <ATen/ATen.h>

namespace xfuser::models::vae {

// decoded: [B, 3, H, W] (pictures) or [B, 3, F, H, W] (videos), any floating dtype. Returns
// round(255 * clamp(x / 2 + 0.5, 0, 1)) as uint8, [B, H, W, 3] or [B, F, H, W, 3]. A non-finite
// value is an error naming how many of the B pictures hold one and the likely cause (the latents
// reaching the decoder are checked finite, so the decoder made it).
at::Tensor decoded_to_pixels(const at::Tensor& decoded);

}  // namespace xfuser::models::vae
