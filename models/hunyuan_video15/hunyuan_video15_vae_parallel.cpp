#include "models/hunyuan_video15/hunyuan_video15_vae_parallel.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/vae/patch_parallel.h"
#include "parallel/communicator.h"

namespace xfuser::models::hunyuan_video15 {

at::Tensor patch_parallel_decode(const AutoencoderKLHunyuanVideo15& vae, const at::Tensor& z,
                                 parallel::Communicator& comm) {
  XF_CONTEXT("patch-parallel HunyuanVideo-1.5 VAE decode on group '", comm.name(), "'");
  XF_CHECK(z.defined() && z.dim() == 5,
           "patch-parallel HunyuanVideo-1.5 VAE decode expects z [B, latent_channels, f, h, w], "
           "got ",
           z.defined() ? xfuser::shape_string(z.sizes()) : std::string("an undefined tensor"));
  XF_CHECK(!vae.tiling().use_tiling,
           "patch-parallel HunyuanVideo-1.5 VAE decode (--use_parallel_vae) cannot be combined "
           "with spatial tiling (--enable_tiling)");
  const int64_t h = z.size(3);
  if (comm.size() == 1 || h < comm.size()) return vae.decode(z);  // whole latent on every rank
  const std::vector<int64_t> rows = vae::band_rows(h, comm.size());
  int64_t start = 0;
  for (int r = 0; r < comm.rank(); ++r) start += rows[r];
  vae::CommSpatialContext ctx(comm, rows);
  HunyuanVideoBand band;
  band.ctx = &ctx;
  band.top = comm.rank() == 0;
  band.bottom = comm.rank() + 1 == comm.size();
  at::Tensor part = vae.decode(z.narrow(3, start, rows[comm.rank()]), &band);  // [B, C, F, s*r, W]
  return ctx.gather_uneven(part.contiguous(), 3);                              // [B, C, F, H, W]
}

}  // namespace xfuser::models::hunyuan_video15
