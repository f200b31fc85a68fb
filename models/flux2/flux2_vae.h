// AutoencoderKLFlux2 (diffusers 0.36.0 autoencoder_kl_flux2.py): FLUX.2's image VAE.
//
// The same Encoder / Decoder / quant_conv / post_quant_conv as AutoencoderKL (this class derives
// from vae::AutoencoderKL and reuses its encode, decode, slicing, tiling and patch-parallel
// decode), plus a BatchNorm2d `bn` (affine=False, track_running_stats) over
// prod(patch_size) * latent_channels channels that only holds latent statistics: diffusers'
// encode()/decode() never apply it, the Flux2Pipeline does. Weights: the AutoencoderKL names plus
// bn.running_mean and bn.running_var ([prod(patch_size) * latent_channels]); bn.num_batches_tracked
// is accepted and ignored. Defaults are diffusers' (latent 32, block_out_channels
// (128, 256, 512, 512), layers_per_block 2, sample_size 1024, batch_norm_eps 1e-4).
//
// call() is AutoencoderKL's: "encode" {sample} -> {latent_dist_mean, latent_dist_std, sample
// (= the mode)}, "decode" {z} -> {sample}, "forward" {sample} -> {sample}.
//
// What Flux2Pipeline (diffusers 0.36.0 pipeline_flux2.py) does around the VAE, for the pipeline:
//   image -> latents (prepare_image_latents):
//     l = vae.encode(image).latent_dist.mode()                  # [B, 32, H/8, W/8]
//     l = patchify(l)   # view(B, C, h/2, 2, w/2, 2).permute(0, 1, 3, 5, 2, 4) -> [B, 4C, h/2, w/2]
//     l = (l - running_mean.view(1,-1,1,1)) / sqrt(running_var.view(1,-1,1,1) + batch_norm_eps)
//   latents -> image (after the denoising loop, latents unpacked to [B, 4C, h/2, w/2]):
//     l = l * sqrt(running_var + batch_norm_eps) + running_mean
//     l = unpatchify(l) # reshape(B, C, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3) -> [B, C, 2h, 2w]
//     image = vae.decode(l)
//   patchify() / unpatchify() / normalize_latents() / denormalize_latents() below do exactly this.
//   No scaling_factor / shift_factor. vae_scale_factor = 2^(len(block_out_channels) - 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/vae/autoencoder_kl.h"

namespace xfuser::models::flux2 {

struct AutoencoderKLFlux2Config {
  vae::AutoencoderKLConfig kl;  // the encoder / decoder part (Flux2 defaults applied)
  double batch_norm_eps = 1e-4;
  double batch_norm_momentum = 0.1;  // training only; kept for completeness
  std::vector<int64_t> patch_size = {2, 2};

  // Channels of the bn statistics: prod(patch_size) * latent_channels.
  int64_t bn_channels() const;

  // Reads config.json (absent keys take diffusers' AutoencoderKLFlux2 defaults); `path` names the
  // file in errors.
  static AutoencoderKLFlux2Config from_json(const nlohmann::json& j, const std::string& path = "");
};

class AutoencoderKLFlux2 : public vae::AutoencoderKL {
 public:
  explicit AutoencoderKLFlux2(AutoencoderKLFlux2Config config);

  std::string class_name() const override { return "AutoencoderKLFlux2"; }
  // Strict load of the AutoencoderKL weights and bn.running_mean / running_var
  // (bn.num_batches_tracked is ignored).
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  const AutoencoderKLFlux2Config& flux2_config() const { return flux2_config_; }
  // bn buffers [bn_channels()] in the weights' dtype; throw before load().
  at::Tensor bn_running_mean() const;
  at::Tensor bn_running_var() const;
  double bn_eps() const { return flux2_config_.batch_norm_eps; }
  // sqrt(running_var + eps) [bn_channels()], computed in the buffers' dtype like diffusers.
  at::Tensor bn_std() const;

  // [B, C, h, w] -> [B, C*ph*pw, h/ph, w/pw] (the pipeline's _patchify_latents); h, w must divide.
  at::Tensor patchify(const at::Tensor& latents) const;
  // Inverse: [B, C*ph*pw, h, w] -> [B, C, h*ph, w*pw] (_unpatchify_latents).
  at::Tensor unpatchify(const at::Tensor& latents) const;
  // (x - mean) / bn_std() on patchified latents [B, bn_channels(), h, w], in x's dtype.
  at::Tensor normalize_latents(const at::Tensor& x) const;
  // x * bn_std() + mean: the inverse, applied before unpatchify() + decode.
  at::Tensor denormalize_latents(const at::Tensor& x) const;

 private:
  void check_patchified(const char* what, const at::Tensor& x) const;

  AutoencoderKLFlux2Config flux2_config_;
  ParamSlot* bn_mean_;
  ParamSlot* bn_var_;
};

// Adds "AutoencoderKLFlux2" to the ComponentRegistry (call from flux2's register_components).
void register_flux2_vae_components();

}  // namespace xfuser::models::flux2
