// The tiny Wan 2.1 text-to-video pipeline `xfuser make-tiny --arch wan-t2v` writes (and the
// embedded tiny-wan model runs): a diffusers WanPipeline folder with seeded random weights in the
// real layout (UMT5 with a relative-position bias per block, WanTransformer3DModel with 3D RoPE
// and cross-attention, the causal AutoencoderKLWan with Wan 2.1's latents_mean / latents_std,
// UniPC with flow prediction as Wan2.1-T2V ships it), small enough for tests.
#pragma once

#include <cstdint>
#include <filesystem>

namespace xfuser::models::wan {

void write_tiny_wan_t2v(const std::filesystem::path& dir, uint64_t seed);
// The image-to-video layout (WanImageToVideoPipeline): adds a CLIPVisionModel image_encoder (257
// image tokens), its CLIPImageProcessor, and a transformer with image cross-attention and 36
// input channels (latents, mask, condition).
void write_tiny_wan_i2v(const std::filesystem::path& dir, uint64_t seed);
// Wan 2.2 A14B layouts: a transformer_2 (the low-noise expert, its own weights) and the
// boundary_ratio of the real folders (0.875 T2V, 0.9 I2V); I2V without CLIP (36 channels).
void write_tiny_wan22_t2v(const std::filesystem::path& dir, uint64_t seed);
void write_tiny_wan22_i2v(const std::filesystem::path& dir, uint64_t seed);

}  // namespace xfuser::models::wan
