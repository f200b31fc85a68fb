#include "models/vae/pixels.h"

#include "backends/error.h"

namespace xfuser::models::vae {

at::Tensor decoded_to_pixels(const at::Tensor& decoded) {
  XF_CHECK(decoded.defined() && (decoded.dim() == 4 || decoded.dim() == 5) && decoded.size(1) == 3,
           "decoded pictures must be [B, 3, H, W] or [B, 3, F, H, W], got ", decoded.sizes());
  const at::Tensor x = decoded.to(at::kFloat);
  const int64_t b = x.size(0);
  const at::Tensor finite = at::isfinite(x.reshape({b, -1})).all(1);
  if (!finite.all().item<bool>()) {
    const int64_t bad = b - finite.sum().item<int64_t>();
    XF_THROW("the decoded pixels are not finite (NaN or Inf) in ", bad, " of ", b,
             decoded.dim() == 5 ? " video(s)" : " picture(s)", " although the latents were; ",
             "the output would be black. Likely cause: NaN or Inf in the VAE's weights, or an "
             "overflow in the VAE's dtype (",
             decoded.scalar_type(), ")");
  }
  const at::Tensor pixels = ((x / 2 + 0.5).clamp(0, 1) * 255).round().to(at::kByte);
  return decoded.dim() == 5 ? pixels.permute({0, 2, 3, 4, 1}).contiguous()
                            : pixels.permute({0, 2, 3, 1}).contiguous();
}

}  // namespace xfuser::models::vae
