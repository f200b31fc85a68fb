#include "models/wan/wan_vae_parallel.h"

#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/vae/patch_parallel.h"
#include "models/wan/wan_vae.h"
#include "parallel/communicator.h"

namespace xfuser::models::wan {

at::Tensor patch_parallel_decode(const AutoencoderKLWan& vae, const at::Tensor& z,
                                 parallel::Communicator& comm) {
  XF_CONTEXT("patch-parallel Wan VAE decode on group '", comm.name(), "'");
  XF_CHECK(z.defined() && z.dim() == 5,
           "patch-parallel Wan VAE decode expects z [B, z_dim, f, h, w], got ",
           z.defined() ? xfuser::shape_string(z.sizes()) : std::string("an undefined tensor"));
  const int64_t h = z.size(3);
  if (comm.size() == 1 || h < comm.size()) return vae.decode(z);  // whole latent on every rank
  const std::vector<int64_t> rows = vae::band_rows(h, comm.size());
  int64_t start = 0;
  for (int r = 0; r < comm.rank(); ++r) start += rows[r];
  vae::CommSpatialContext ctx(comm, rows);
  // decode() slices the batch itself when slicing is on; the band of every element is gathered
  // in one all-gather.
  at::Tensor band = vae.decode(z.narrow(3, start, rows[comm.rank()]), &ctx);  // [B, 3, F, 8r, W]
  return ctx.gather_uneven(band.contiguous(), 3);                             // [B, 3, F, H, W]
}

}  // namespace xfuser::models::wan
