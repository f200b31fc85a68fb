// Patch-parallel VAE decode (and encode, below): the decoder split into horizontal bands over the
// ranks of one communicator (the pipeline uses ProcessGroups::replica(): every rank that holds the
// same images). Equal to the serial decode up to float rounding:
//   - rank r decodes latent rows [start_r, start_r + rows_r) (rows split as evenly as possible,
//     the first h % P ranks one row more: odd row counts work);
//   - every 3x3 convolution gets its halo rows from the neighbouring bands (isend/irecv, tag
//     kVaeHalo); zero padding only at the image's top and bottom edges;
//   - group-norm statistics are exact: a two-pass mean / variance with float64 sums all-reduced;
//   - the mid-block attention attends over the gathered keys/values of the whole image;
//   - the pixel bands are all-gathered at the end, so every rank returns the whole image.
// With fewer latent rows than ranks every rank decodes the whole latent (the same result).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/vae/autoencoder_kl.h"
#include "models/vae/vae_blocks.h"

namespace xfuser::parallel {
class Communicator;
}

namespace xfuser::models::vae {

// Latent rows of each of `parts` bands of `rows` rows (sizes differ by at most one).
std::vector<int64_t> band_rows(int64_t rows, int parts);

// SpatialContext over a communicator: this rank's band is band `comm.rank()` of `rows`.
class CommSpatialContext : public SpatialContext {
 public:
  CommSpatialContext(parallel::Communicator& comm, std::vector<int64_t> rows);
  at::Tensor pad_rows(const at::Tensor& x, int64_t halo) const override;
  std::pair<at::Tensor, at::Tensor> group_moments(const at::Tensor& x) const override;
  at::Tensor gather_tokens(const at::Tensor& tokens) const override;
  // Concatenation along `dim` of every rank's `x` (sizes along `dim` may differ), rank order.
  at::Tensor gather_uneven(const at::Tensor& x, int64_t dim) const;

 private:
  parallel::Communicator& comm_;
  std::vector<int64_t> rows_;
};

// z [B, latent, h, w] (the same on every rank of `comm`) -> the image [B, out, h*f, w*f] on every
// rank, decoded in bands (no tiling; slicing as configured on `vae`).
at::Tensor patch_parallel_decode(const AutoencoderKL& vae, const at::Tensor& z,
                                 parallel::Communicator& comm);

// x [B, in, H, W] (the same on every rank of `comm`) -> the posterior over the whole latent on
// every rank, encoded in bands of pixel rows (rank r: the pixel rows of latent rows
// band_rows(H / f, P)[r]; the downsamplers read the first row of the band below; group norms and
// the mid-block attention as in the decode), the moments all-gathered. No tiling; slicing as
// configured on `vae`. H not a multiple of the VAE's scale f, or fewer latent rows than ranks:
// every rank encodes the whole picture (the same result).
DiagonalGaussian patch_parallel_encode(const AutoencoderKL& vae, const at::Tensor& x,
                                       parallel::Communicator& comm);

}  // namespace xfuser::models::vae
