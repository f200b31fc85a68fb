// AutoencoderKLHunyuanVideo (diffusers v0.33.1 autoencoder_kl_hunyuan_video.py): HunyuanVideo's
// causal 3D video VAE as a Component, under diffusers' parameter names
// (encoder.conv_in.conv.weight, encoder.down_blocks.N.resnets.M.conv1.conv.weight,
// ....downsamplers.0.conv.conv.weight, decoder.up_blocks.N.upsamplers.0.conv.conv.weight,
// *.mid_block.attentions.0.to_q.weight, quant_conv, post_quant_conv, ...), so a diffusers vae/
// folder loads unchanged.
//
//   call("encode", {sample [B, in_channels, 1+4k, H, W]}) -> {"latent_dist_mean",
//        "latent_dist_std", "sample" (= the mode, the mean)}, each [B, latent_channels, 1+k,
//        ~H/s, ~W/s] (s = spatial_compression_ratio; the downsamplers pad, so ceil at each level).
//   call("decode", {z [B, latent_channels, f, h, w]}) -> {"sample" [B, out_channels, 1+4(f-1),
//        s*h, s*w]}, not clamped (diffusers does not; the pipeline's postprocess does). No
//        scaling_factor applied: the pipeline divides by it.
//   call("forward", {sample}) -> {"sample"}: decode(encode(x).mode).
//
// Unlike Wan's VAE, the coders see the whole clip at once: every HunyuanVideoCausalConv3d pads
// (kernel-1) frames in front by repeating the first frame and pads H and W by repeating the edge
// (pad_mode "replicate", the only mode diffusers' VAE uses), GroupNorm statistics span all frames,
// the upsamplers treat the first frame alone (spatial x2 only, the others (2, 2, 2) nearest), and
// the mid-block attention (one head over all T*H*W tokens) carries the causal frame mask of
// prepare_causal_attention_mask: a token of frame t attends the tokens of frames 0..t (run here as
// one attention per frame over the keys of frames 0..t, which is the same softmax without
// materialising the [THW, THW] mask).
//
// Tiling, as diffusers does it (set_tiling / enable_tiling; HunyuanVideoVAETiling holds
// diffusers' defaults):
//   - framewise (on by default in diffusers, so also here): a latent of more than
//     tile_sample_min_num_frames / 4 frames decodes in overlapping temporal tiles of
//     min/4 + 1 latent frames at a stride of stride/4, blended over (min - stride) output frames
//     (_temporal_tiled_decode / blend_t); a video of more than tile_sample_min_num_frames frames
//     encodes the same way (_temporal_tiled_encode);
//   - use_tiling (diffusers' enable_tiling): spatial tiles of tile_sample_min_height x _width
//     pixels at a stride of tile_sample_stride_*, blended over the overlap (tiled_decode /
//     tiled_encode, blend_v / blend_h), also inside each temporal tile.
// Spatial tiling is what lets a 720p x 129-frame decode (33 x 90 x 160 latents) fit GPU memory:
// without it the decoder's activations for a whole 17-frame temporal tile at 720x1280 (and the
// mid-block attention over 5 x 90 x 160 tokens) come to tens of GiB by a rough count (128 channels
// x 17 x 720 x 1280 is 3.7 GiB per bf16 tensor); with 256-pixel tiles each decoder
// call sees 17 x 256 x 256 pixels. The results equal diffusers' with the same settings (including
// its quirk of testing the latent width against tile_sample_stride_width / 8 in _decode).
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

namespace xfuser::models::hunyuan_video {

// One horizontal band of latent rows decoded under a SpatialContext (patch-parallel decode,
// hunyuan_video_vae_parallel.h): every spatial 3x3x3 convolution takes its halo rows from
// ctx->pad_rows and replicates its edge rows only where the band touches the picture's top /
// bottom; GroupNorm statistics come from ctx->group_moments; the mid-block attention's keys and
// values are gathered with ctx->gather_tokens.
struct HunyuanVideoBand {
  const vae::SpatialContext* ctx = nullptr;
  bool top = true;     // the band starts at the picture's first row
  bool bottom = true;  // the band ends at the picture's last row
};

struct HunyuanVideoVAEConfig {
  // diffusers' defaults (AutoencoderKLHunyuanVideo.__init__, v0.33.1).
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 16;
  std::vector<std::string> down_block_types =
      std::vector<std::string>(4, "HunyuanVideoDownBlock3D");
  std::vector<std::string> up_block_types = std::vector<std::string>(4, "HunyuanVideoUpBlock3D");
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  int64_t layers_per_block = 2;
  std::string act_fn = "silu";
  int64_t norm_num_groups = 32;
  double scaling_factor = 0.476986;
  int64_t spatial_compression_ratio = 8;
  int64_t temporal_compression_ratio = 4;
  bool mid_block_add_attention = true;

  // Reads config.json's keys (absent keys take diffusers' defaults); `path` names the file in
  // errors. Throws for wrong types and for configs diffusers rejects or builds inconsistently:
  // unknown block types, block lists of different lengths, channels not divisible by
  // norm_num_groups, an unknown act_fn, a temporal ratio other than 4, or ratios the block count
  // cannot realise (log2(spatial) <= blocks, and the two temporal downsamplers need >= 3 blocks).
  static HunyuanVideoVAEConfig from_json(const nlohmann::json& j, const std::string& path = "");
  // The checks of from_json on a config built in code; `where` names it in errors.
  void validate(const std::string& where) const;

  // Per block: does down block i (and up block i) resample in space / in time (diffusers'
  // add_spatial_downsample / add_time_downsample, with the decoder's mirror image).
  bool spatial_resample(size_t block) const;
  bool temporal_resample(size_t block) const;
};

// diffusers' tiling attributes and their defaults (enable_tiling() sets use_tiling).
struct HunyuanVideoVAETiling {
  bool use_tiling = false;
  bool use_framewise_encoding = true;
  bool use_framewise_decoding = true;
  int64_t tile_sample_min_height = 256;
  int64_t tile_sample_min_width = 256;
  int64_t tile_sample_min_num_frames = 16;
  int64_t tile_sample_stride_height = 192;
  int64_t tile_sample_stride_width = 192;
  int64_t tile_sample_stride_num_frames = 12;
};

class HunyuanVideoEncoder3D;
class HunyuanVideoDecoder3D;
class HunyuanVideoConv3d;

class AutoencoderKLHunyuanVideo : public Component {
 public:
  explicit AutoencoderKLHunyuanVideo(HunyuanVideoVAEConfig config);
  ~AutoencoderKLHunyuanVideo() override;

  std::string class_name() const override { return "AutoencoderKLHunyuanVideo"; }
  std::vector<std::string> methods() const override { return {"forward", "encode", "decode"}; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  const HunyuanVideoVAEConfig& config() const { return config_; }

  // x [B, in_channels, 1+4k, H, W] in [-1, 1] -> (mean, logvar) each [B, latent_channels, 1+k,
  // h, w]; logvar clamped to [-30, 20] (DiagonalGaussianDistribution). Cast to dtype() first.
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& x) const;
  // z [B, latent_channels, f, h, w] -> [B, out_channels, 1 + 4(f-1), s*h, s*w] in dtype().
  at::Tensor decode(const at::Tensor& z) const;
  // The same on a band of latent rows (z [B, latent_channels, f, rows, w]) -> that band's pixel
  // rows [B, out_channels, 1 + 4(f-1), s*rows, s*w], with the framewise temporal tiling and
  // slicing as decode(z). A null band is decode(z). Spatial tiling (use_tiling) on a band is an
  // error. Every rank of the band's context must make the same call (collectives).
  at::Tensor decode(const at::Tensor& z, const HunyuanVideoBand* band) const;

  // Tiling settings (see the file comment). set_tiling checks them: sizes positive, each stride
  // at most its tile, spatial strides and tiles at least spatial_compression_ratio pixels and
  // frame strides at least temporal_compression_ratio frames (else diffusers' loops take no step
  // or leave gaps); the error names the field.
  void set_tiling(const HunyuanVideoVAETiling& tiling);
  // diffusers' enable_tiling() with its default sizes (or the current ones) / disable_tiling().
  void enable_tiling(bool on = true) { tiling_.use_tiling = on; }
  const HunyuanVideoVAETiling& tiling() const { return tiling_; }

  // One batch element at a time (diffusers' use_slicing); results are identical.
  void enable_slicing(bool on = true) { use_slicing_ = on; }
  bool slicing() const { return use_slicing_; }

  int64_t spatial_scale() const { return config_.spatial_compression_ratio; }
  int64_t temporal_scale() const { return config_.temporal_compression_ratio; }
  // dtype of the loaded weights; throws before load().
  c10::ScalarType dtype() const;

 private:
  // diffusers' _encode / _decode (one batch or one slice) and their tiled variants.
  at::Tensor encode_moments(const at::Tensor& x) const;
  at::Tensor encode_plain(const at::Tensor& x) const;
  at::Tensor tiled_encode(const at::Tensor& x) const;
  at::Tensor temporal_tiled_encode(const at::Tensor& x) const;
  at::Tensor decode_one(const at::Tensor& z, const HunyuanVideoBand* band) const;
  at::Tensor decode_plain(const at::Tensor& z, const HunyuanVideoBand* band) const;
  at::Tensor tiled_decode(const at::Tensor& z) const;
  at::Tensor temporal_tiled_decode(const at::Tensor& z, const HunyuanVideoBand* band) const;
  void check_video(const std::string& what, const at::Tensor& x) const;
  void check_latent(const std::string& what, const at::Tensor& z) const;

  HunyuanVideoVAEConfig config_;
  HunyuanVideoVAETiling tiling_;
  std::shared_ptr<HunyuanVideoEncoder3D> encoder_;
  std::shared_ptr<HunyuanVideoDecoder3D> decoder_;
  std::shared_ptr<HunyuanVideoConv3d> quant_conv_;
  std::shared_ptr<HunyuanVideoConv3d> post_quant_conv_;
  bool use_slicing_ = false;
};

}  // namespace xfuser::models::hunyuan_video
