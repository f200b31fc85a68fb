#include "models/hunyuan_video15/register.h"

#include "models/dit/dit.h"
#include "models/hunyuan_video15/hunyuan_video15_transformer.h"

namespace xfuser::models::hunyuan_video15 {

void register_hunyuan_video15_components() {
  dit::register_dit_component("HunyuanVideo15Transformer3DModel", make_hunyuan_video15_transformer);
}

}  // namespace xfuser::models::hunyuan_video15
