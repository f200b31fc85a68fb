// Patch-parallel decode of the Wan video VAE (AutoencoderKLWan), the 3D counterpart of
// models/vae/patch_parallel.h: the decoder runs on a horizontal band of latent rows per rank of
// one communicator (the pipeline uses ProcessGroups::replica()). Equal to the serial decode up to
// float rounding:
//   - rank r decodes latent rows [start_r, start_r + rows_r) of every frame (vae::band_rows: the
//     first h % P ranks one row more), frame by frame with its own feature cache (its band's rows
//     of the last 2 frames of every causal convolution's input);
//   - every spatial 3x3(x3) convolution pads its input [cached frames, chunk] with 1 halo row
//     from each neighbouring band (one batch_p2p, tag kVaeHalo) before the causal zero frames, so
//     the cached frames' halo rows are the neighbours' cached rows: exact; zero padding only at
//     the video's top and bottom edges;
//   - WanRMS_norm normalises over channels (per pixel): nothing exchanged;
//   - the mid-block attention (per frame) attends over the gathered keys/values of the whole
//     frame, queries local;
//   - the upsamplers double the band's rows (nearest), then convolve with halos;
//   - the pixel bands are all-gathered at the end, so every rank returns the whole video.
// With fewer latent rows than ranks every rank decodes the whole latent (the same result).
#pragma once

#include <ATen/core/Tensor.h>

namespace xfuser::parallel {
class Communicator;
}

namespace xfuser::models::wan {

class AutoencoderKLWan;

// z [B, z_dim, f, h, w] (the same on every rank of `comm`) -> the video [B, 3, F, 8h, 8w]
// (clamped to [-1, 1]) on every rank, decoded in bands of latent rows (slicing as configured on
// `vae`).
at::Tensor patch_parallel_decode(const AutoencoderKLWan& vae, const at::Tensor& z,
                                 parallel::Communicator& comm);

}  // namespace xfuser::models::wan
