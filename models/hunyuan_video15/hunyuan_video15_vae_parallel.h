// Patch-parallel decode of the HunyuanVideo-1.5 VAE (AutoencoderKLHunyuanVideo15) over the ranks of
// one communicator (the pipeline uses ProcessGroups::replica()), equal to vae.decode(z) up to
// float rounding:
//   - rank r decodes latent rows [start_r, start_r + rows_r) of every frame (vae::band_rows: the
//     first h % P ranks one row more), through the same decoder code on a HunyuanVideoBand;
//   - every causal 3x3x3 convolution pads its band with one halo row from each neighbour (tag
//     kVaeHalo) and replicates the edge row only at the picture's top and bottom; W and the causal
//     frames are local;
//   - the RMS norms are per voxel and the upsamplers' channel-to-space unpacking maps each latent
//     row to its own output rows, so neither needs anything from the other bands;
//   - the mid-block attention gathers every band's keys and values of each frame (queries stay
//     local) and keeps the causal frame mask;
//   - the pixel bands are all-gathered, so every rank returns the whole video.
// With one rank or fewer latent rows than ranks every rank decodes the whole latent. Spatial
// tiling (enable_tiling) with this decode is an error.
#pragma once

#include <ATen/core/Tensor.h>

namespace xfuser::parallel {
class Communicator;
}

namespace xfuser::models::hunyuan_video15 {

class AutoencoderKLHunyuanVideo15;

// z [B, latent_channels, f, h, w] (the same on every rank of `comm`) -> [B, out_channels,
// 1 + 4(f-1), s*h, s*w] on every rank.
at::Tensor patch_parallel_decode(const AutoencoderKLHunyuanVideo15& vae, const at::Tensor& z,
                                 parallel::Communicator& comm);

}  // namespace xfuser::models::hunyuan_video15
