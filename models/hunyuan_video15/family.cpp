// The HunyuanVideo-1.5 family: HunyuanVideo-1.5 (text to video) and HunyuanVideo-1.5-I2V
// (HunyuanVideo15Pipeline / HunyuanVideo15ImageToVideoPipeline),
// HunyuanVideo15Transformer3DModel and AutoencoderKLHunyuanVideo15.
#include "models/hunyuan_video15/hunyuan_video15_pipeline.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/hunyuan_video15/register.h"
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
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::hunyuan_video15
