// The Wan family (Wan 2.1 / 2.2): Wan2.1-T2V and the embedded tiny-wan (WanPipeline),
// WanTransformer3DModel and AutoencoderKLWan for the component and DiT registries, and the tiny
// WanPipeline layout of `xfuser make-tiny`.
#include "models/registry.h"
#include "models/wan/register.h"
#include "models/wan/tiny_wan.h"
#include "models/wan/wan_lora.h"
#include "models/wan/wan_pipeline.h"

namespace xfuser::models::wan {

void register_family() {
  Family family;
  family.name = "wan";
  family.models = model_specs();
  family.lora_components = {"transformer", "transformer_2"};
  family.lora_layouts = wan_lora_layouts();
  family.register_components = register_wan_components;
  family.tiny_archs = {
      {"wan-t2v",
       "Wan 2.1 text-to-video: UMT5 text encoder, WanTransformer3DModel (3D RoPE, cross-"
       "attention), causal 3D AutoencoderKLWan, UniPC flow scheduler",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_wan_t2v(dir, seed); }},
      {"wan-i2v",
       "Wan 2.1 image-to-video: wan-t2v plus a CLIPVisionModel image encoder and its processor, "
       "a transformer with image cross-attention and 36 input channels",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_wan_i2v(dir, seed); }},
      {"wan22-t2v",
       "Wan 2.2 A14B text-to-video: wan-t2v with two experts (transformer, transformer_2) and "
       "boundary_ratio 0.875",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_wan22_t2v(dir, seed); }},
      {"wan22-i2v",
       "Wan 2.2 A14B image-to-video: two experts, boundary_ratio 0.9, the first frame as a "
       "VAE-encoded condition without CLIP (36 input channels)",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_wan22_i2v(dir, seed); }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::wan
