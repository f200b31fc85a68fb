// AutoencoderKL (diffusers v0.33.1 autoencoder_kl.py): the FLUX.1 / SD3 image VAE as a Component.
//
//   call("decode", {z})       -> {"sample"}: decoder(post_quant_conv(z)); no scaling or shift (the
//                                pipeline applies scaling_factor / shift_factor).
//   call("encode", {sample})  -> {"latent_dist_mean", "latent_dist_std", "sample" (= the mode,
//                                i.e. the mean)} of DiagonalGaussianDistribution(quant_conv(enc
//                                x)).
//   call("forward", {sample}) -> {"sample"}: decode(encode(x).mode) (sample_posterior=False).
//
// Slicing (one batch element at a time) and tiling (overlapping tiles blended linearly, diffusers'
// tiled_encode / tiled_decode) follow diffusers' enable_slicing / enable_tiling semantics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/vae/vae_blocks.h"

namespace xfuser::models::vae {

struct AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<std::string> down_block_types = {"DownEncoderBlock2D"};
  std::vector<std::string> up_block_types = {"UpDecoderBlock2D"};
  std::vector<int64_t> block_out_channels = {64};
  // The decoder's own widths (AutoencoderKLFlux2's decoder_block_out_channels, a narrower decoder
  // in newer diffusers); empty: block_out_channels. One entry per up block either way.
  std::vector<int64_t> decoder_block_out_channels;
  int layers_per_block = 1;
  std::string act_fn = "silu";
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 32;  // the first entry when config.json has a list
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;
  std::optional<std::vector<double>> latents_mean;
  std::optional<std::vector<double>> latents_std;
  bool force_upcast = true;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;

  // Reads config.json's keys (absent keys take diffusers' defaults); `path` names the file in
  // errors. Throws for wrong types and for block types / activations this port does not implement.
  static AutoencoderKLConfig from_json(const nlohmann::json& j, const std::string& path = "");
};

// Posterior of encode(): moments split into mean and clamped log-variance.
struct DiagonalGaussian {
  at::Tensor mean;    // [B, latent, h, w]
  at::Tensor logvar;  // clamped to [-30, 20]
  at::Tensor std;     // exp(0.5 * logvar)
  const at::Tensor& mode() const { return mean; }
};

class AutoencoderKL : public Component {
 public:
  explicit AutoencoderKL(AutoencoderKLConfig config);

  std::string class_name() const override { return "AutoencoderKL"; }
  std::vector<std::string> methods() const override { return {"forward", "encode", "decode"}; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  const AutoencoderKLConfig& config() const { return config_; }

  // Image x [B, in, H, W] -> posterior over [B, latent, H/f, W/f] (f = spatial_scale()).
  DiagonalGaussian encode(const at::Tensor& x) const;
  // The posterior of moments [B, 2*latent, h, w] (mean; log-variance clamped to [-30, 20]).
  static DiagonalGaussian posterior(const at::Tensor& moments);
  // One full encode of x to moments without slicing or tiling; with a context, x is a band of
  // pixel rows (patch-parallel VAE) and the result the band of latent rows it maps to.
  at::Tensor encode_full(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;
  // Latent z [B, latent, h, w] -> image [B, out, h*f, w*f].
  at::Tensor decode(const at::Tensor& z) const;
  // One full decode of z without slicing or tiling; with a context, z is a band of latent rows
  // (patch-parallel VAE) and the result the band of pixel rows it maps to.
  at::Tensor decode_full(const at::Tensor& z, const SpatialContext* ctx = nullptr) const;
  at::Tensor tiled_decode(const at::Tensor& z) const;
  // The moments [B, 2*latent, h, w] of tiled encoding (diffusers' _tiled_encode).
  at::Tensor tiled_encode_moments(const at::Tensor& x) const;

  // diffusers' enable_tiling(): decode latents larger than tile_latent_min_size (and encode
  // images larger than tile_sample_min_size) tile by tile.
  void enable_tiling(bool on = true) { use_tiling_ = on; }
  // diffusers' enable_slicing(): encode / decode one batch element at a time.
  void enable_slicing(bool on = true) { use_slicing_ = on; }
  bool tiling() const { return use_tiling_; }
  bool slicing() const { return use_slicing_; }
  // Tile sizes: sample (pixels) defaults to config sample_size, latent to sample_size / f, and
  // overlap factor 0.25, as in diffusers.
  void set_tile_sizes(int64_t sample_min_size, int64_t latent_min_size,
                      double overlap_factor = 0.25);
  int64_t tile_sample_min_size() const { return tile_sample_min_size_; }
  int64_t tile_latent_min_size() const { return tile_latent_min_size_; }
  double tile_overlap_factor() const { return tile_overlap_factor_; }

  // Pixels per latent pixel along each axis: 2^(len(block_out_channels) - 1).
  int64_t spatial_scale() const;
  // dtype of the loaded weights (inputs are cast to it); throws before load().
  c10::ScalarType dtype() const;

 private:
  at::Tensor encode_moments(const at::Tensor& x) const;  // one slice, maybe tiled
  at::Tensor decode_one(const at::Tensor& z) const;      // one slice, maybe tiled
  void check_input(const std::string& method, const std::string& name, const at::Tensor& t,
                   int64_t channels) const;

  AutoencoderKLConfig config_;
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<Decoder> decoder_;
  std::shared_ptr<Conv2d> quant_conv_;       // null when use_quant_conv is false
  std::shared_ptr<Conv2d> post_quant_conv_;  // null when use_post_quant_conv is false
  bool use_tiling_ = false;
  bool use_slicing_ = false;
  int64_t tile_sample_min_size_;
  int64_t tile_latent_min_size_;
  double tile_overlap_factor_ = 0.25;
};

}  // namespace xfuser::models::vae
