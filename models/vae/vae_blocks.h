// The building blocks of diffusers' AutoencoderKL (v0.33.1 vae.py, unet_2d_blocks.py, resnet.py,
// downsampling.py, upsampling.py, attention_processor.py), under diffusers' parameter names:
// Conv2d, GroupNorm, Linear, ResnetBlock2D, Downsample2D, Upsample2D, the mid-block Attention,
// UNetMidBlock2D, DownEncoderBlock2D, UpDecoderBlock2D, Encoder and Decoder.
//
// Every layer that looks beyond a pixel (3x3 convolutions, group-norm statistics, attention over
// all tokens) goes through a SpatialContext, so the decoder can run on a horizontal band of the
// latent (patch-parallel VAE: halo rows from the neighbours, statistics all-reduced, keys/values
// gathered) with the same code. A null context means "the tensor is the whole image".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/common/module.h"

namespace xfuser::models::vae {

// How layers see the rest of the image when the tensor they hold is a band of rows of it.
class SpatialContext {
 public:
  virtual ~SpatialContext() = default;
  // x [B, C, h, W] (this band) -> [B, C, h + 2*halo, W]: `halo` rows of the band above prepended
  // and of the band below appended; zeros where the band touches the image edge.
  virtual at::Tensor pad_rows(const at::Tensor& x, int64_t halo) const;
  // x [B, G, n] fp32 (this band's values per batch and group) -> mean and biased variance [B, G]
  // over the whole image.
  virtual std::pair<at::Tensor, at::Tensor> group_moments(const at::Tensor& x) const;
  // tokens [B, n, C] of this band -> [B, N, C] tokens of the whole image, in row-major order.
  virtual at::Tensor gather_tokens(const at::Tensor& tokens) const;
};

// Activation by diffusers' get_activation name: silu/swish, mish, gelu, relu.
enum class Activation { kSilu, kMish, kGelu, kRelu };
Activation activation_from_name(const std::string& name);
at::Tensor apply_activation(const at::Tensor& x, Activation act);

// nn.Conv2d: weight [out, in, k, k], bias [out].
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size);
  // Zero padding `padding` on every side; with a context the row padding comes from pad_rows.
  at::Tensor forward(const at::Tensor& x, int64_t stride, int64_t padding,
                     const SpatialContext* ctx = nullptr) const;
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  at::Tensor weight() const { return weight_->value(); }

 private:
  int64_t in_channels_, out_channels_, kernel_size_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

// nn.GroupNorm(affine): weight/bias [C] kept in fp32; statistics and normalisation in fp32.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t groups, int64_t channels, double eps);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  int64_t groups_, channels_;
  double eps_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

// nn.Linear with bias: weight [out, in].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  ParamSlot* weight_;
  ParamSlot* bias_;
};

// ResnetBlock2D without time embedding: out = shortcut(x) + conv2(act(norm2(conv1(act(norm1 x))))).
class ResnetBlock2D : public Module {
 public:
  ResnetBlock2D(int64_t in_channels, int64_t out_channels, int64_t groups, double eps,
                Activation act);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  Activation act_;
  std::shared_ptr<GroupNorm> norm1_, norm2_;
  std::shared_ptr<Conv2d> conv1_, conv2_, conv_shortcut_;  // conv_shortcut_ only if in != out
};

// Downsample2D(use_conv, padding 0): pad (0, 1, 0, 1) with zeros, 3x3 conv stride 2. With a
// context x is a band of an even number of rows starting at an even row: its extra bottom row is
// the first row of the band below (zeros at the image's bottom), and the result is the band of
// half as many rows it maps to.
class Downsample2D : public Module {
 public:
  explicit Downsample2D(int64_t channels);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  std::shared_ptr<Conv2d> conv_;
};

// Upsample2D(use_conv): nearest 2x, 3x3 conv padding 1.
class Upsample2D : public Module {
 public:
  explicit Upsample2D(int64_t channels);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  std::shared_ptr<Conv2d> conv_;
};

// The mid-block Attention (_from_deprecated_attn_block): one head of dim C over the H*W tokens,
// group_norm first, to_q/to_k/to_v/to_out.0 with bias, residual, / rescale_output_factor (1).
// The product runs through backends::attention (scores and softmax in fp32).
class SpatialAttention : public Module {
 public:
  SpatialAttention(int64_t channels, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  int64_t channels_;
  std::shared_ptr<GroupNorm> group_norm_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, to_out_;
};

// UNetMidBlock2D (num_layers 1): resnets.0, attentions.0 (optional), resnets.1.
class UNetMidBlock2D : public Module {
 public:
  UNetMidBlock2D(int64_t channels, int64_t groups, double eps, Activation act, bool add_attention);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  std::shared_ptr<ResnetBlock2D> resnet0_, resnet1_;
  std::shared_ptr<SpatialAttention> attention_;  // null when add_attention is false
};

// DownEncoderBlock2D: `num_layers` resnets, then downsamplers.0 unless it is the last block.
class DownEncoderBlock2D : public Module {
 public:
  DownEncoderBlock2D(int64_t in_channels, int64_t out_channels, int num_layers, int64_t groups,
                     double eps, Activation act, bool add_downsample);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  std::vector<std::shared_ptr<ResnetBlock2D>> resnets_;
  std::shared_ptr<Downsample2D> downsampler_;
};

// UpDecoderBlock2D: `num_layers` resnets, then upsamplers.0 unless it is the last block.
class UpDecoderBlock2D : public Module {
 public:
  UpDecoderBlock2D(int64_t in_channels, int64_t out_channels, int num_layers, int64_t groups,
                   double eps, Activation act, bool add_upsample);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;
  bool upsamples() const { return upsampler_ != nullptr; }

 private:
  std::vector<std::shared_ptr<ResnetBlock2D>> resnets_;
  std::shared_ptr<Upsample2D> upsampler_;
};

struct CoderConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {64};
  int layers_per_block = 2;
  int64_t norm_num_groups = 32;
  Activation act = Activation::kSilu;
  bool mid_block_add_attention = true;
};

// vae.py Encoder (double_z): [B, in, H, W] -> [B, 2*out, H/2^(n-1), W/2^(n-1)].
// With a context, x is a band of pixel rows (a multiple of 2^(n-1) rows, starting at one) and
// the result the band of latent rows it maps to.
class Encoder : public Module {
 public:
  explicit Encoder(const CoderConfig& config);
  at::Tensor forward(const at::Tensor& x, const SpatialContext* ctx = nullptr) const;

 private:
  std::shared_ptr<Conv2d> conv_in_, conv_out_;
  std::vector<std::shared_ptr<DownEncoderBlock2D>> down_blocks_;
  std::shared_ptr<UNetMidBlock2D> mid_block_;
  std::shared_ptr<GroupNorm> conv_norm_out_;
  Activation act_;
};

// vae.py Decoder (norm_type "group"): [B, in, h, w] -> [B, out, h*2^(n-1), w*2^(n-1)].
// With a context, `z` is a band of latent rows and the result the matching band of pixel rows.
class Decoder : public Module {
 public:
  explicit Decoder(const CoderConfig& config);
  at::Tensor forward(const at::Tensor& z, const SpatialContext* ctx = nullptr) const;
  // Output pixels per latent pixel along each axis (2^(number of upsamplers)).
  int64_t upscale_factor() const;
  // Its dtype is the model's (undefined before load()).
  at::Tensor conv_in_weight() const { return conv_in_->weight(); }

 private:
  std::shared_ptr<Conv2d> conv_in_, conv_out_;
  std::shared_ptr<UNetMidBlock2D> mid_block_;
  std::vector<std::shared_ptr<UpDecoderBlock2D>> up_blocks_;
  std::shared_ptr<GroupNorm> conv_norm_out_;
  Activation act_;
};

// A decoder's memory at its peak, for the memory plan (Component::activation_bytes): the feature
// maps of its full-resolution level (`channels` x `positions`: the map upsampled into that level,
// the widest there) at `per_channel` bytes for each channel and position (its live maps and
// their fp32 temporaries, measured per VAE class), plus on the CPU the columns libtorch's 3D
// convolution unfolds (slow_conv3d: in-channels x kernel volume x output positions in fp32; a GPU
// convolves without them). libtorch takes that path only for inputs it deems small (batch x
// in-channels x padded frames x padded rows <= 20480; larger fp32 inputs go to oneDNN, which
// unfolds nothing): `conv3d_in` the in-channels of the level's 3D convolutions (0 for a 2D
// decoder), `padded` their input's frames x rows.
inline uint64_t decoder_peak_bytes(uint64_t positions, int64_t channels, double per_channel,
                                   int64_t conv3d_in, int64_t padded, int64_t batch, bool cpu) {
  const double maps = static_cast<double>(positions) * static_cast<double>(channels) * per_channel;
  const bool unfolds = cpu && conv3d_in > 0 && batch * conv3d_in * padded <= 20480;
  const uint64_t columns =
      unfolds ? positions * static_cast<uint64_t>(conv3d_in) * 27 * 4 : uint64_t{0};
  return static_cast<uint64_t>(maps) + columns;
}

// One resolution of a 3D decoder: its resnets (or an upsampler's convolution) go from `in` to
// `out` channels at frames x height x width.
struct DecoderLevel {
  int64_t in = 0, out = 0;
  int64_t frames = 1, height = 0, width = 0;
};
// decoder_peak_bytes at the level where it is largest (a lower level can unfold columns the
// full-resolution level does not), with causal padding: two frames before, a row each side.
inline uint64_t decoder_levels_peak_bytes(const std::vector<DecoderLevel>& levels,
                                          double per_channel, int64_t batch, bool cpu) {
  uint64_t peak = 0;
  for (const DecoderLevel& l : levels) {
    const auto positions = static_cast<uint64_t>(batch * l.frames * l.height * l.width);
    const int64_t widest = l.in > l.out ? l.in : l.out;
    const uint64_t b = decoder_peak_bytes(positions, widest, per_channel, widest,
                                          (l.frames + 2) * (l.height + 2), batch, cpu);
    peak = b > peak ? b : peak;
  }
  return peak;
}

}  // namespace xfuser::models::vae
