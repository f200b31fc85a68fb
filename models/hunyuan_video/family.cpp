// The HunyuanVideo family: HunyuanVideo and the embedded tiny-hunyuan-video
// (HunyuanVideoPipeline), HunyuanVideoTransformer3DModel and AutoencoderKLHunyuanVideo for the
// component and DiT registries, and the tiny layout of `xfuser make-tiny --arch hunyuan-video`.
#include "models/dit/dit.h"
#include "models/hunyuan_video/hunyuan_video_pipeline.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/hunyuan_video/register.h"
#include "models/hunyuan_video/tiny_hunyuan_video.h"
#include "models/registry.h"

namespace xfuser::models::hunyuan_video {

void register_family() {
  Family family;
  family.name = "hunyuan_video";
  family.models = model_specs();
  family.register_components = [] {
    dit::register_dit_component("HunyuanVideoTransformer3DModel", make_hunyuan_video_transformer);
    register_hunyuan_video_components();
  };
  family.tiny_archs = {
      {"hunyuan-video",
       "HunyuanVideo text-to-video: a LlamaModel text encoder with a Llama 3 style tokenizer.json, "
       "CLIP's pooled output, HunyuanVideoTransformer3DModel (token refiner, double and single "
       "blocks, embedded guidance), causal 3D AutoencoderKLHunyuanVideo, FlowMatchEuler (shift "
       "7)",
       [](const std::filesystem::path& dir, uint64_t seed) {
         write_tiny_hunyuan_video(dir, seed);
       }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::hunyuan_video
