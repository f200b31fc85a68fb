// AutoencoderKLHunyuanVideo15 (diffusers 0.36.0 autoencoder_kl_hunyuanvideo15.py):
// HunyuanVideo-1.5's causal 3D video VAE (16x spatial, 4x temporal, 32 latent channels) as a
// Component, under diffusers' parameter names (encoder.conv_in.conv.weight,
// encoder.down_blocks.N.resnets.M.norm1. gamma, ....downsamplers.0.conv.conv.weight,
// decoder.up_blocks.N.upsamplers.0.conv.conv.weight,
// *.mid_block.attentions.0.to_q.weight, encoder.norm_out.gamma, ...), so a diffusers vae/ folder
// loads unchanged. There is no quant_conv / post_quant_conv.
//
//   call("encode", {sample [B, in_channels, 1+4k, H, W]}) -> {"latent_dist_mean",
//        "latent_dist_std", "sample" (= the mode, the mean)}, each [B, latent_channels, 1+k,
//        H/s, W/s] (s = spatial_compression_ratio; H and W must be multiples of s).
//   call("decode", {z [B, latent_channels, f, h, w]}) -> {"sample" [B, out_channels, 1+4(f-1),
//        s*h, s*w]}, not clamped; no scaling_factor applied (the pipeline divides by it).
//   call("forward", {sample}) -> {"sample"}: decode(encode(x).mode).
//
// What differs from HunyuanVideo 1.0's VAE (hunyuan_video_vae.h):
//   - every norm is HunyuanVideo15RMS_norm: F.normalize over the channels of each voxel times
//     sqrt(C) * gamma, so there are no statistics across pixels or frames;
//   - the resamplers are DC-AE-style space/time <-> channel rearrangements: the downsampler's
//     causal 3x3x3 convolution makes out/f channels that are packed (f = 2x2 in space, x2 in time
//     where it resamples time; the first frame only in space, its channels doubled) and a
//     shortcut adds the packed input averaged over channel groups; the upsampler's convolution
//     makes out*f channels that are unpacked (the first frame only in space, keeping its first
//     half), plus the unpacked input repeated over channels;
//   - the encoder adds a channel-group mean of its last features to conv_out's moments, the
//     decoder adds z repeated over channels to conv_in's output;
//   - the mid-block attention (one head of C over all T*H*W tokens, 1x1x1 convolutions, the causal
//     frame mask of prepare_causal_attention_mask) runs per frame over the keys of frames 0..t.
//
// Tiling, as diffusers' enable_tiling (spatial only; this VAE has no temporal tiling): a video
// wider / taller than tile_sample_min_* encodes in tiles of that many pixels at a stride of
// int(min * (1 - tile_overlap_factor)), blended over int(tile_latent_min * overlap) latent rows;
// a latent wider / taller than tile_latent_min_* decodes in tiles of that many latents at a
// stride of int(tile_latent_min * (1 - overlap)), blended over int(tile_sample_min * overlap)
// pixels. The results equal diffusers' with the same settings, quirks included (the pieces are
// concatenated without a final crop). Slicing (enable_slicing) runs one batch element at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/hunyuan_video/hunyuan_video_vae.h"

namespace xfuser::models::hunyuan_video15 {

// A band of latent rows under a SpatialContext (patch-parallel decode): HunyuanVideo 1.0's.
using hunyuan_video::HunyuanVideoBand;

struct HunyuanVideo15VAEConfig {
  // diffusers' defaults (AutoencoderKLHunyuanVideo15.__init__, v0.36.0).
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 32;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 1024, 1024};
  int64_t layers_per_block = 2;
  int64_t spatial_compression_ratio = 16;
  int64_t temporal_compression_ratio = 4;
  bool downsample_match_channel = true;
  bool upsample_match_channel = true;
  double scaling_factor = 1.03682;

  // Reads config.json's keys (absent keys take diffusers' defaults); `path` names the file in
  // errors. Throws for wrong types and for configs diffusers cannot build or run (the error names
  // the key and the block): ratios that are not powers of two, more resamplers than blocks, a
  // temporal ratio above the spatial one, and channel counts the rearrangements cannot divide.
  static HunyuanVideo15VAEConfig from_json(const nlohmann::json& j, const std::string& path = "");
  // The checks of from_json on a config built in code; `where` names it in errors.
  void validate(const std::string& where) const;

  // Encoder down block i resamples space / space and time; decoder up block i resamples space /
  // time (diffusers' add_spatial_downsample, add_temporal_downsample, and their mirror images).
  bool down_spatial(size_t block) const;
  bool down_temporal(size_t block) const;
  bool up_spatial(size_t block) const;
  bool up_temporal(size_t block) const;
  // Output channels of down block i's downsampler / up block i's upsampler (the next block's
  // width when *_match_channel, else the block's own).
  int64_t down_out(size_t block) const;
  int64_t up_out(size_t block) const;
};

// diffusers' tiling attributes and their defaults (enable_tiling() sets use_tiling).
struct HunyuanVideo15VAETiling {
  bool use_tiling = false;
  int64_t tile_sample_min_height = 256;
  int64_t tile_sample_min_width = 256;
  int64_t tile_latent_min_height = 16;  // 256 / spatial_compression_ratio (set by the VAE)
  int64_t tile_latent_min_width = 16;
  double tile_overlap_factor = 0.25;
};

// One decoded / encoded Gaussian posterior: mean, logvar (clamped to [-30, 20]) and std.
struct HunyuanVideo15Posterior {
  at::Tensor mean, logvar, std;
  const at::Tensor& mode() const { return mean; }
  // mean + std * N(0, 1) (DiagonalGaussianDistribution.sample); `generator` may be null.
  at::Tensor sample(c10::optional<at::Generator> generator = c10::nullopt) const;
};

class HunyuanVideo15Encoder3D;
class HunyuanVideo15Decoder3D;

class AutoencoderKLHunyuanVideo15 : public Component {
 public:
  explicit AutoencoderKLHunyuanVideo15(HunyuanVideo15VAEConfig config);
  ~AutoencoderKLHunyuanVideo15() override;

  std::string class_name() const override { return "AutoencoderKLHunyuanVideo15"; }
  std::vector<std::string> methods() const override { return {"forward", "encode", "decode"}; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  const HunyuanVideo15VAEConfig& config() const { return config_; }

  // x [B, in_channels, 1+4k, H, W] in [-1, 1] (H, W multiples of s) -> the posterior, each
  // [B, latent_channels, 1+k, H/s, W/s]. Cast to dtype() first.
  HunyuanVideo15Posterior encode(const at::Tensor& x) const;
  // z [B, latent_channels, f, h, w] -> [B, out_channels, 1 + 4(f-1), s*h, s*w] in dtype().
  at::Tensor decode(const at::Tensor& z) const;
  // The same on a band of latent rows (z [B, latent_channels, f, rows, w]) -> that band's pixel
  // rows; a null band is decode(z). Spatial tiling on a band is an error. Every rank of the
  // band's context must make the same call (collectives).
  at::Tensor decode(const at::Tensor& z, const HunyuanVideoBand* band) const;

  // Tiling settings (see the file comment). set_tiling checks them: sizes positive, the overlap
  // factor in [0, 1) and leaving a stride of at least one pixel / latent (else diffusers' loops
  // take no step); the error names the field.
  void set_tiling(const HunyuanVideo15VAETiling& tiling);
  // diffusers' enable_tiling() with the current sizes / disable_tiling().
  void enable_tiling(bool on = true) { tiling_.use_tiling = on; }
  const HunyuanVideo15VAETiling& tiling() const { return tiling_; }

  // One batch element at a time (diffusers' use_slicing); results are identical.
  void enable_slicing(bool on = true) { use_slicing_ = on; }
  bool slicing() const { return use_slicing_; }

  int64_t spatial_scale() const { return config_.spatial_compression_ratio; }
  int64_t temporal_scale() const { return config_.temporal_compression_ratio; }
  // dtype of the loaded weights; throws before load().
  c10::ScalarType dtype() const;

 private:
  at::Tensor encode_one(const at::Tensor& x) const;  // diffusers' _encode: moments
  at::Tensor tiled_encode(const at::Tensor& x) const;
  at::Tensor decode_one(const at::Tensor& z, const HunyuanVideoBand* band) const;
  at::Tensor tiled_decode(const at::Tensor& z) const;
  void check_video(const std::string& what, const at::Tensor& x) const;
  void check_latent(const std::string& what, const at::Tensor& z) const;

  HunyuanVideo15VAEConfig config_;
  HunyuanVideo15VAETiling tiling_;
  std::shared_ptr<HunyuanVideo15Encoder3D> encoder_;
  std::shared_ptr<HunyuanVideo15Decoder3D> decoder_;
  bool use_slicing_ = false;
};

// Registers AutoencoderKLHunyuanVideo15 with the ComponentRegistry (config.json's `_class_name`).
// Idempotent: a second call does nothing.
void register_hunyuan_video15_vae_components();

}  // namespace xfuser::models::hunyuan_video15
