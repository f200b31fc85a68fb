// The HunyuanVideo-1.5 family: HunyuanVideo-1.5 (text to video) and HunyuanVideo-1.5-I2V
// (HunyuanVideo15Pipeline / HunyuanVideo15ImageToVideoPipeline),
// the embedded tiny-hunyuan-video15, HunyuanVideo15Transformer3DModel and
// AutoencoderKLHunyuanVideo15, and the tiny layouts of `xfuser make-tiny`.
#include "models/hunyuan_video15/hunyuan_video15_pipeline.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/hunyuan_video15/register.h"
#include "models/hunyuan_video15/tiny_hunyuan_video15.h"
#include "models/registry.h"

namespace xfuser::models::hunyuan_video15 {

void register_family() {
  Family family;
  family.name = "hunyuan_video15";
  family.models = model_specs();
  family.register_components = [] {
    register_hunyuan_video15_components();
    register_hunyuan_video15_vae_components();
  };
  family.tiny_archs = {
      {"hunyuan-video15",
       "HunyuanVideo-1.5 text-to-video: a 3-layer Qwen2_5_VLTextModel with a Qwen2 byte-level BPE "
       "tokenizer, a ByT5-style T5EncoderModel, HunyuanVideo15Transformer3DModel (2 blocks), "
       "AutoencoderKLHunyuanVideo15 (16x), FlowMatchEuler (shift 5), ClassifierFreeGuidance",
       [](const std::filesystem::path& dir, uint64_t seed) {
         write_tiny_hunyuan_video15(dir, seed, /*image_to_video=*/false);
       }},
      {"hunyuan-video15-i2v",
       "HunyuanVideo-1.5 image-to-video: the hunyuan-video15 layout plus a SigLIP image encoder "
       "and its image processor, a meanflow transformer (i2v task, 48-pixel target size)",
       [](const std::filesystem::path& dir, uint64_t seed) {
         write_tiny_hunyuan_video15(dir, seed, /*image_to_video=*/true);
       }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::hunyuan_video15
