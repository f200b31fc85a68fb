// The HunyuanVideo family: HunyuanVideoTransformer3DModel for the component and DiT registries.
// No model yet (the pipeline, its VAE and the Llama + CLIP text encoders come later).
#include "models/dit/dit.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/hunyuan_video/register.h"
#include "models/registry.h"

namespace xfuser::models::hunyuan_video {

void register_family() {
  Family family;
  family.name = "hunyuan_video";
  family.register_components = [] {
    dit::register_dit_component("HunyuanVideoTransformer3DModel", make_hunyuan_video_transformer);
    register_hunyuan_video_components();
  };
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::hunyuan_video
