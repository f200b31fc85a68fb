#include "models/vae/video_checks.h"

#include "backends/error.h"
#include "backends/tensor_util.h"

namespace xfuser::models::vae {

void check_video_input(const std::string& cls, const std::string& what, const at::Tensor& x,
                       int64_t in_channels, int64_t temporal) {
  XF_CHECK(x.defined(), cls, ": ", what, " is undefined");
  XF_CHECK(x.dim() == 5 && x.size(0) > 0 && x.size(1) == in_channels && x.size(2) > 0 &&
               x.size(3) > 0 && x.size(4) > 0,
           cls, ": ", what, " has shape ", shape_string(x.sizes()), ", expected [B, ", in_channels,
           " (in_channels), F, H, W]");
  XF_CHECK((x.size(2) - 1) % temporal == 0, cls, ": ", what, " has ", x.size(2), " frames (shape ",
           shape_string(x.sizes()), "); encode needs 1 + ", temporal,
           "k frames (the causal first frame, then groups of ", temporal, ")");
  XF_CHECK(x.is_floating_point(), cls, ": ", what, " must be a floating-point tensor, got ",
           x.scalar_type());
}

void check_video_latent(const std::string& cls, const std::string& what, const at::Tensor& z,
                        int64_t latent_channels) {
  XF_CHECK(z.defined(), cls, ": ", what, " is undefined");
  XF_CHECK(z.dim() == 5 && z.size(0) > 0 && z.size(1) == latent_channels && z.size(2) > 0 &&
               z.size(3) > 0 && z.size(4) > 0,
           cls, ": ", what, " has shape ", shape_string(z.sizes()), ", expected [B, ",
           latent_channels, " (latent_channels), f, h, w]");
  XF_CHECK(z.is_floating_point(), cls, ": ", what, " must be a floating-point tensor, got ",
           z.scalar_type());
}

}  // namespace xfuser::models::vae
