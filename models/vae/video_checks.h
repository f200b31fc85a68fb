// Input checks shared by the causal video VAEs (HunyuanVideo, HunyuanVideo-1.5): errors name the
// class, the input and the expected shape.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace xfuser::models::vae {

// x [B, in_channels, 1 + temporal k, H, W], floating point.
void check_video_input(const std::string& cls, const std::string& what, const at::Tensor& x,
                       int64_t in_channels, int64_t temporal_compression_ratio);
// z [B, latent_channels, f, h, w], floating point.
void check_video_latent(const std::string& cls, const std::string& what, const at::Tensor& z,
                        int64_t latent_channels);

}  // namespace xfuser::models::vae
