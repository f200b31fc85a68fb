// AutoencoderKLWan (diffusers v0.33.1 autoencoder_kl_wan.py): the Wan 2.1 3D causal video VAE as
// a Component, under diffusers' parameter names (encoder.down_blocks.N..., decoder.up_blocks.N.
// upsamplers.0.resample.1.weight, quant_conv, post_quant_conv, ...).
//
//   call("encode", {sample [B, 3, 1+4k, H, W]}) -> {"latent_dist_mean", "latent_dist_std",
//        "sample" (= the mode, the mean)}, each [B, z_dim, 1+k', h, w] (k' = k * 4 /
//        temporal_scale(); h = H / 8 for dim_mult of 4 entries).
//   call("decode", {z [B, z_dim, f, h, w]})     -> {"sample" [B, 3, 1 + temporal_scale()*(f-1),
//        8h, 8w]}, clamped to [-1, 1]. No latents_mean / latents_std applied: the pipeline does.
//   call("forward", {sample})                   -> {"sample"}: decode(encode(x).mode).
//
// Like diffusers, encode runs the encoder on the first frame, then on chunks of 4 frames, and
// decode runs the decoder one latent frame at a time; every causal 3D convolution carries the
// last (up to) 2 frames of its input from one chunk to the next in a feature cache (and the
// temporal up/down samplers their own entries, with diffusers' "Rep" first-chunk logic). The
// cache lives on the stack of each encode()/decode() call: both are const and re-entrant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"

namespace xfuser::models::vae {
class SpatialContext;
}

namespace xfuser::models::wan {

struct WanVAEConfig {
  // diffusers' defaults (AutoencoderKLWan.__init__, v0.33.1).
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;  // must be empty (see from_json)
  std::vector<bool> temperal_downsample = {false, true, true};
  double dropout = 0.0;  // inference: unused
  // z_dim entries each; diffusers' 16 Wan 2.1 defaults when absent.
  std::vector<double> latents_mean, latents_std;

  WanVAEConfig();
  // Reads config.json's keys (absent keys take diffusers' defaults); `path` names the file in
  // errors. Throws for wrong types, inconsistent sizes (temperal_downsample needs
  // len(dim_mult) - 1 entries, latents_mean/std z_dim entries) and a non-empty attn_scales
  // (diffusers v0.33.1 cannot run its encoder with down-block attention).
  static WanVAEConfig from_json(const nlohmann::json& j, const std::string& path = "");
};

class WanEncoder3d;
class WanDecoder3d;
class WanCausalConv3d;

class AutoencoderKLWan : public Component {
 public:
  explicit AutoencoderKLWan(WanVAEConfig config);
  ~AutoencoderKLWan() override;

  std::string class_name() const override { return "AutoencoderKLWan"; }
  std::vector<std::string> methods() const override { return {"forward", "encode", "decode"}; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  const WanVAEConfig& config() const { return config_; }

  // x [B, 3, 1+4k, H, W] in [-1, 1] -> (mean, logvar) each [B, z_dim, 1+k', h, w]; logvar is
  // clamped to [-30, 20] (DiagonalGaussianDistribution). Inputs are cast to dtype().
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& x) const;
  // z [B, z_dim, f, h, w] -> [B, 3, 1 + temporal_scale()*(f-1), 8h, 8w], clamped to [-1, 1].
  at::Tensor decode(const at::Tensor& z) const;
  // The band decode of the patch-parallel VAE: with a context, z [B, z_dim, f, rows, w] is this
  // rank's band of latent rows and the result its band of pixel rows [B, 3, F, 8 rows, 8w]. Every
  // spatial 3x3 convolution takes its halo rows from ctx->pad_rows (on the cached frames and the
  // chunk together, so each rank caches only its own rows), and the mid-block attention attends
  // over ctx->gather_tokens of the frame's keys/values. A null context is decode(z).
  at::Tensor decode(const at::Tensor& z, const vae::SpatialContext* ctx) const;

  // 2^(number of true in temperal_downsample): 4 for Wan 2.1.
  int64_t temporal_scale() const;
  // 2^len(temperal_downsample) (= 2^(len(dim_mult) - 1)): 8 for Wan 2.1.
  int64_t spatial_scale() const;
  // dtype of the loaded weights; throws before load().
  c10::ScalarType dtype() const;

  // One batch element at a time (diffusers' use_slicing); results are identical.
  void enable_slicing(bool on = true) { use_slicing_ = on; }
  bool slicing() const { return use_slicing_; }

 private:
  // The moments [B, 2*z_dim, f, h, w] after quant_conv, for the whole batch at once.
  at::Tensor encode_moments(const at::Tensor& x) const;
  at::Tensor decode_one(const at::Tensor& z, const vae::SpatialContext* ctx) const;
  // Rank, channels, sizes and frame count of an encode / decode input.
  void check_video(const std::string& what, const at::Tensor& x) const;
  void check_latent(const std::string& what, const at::Tensor& z) const;

  WanVAEConfig config_;
  std::shared_ptr<WanEncoder3d> encoder_;
  std::shared_ptr<WanCausalConv3d> quant_conv_;
  std::shared_ptr<WanCausalConv3d> post_quant_conv_;
  std::shared_ptr<WanDecoder3d> decoder_;
  bool use_slicing_ = false;
};

}  // namespace xfuser::models::wan
