#include "models/hunyuan_video15/hunyuan_video15_vae.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/attention.h"
#include "backends/error.h"
#include "backends/kernels.h"
#include "backends/tensor_util.h"
#include "models/vae/tile_blend.h"
#include "models/vae/vae_blocks.h"
#include "models/vae/video_checks.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::hunyuan_video15 {

namespace {

// libtorch's CPU kernels have no fp16 convolution / replication padding and a lossy bf16 conv3d
// (see hunyuan_video_vae.cpp): on the CPU, fp16/bf16 convolutions run in fp32 and round back.
bool needs_upcast(const at::Tensor& x) {
  return (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) && x.device().is_cpu();
}

// int(np.log2(v)) for v >= 1.
int64_t floor_log2(int64_t v) {
  int64_t n = 0;
  while (v > 1) {
    v >>= 1;
    ++n;
  }
  return n;
}

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// diffusers' _dcae_upsample_rearrange: [b, r1*r2*r3*c, f, h, w] -> [b, c, r1*f, r2*h, r3*w].
at::Tensor unpack(const at::Tensor& x, int64_t r1, int64_t r2, int64_t r3) {
  const int64_t b = x.size(0), f = x.size(2), h = x.size(3), w = x.size(4);
  const int64_t c = x.size(1) / (r1 * r2 * r3);
  return x.reshape({b, r1, r2, r3, c, f, h, w})
      .permute({0, 4, 5, 1, 6, 2, 7, 3})
      .reshape({b, c, f * r1, h * r2, w * r3});
}

// diffusers' _dcae_downsample_rearrange: [b, c, r1*f, r2*h, r3*w] -> [b, r1*r2*r3*c, f, h, w].
at::Tensor pack(const at::Tensor& x, int64_t r1, int64_t r2, int64_t r3) {
  const int64_t b = x.size(0), c = x.size(1);
  const int64_t f = x.size(2) / r1, h = x.size(3) / r2, w = x.size(4) / r3;
  return x.reshape({b, c, f, r1, h, r2, w, r3})
      .permute({0, 3, 5, 7, 1, 2, 4, 6})
      .reshape({b, r1 * r2 * r3 * c, f, h, w});
}

// x [B, groups * size, ...] -> mean over each run of `size` channels: [B, groups, ...].
at::Tensor group_mean(const at::Tensor& x, int64_t groups) {
  std::vector<int64_t> shape = {x.size(0), groups, x.size(1) / groups};
  for (int64_t d = 2; d < x.dim(); ++d) shape.push_back(x.size(d));
  return x.reshape(shape).mean(2);
}

using vae::blend;  // models/vae/tile_blend.h
using vae::slice;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layers.

// nn.Conv3d with bias (`prefix` + "weight" [out, in, k, k, k], + "bias" [out]). As
// HunyuanVideo15CausalConv3d (prefix "conv."), F.pad(x, (k/2, k/2, k/2, k/2, k-1, 0),
// mode="replicate") first; on a band the row padding comes from the neighbours' halo rows.
class Conv3d : public Module {
 public:
  Conv3d(int64_t in, int64_t out, int64_t kernel, bool causal)
      : in_(in), kernel_(kernel), causal_(causal) {
    const std::string prefix = causal ? "conv." : "";
    weight_ = &param(prefix + "weight", {out, in, kernel, kernel, kernel});
    bias_ = &param(prefix + "bias", {out});
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    XF_CHECK(weight_->loaded(),
             "HunyuanVideo15CausalConv3d used before its weights were "
             "loaded");
    XF_CHECK(x.dim() == 5 && x.size(1) == in_, "HunyuanVideo15CausalConv3d expects [B, ", in_,
             ", T, H, W], got ", shape_string(x.sizes()));
    const bool up = needs_upcast(x);
    at::Tensor h = up ? x.to(at::kFloat) : x;
    if (causal_ && kernel_ > 1) {
      const int64_t p = kernel_ / 2;
      if (band != nullptr) {
        h = pad_band_rows(h, p, *band);
        h = at::replication_pad3d(h, {p, p, 0, 0, kernel_ - 1, 0});
      } else {
        h = at::replication_pad3d(h, {p, p, p, p, kernel_ - 1, 0});
      }
    }
    at::Tensor w = weight_->value(), b = bias_->value();
    if (up) {
      w = w.to(at::kFloat);
      b = b.to(at::kFloat);
    }
    at::Tensor out = backends::conv3d(h, w, b, {1, 1, 1}, {0, 0, 0});
    return up ? out.to(x.scalar_type()) : out;
  }

  at::Tensor weight() const { return weight_->value(); }

 private:
  // x [B, C, T, h, W] (a band) -> [B, C, T, h + 2p, W]: p halo rows from the neighbouring bands,
  // the edge row repeated where the band touches the picture's top / bottom (replicate padding).
  static at::Tensor pad_band_rows(const at::Tensor& x, int64_t p, const HunyuanVideoBand& band) {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    at::Tensor padded =
        band.ctx->pad_rows(x.reshape({b, c * t, h, w}), p).view({b, c, t, h + 2 * p, w});
    at::Tensor above =
        band.top ? x.narrow(3, 0, 1).expand({b, c, t, p, w}) : padded.narrow(3, 0, p);
    at::Tensor below =
        band.bottom ? x.narrow(3, h - 1, 1).expand({b, c, t, p, w}) : padded.narrow(3, p + h, p);
    return at::cat({above, x, below}, 3);
  }

  int64_t in_, kernel_;
  bool causal_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

namespace {

std::shared_ptr<Conv3d> causal_conv(int64_t in, int64_t out) {
  return std::make_shared<Conv3d>(in, out, 3, true);
}

// HunyuanVideo15RMS_norm(images=False): F.normalize(x, dim=1) * sqrt(C) * gamma [C, 1, 1, 1]
// (bias False). Per voxel: nothing to share between bands. Computed in fp32.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t channels) : channels_(channels) {
    gamma_ = &param("gamma", {channels, 1, 1, 1});
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor norm = xf.pow(2).sum(1, /*keepdim=*/true).sqrt().clamp_min(1e-12);
    at::Tensor out =
        xf / norm * std::sqrt(static_cast<double>(channels_)) * gamma_->value().to(at::kFloat);
    return out.to(x.scalar_type());
  }

 private:
  int64_t channels_;
  ParamSlot* gamma_;
};

// HunyuanVideo15ResnetBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))); the
// shortcut is a plain 1x1x1 nn.Conv3d where the widths differ.
class ResnetBlock : public Module {
 public:
  ResnetBlock(int64_t in, int64_t out) {
    norm1_ = child("norm1", std::make_shared<RMSNorm>(in));
    conv1_ = child("conv1", causal_conv(in, out));
    norm2_ = child("norm2", std::make_shared<RMSNorm>(out));
    conv2_ = child("conv2", causal_conv(out, out));
    if (in != out)
      conv_shortcut_ = child("conv_shortcut", std::make_shared<Conv3d>(in, out, 1, false));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = conv1_->forward(at::silu(norm1_->forward(x)), band);
    h = conv2_->forward(at::silu(norm2_->forward(h)), band);
    return h + (conv_shortcut_ ? conv_shortcut_->forward(x) : x);
  }

 private:
  std::shared_ptr<RMSNorm> norm1_, norm2_;
  std::shared_ptr<Conv3d> conv1_, conv2_, conv_shortcut_;
};

// HunyuanVideo15AttnBlock: RMS norm, to_q / to_k / to_v / proj_out as 1x1x1 convolutions, one
// head of C over all T*H*W tokens with the causal frame mask (frame t's queries see the keys of
// frames 0..t: run as one attention per frame), residual. On a band the keys and values of every
// band of each frame are gathered (queries stay local).
class AttnBlock : public Module {
 public:
  explicit AttnBlock(int64_t channels) : channels_(channels) {
    norm_ = child("norm", std::make_shared<RMSNorm>(channels));
    for (const char* name : {"to_q", "to_k", "to_v", "proj_out"}) {
      weights_.push_back(&param(std::string(name) + ".weight", {channels, channels, 1, 1, 1}));
      biases_.push_back(&param(std::string(name) + ".bias", {channels}));
    }
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), hh = x.size(3), ww = x.size(4);
    const int64_t n = hh * ww;  // tokens per frame (of this band)
    // [B, C, T, H, W] -> [B, T*H*W, C] in (frame, row, column) order.
    at::Tensor tokens = norm_->forward(x).permute({0, 2, 3, 4, 1}).reshape({b, t * n, c});
    at::Tensor q = project(0, tokens).unsqueeze(2);  // [B, S, 1, C]
    at::Tensor k = project(1, tokens);               // [B, S, C]
    at::Tensor v = project(2, tokens);
    int64_t nk = n;  // keys per frame
    if (band != nullptr) {
      k = band->ctx->gather_tokens(k.reshape({b * t, n, c}).contiguous());
      v = band->ctx->gather_tokens(v.reshape({b * t, n, c}).contiguous());
      nk = k.size(1);
      k = k.reshape({b, t * nk, c});
      v = v.reshape({b, t * nk, c});
    }
    k = k.unsqueeze(2);
    v = v.unsqueeze(2);
    backends::AttentionOptions opts;
    opts.scale = 1.0 / std::sqrt(static_cast<double>(c));
    std::vector<at::Tensor> outs;
    outs.reserve(t);
    for (int64_t f = 0; f < t; ++f) {
      outs.push_back(backends::attention(q.narrow(1, f * n, n), k.narrow(1, 0, (f + 1) * nk),
                                         v.narrow(1, 0, (f + 1) * nk), opts)
                         .out.squeeze(2));  // [B, n, C]
    }
    at::Tensor o = project(3, t == 1 ? outs[0] : at::cat(outs, 1));  // [B, S, C]
    return o.view({b, t, hh, ww, c}).permute({0, 4, 1, 2, 3}) + x;
  }

 private:
  at::Tensor project(size_t i, const at::Tensor& tokens) const {
    return at::linear(tokens, weights_[i]->value().view({channels_, channels_}),
                      biases_[i]->value());
  }

  int64_t channels_;
  std::shared_ptr<RMSNorm> norm_;
  std::vector<ParamSlot*> weights_, biases_;
};

// HunyuanVideo15MidBlock (num_layers 1, add_attention): resnets.0, attentions.0, resnets.1.
class MidBlock : public Module {
 public:
  explicit MidBlock(int64_t channels) {
    resnet0_ = child("resnets.0", std::make_shared<ResnetBlock>(channels, channels));
    attention_ = child("attentions.0", std::make_shared<AttnBlock>(channels));
    resnet1_ = child("resnets.1", std::make_shared<ResnetBlock>(channels, channels));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    return resnet1_->forward(attention_->forward(resnet0_->forward(x, band), band), band);
  }

 private:
  std::shared_ptr<ResnetBlock> resnet0_, resnet1_;
  std::shared_ptr<AttnBlock> attention_;
};

// HunyuanVideo15Downsample: conv to out/f channels packed by (rt, 2, 2), plus the packed input
// averaged over groups of f*in/out channels; with temporal resampling the first frame is packed
// in space only (its conv channels doubled, its shortcut groups halved).
class Downsample : public Module {
 public:
  Downsample(int64_t in, int64_t out, bool temporal) : out_(out), temporal_(temporal) {
    const int64_t factor = temporal ? 8 : 4;
    conv_ = child("conv", causal_conv(in, out / factor));
    group_size_ = factor * in / out;
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = conv_->forward(x);
    const int64_t t = x.size(2);
    if (!temporal_) return pack(h, 1, 2, 2) + group_mean(pack(x, 1, 2, 2), out_);
    at::Tensor h_first = pack(h.narrow(2, 0, 1), 1, 2, 2);
    h_first = at::cat({h_first, h_first}, 1);
    at::Tensor s_first = group_mean(pack(x.narrow(2, 0, 1), 1, 2, 2), out_);
    if (t == 1) return h_first + s_first;
    at::Tensor h_next = pack(h.narrow(2, 1, t - 1), 2, 2, 2);
    at::Tensor s_next = group_mean(pack(x.narrow(2, 1, t - 1), 2, 2, 2), out_);
    return at::cat({h_first, h_next}, 2) + at::cat({s_first, s_next}, 2);
  }

 private:
  int64_t out_, group_size_;
  bool temporal_;
  std::shared_ptr<Conv3d> conv_;
};

// HunyuanVideo15Upsample: conv to out*f channels unpacked by (rt, 2, 2), plus the unpacked input
// repeated f*out/in times per channel; with temporal upsampling the first frame is unpacked in
// space only (the first half of its channels; its shortcut repeated half as often). On a band
// every output row comes from one input row: the band's rows double.
class Upsample : public Module {
 public:
  Upsample(int64_t in, int64_t out, bool temporal) : temporal_(temporal) {
    const int64_t factor = temporal ? 8 : 4;
    conv_ = child("conv", causal_conv(in, out * factor));
    repeats_ = factor * out / in;
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = conv_->forward(x, band);
    const int64_t t = x.size(2);
    if (!temporal_) return unpack(h, 1, 2, 2) + unpack(x.repeat_interleave(repeats_, 1), 1, 2, 2);
    at::Tensor h_first = unpack(h.narrow(2, 0, 1), 1, 2, 2);
    h_first = h_first.narrow(1, 0, h_first.size(1) / 2);
    at::Tensor s_first = unpack(x.narrow(2, 0, 1), 1, 2, 2).repeat_interleave(repeats_ / 2, 1);
    if (t == 1) return h_first + s_first;
    at::Tensor h_next = unpack(h.narrow(2, 1, t - 1), 2, 2, 2);
    at::Tensor s_next = unpack(x.narrow(2, 1, t - 1), 2, 2, 2).repeat_interleave(repeats_, 1);
    return at::cat({h_first, h_next}, 2) + at::cat({s_first, s_next}, 2);
  }

 private:
  bool temporal_;
  int64_t repeats_;
  std::shared_ptr<Conv3d> conv_;
};

// HunyuanVideo15DownBlock3D / HunyuanVideo15UpBlock3D: `layers` resnets, then the resampler.
class DownBlock : public Module {
 public:
  DownBlock(int64_t in, int64_t out, int64_t layers, int64_t down_out, bool resample,
            bool temporal) {
    for (int64_t i = 0; i < layers; ++i) {
      resnets_.push_back(child("resnets." + std::to_string(i),
                               std::make_shared<ResnetBlock>(i == 0 ? in : out, out)));
    }
    if (resample) {
      downsampler_ = child("downsamplers.0", std::make_shared<Downsample>(out, down_out, temporal));
    }
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = x;
    for (const auto& r : resnets_) h = r->forward(h);
    return downsampler_ ? downsampler_->forward(h) : h;
  }

 private:
  std::vector<std::shared_ptr<ResnetBlock>> resnets_;
  std::shared_ptr<Downsample> downsampler_;
};

class UpBlock : public Module {
 public:
  UpBlock(int64_t in, int64_t out, int64_t layers, int64_t up_out, bool resample, bool temporal) {
    for (int64_t i = 0; i < layers; ++i) {
      resnets_.push_back(child("resnets." + std::to_string(i),
                               std::make_shared<ResnetBlock>(i == 0 ? in : out, out)));
    }
    if (resample) {
      upsampler_ = child("upsamplers.0", std::make_shared<Upsample>(out, up_out, temporal));
    }
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = x;
    for (const auto& r : resnets_) h = r->forward(h, band);
    return upsampler_ ? upsampler_->forward(h, band) : h;
  }

 private:
  std::vector<std::shared_ptr<ResnetBlock>> resnets_;
  std::shared_ptr<Upsample> upsampler_;
};

}  // namespace

// HunyuanVideo15Encoder3D: conv_in, down_blocks, mid_block, then conv_out(silu(norm_out(h))) plus
// h averaged over groups of boc[-1] / (2 * latent_channels) channels.
class HunyuanVideo15Encoder3D : public Module {
 public:
  explicit HunyuanVideo15Encoder3D(const HunyuanVideo15VAEConfig& c)
      : moments_(2 * c.latent_channels) {
    const auto& boc = c.block_out_channels;
    conv_in_ = child("conv_in", causal_conv(c.in_channels, boc[0]));
    int64_t in = boc[0];
    for (size_t i = 0; i < boc.size(); ++i) {
      const bool resample = c.down_spatial(i);
      down_blocks_.push_back(child(
          "down_blocks." + std::to_string(i),
          std::make_shared<DownBlock>(in, boc[i], c.layers_per_block, resample ? c.down_out(i) : 0,
                                      resample, c.down_temporal(i))));
      in = resample ? c.down_out(i) : boc[i];
    }
    mid_block_ = child("mid_block", std::make_shared<MidBlock>(boc.back()));
    norm_out_ = child("norm_out", std::make_shared<RMSNorm>(boc.back()));
    conv_out_ = child("conv_out", causal_conv(boc.back(), moments_));
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = conv_in_->forward(x);
    for (const auto& b : down_blocks_) h = b->forward(h);
    h = mid_block_->forward(h);
    at::Tensor shortcut = group_mean(h, moments_);
    return conv_out_->forward(at::silu(norm_out_->forward(h))) + shortcut;
  }

 private:
  int64_t moments_;
  std::shared_ptr<Conv3d> conv_in_, conv_out_;
  std::vector<std::shared_ptr<DownBlock>> down_blocks_;
  std::shared_ptr<MidBlock> mid_block_;
  std::shared_ptr<RMSNorm> norm_out_;
};

// HunyuanVideo15Decoder3D: conv_in(z) + z repeated boc[-1] / latent_channels times per channel,
// mid_block, up_blocks (layers_per_block + 1 resnets each), conv_out(silu(norm_out(h))).
class HunyuanVideo15Decoder3D : public Module {
 public:
  explicit HunyuanVideo15Decoder3D(const HunyuanVideo15VAEConfig& c) {
    const std::vector<int64_t> boc(c.block_out_channels.rbegin(), c.block_out_channels.rend());
    repeat_ = boc[0] / c.latent_channels;
    conv_in_ = child("conv_in", causal_conv(c.latent_channels, boc[0]));
    mid_block_ = child("mid_block", std::make_shared<MidBlock>(boc[0]));
    int64_t in = boc[0];
    for (size_t i = 0; i < boc.size(); ++i) {
      const bool resample = c.up_spatial(i) || c.up_temporal(i);
      up_blocks_.push_back(
          child("up_blocks." + std::to_string(i),
                std::make_shared<UpBlock>(in, boc[i], c.layers_per_block + 1,
                                          resample ? c.up_out(i) : 0, resample, c.up_temporal(i))));
      in = resample ? c.up_out(i) : boc[i];
    }
    norm_out_ = child("norm_out", std::make_shared<RMSNorm>(boc.back()));
    conv_out_ = child("conv_out", causal_conv(boc.back(), c.out_channels));
  }

  at::Tensor forward(const at::Tensor& z, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = conv_in_->forward(z, band) + z.repeat_interleave(repeat_, 1);
    h = mid_block_->forward(h, band);
    for (const auto& b : up_blocks_) h = b->forward(h, band);
    return conv_out_->forward(at::silu(norm_out_->forward(h)), band);
  }

  at::Tensor conv_in_weight() const { return conv_in_->weight(); }

 private:
  int64_t repeat_;
  std::shared_ptr<Conv3d> conv_in_, conv_out_;
  std::shared_ptr<MidBlock> mid_block_;
  std::vector<std::shared_ptr<UpBlock>> up_blocks_;
  std::shared_ptr<RMSNorm> norm_out_;
};

// ---------------------------------------------------------------------------------------------
// Config.

bool HunyuanVideo15VAEConfig::down_spatial(size_t block) const {
  return static_cast<int64_t>(block) < floor_log2(spatial_compression_ratio);
}

bool HunyuanVideo15VAEConfig::down_temporal(size_t block) const {
  return down_spatial(block) &&
         static_cast<int64_t>(block) >=
             floor_log2(spatial_compression_ratio / temporal_compression_ratio);
}

bool HunyuanVideo15VAEConfig::up_spatial(size_t block) const {
  return static_cast<int64_t>(block) < floor_log2(spatial_compression_ratio);
}

bool HunyuanVideo15VAEConfig::up_temporal(size_t block) const {
  return static_cast<int64_t>(block) < floor_log2(temporal_compression_ratio);
}

int64_t HunyuanVideo15VAEConfig::down_out(size_t block) const {
  return downsample_match_channel ? block_out_channels.at(block + 1) : block_out_channels[block];
}

int64_t HunyuanVideo15VAEConfig::up_out(size_t block) const {
  const size_t n = block_out_channels.size();
  // The decoder's widths are block_out_channels reversed.
  return upsample_match_channel ? block_out_channels.at(n - 2 - block)
                                : block_out_channels[n - 1 - block];
}

void HunyuanVideo15VAEConfig::validate(const std::string& where) const {
  XF_CHECK(in_channels > 0 && out_channels > 0 && latent_channels > 0, "config ", where,
           ": in_channels (", in_channels, "), out_channels (", out_channels,
           ") and latent_channels (", latent_channels, ") must be positive");
  XF_CHECK(!block_out_channels.empty(), "config ", where, ": block_out_channels is empty");
  for (int64_t c : block_out_channels) {
    XF_CHECK(c > 0, "config ", where, ": block_out_channels entry ", c, " is not positive");
  }
  XF_CHECK(layers_per_block >= 1, "config ", where, ": layers_per_block (", layers_per_block,
           ") must be at least 1");
  const int64_t n = static_cast<int64_t>(block_out_channels.size());
  XF_CHECK(is_power_of_two(spatial_compression_ratio) &&
               is_power_of_two(temporal_compression_ratio) &&
               temporal_compression_ratio <= spatial_compression_ratio,
           "config ", where, ": spatial_compression_ratio (", spatial_compression_ratio,
           ") and temporal_compression_ratio (", temporal_compression_ratio,
           ") must be powers of two, the temporal one at most the spatial one");
  // Every resampling block i takes its resampler's width from block i + 1 (match_channel).
  XF_CHECK(
      floor_log2(spatial_compression_ratio) < n, "config ", where, ": spatial_compression_ratio ",
      spatial_compression_ratio, " needs ", floor_log2(spatial_compression_ratio) + 1,
      " or more block_out_channels entries (one 2x resampler per block but the last), got ", n);
  const int64_t boc_last = block_out_channels.back();
  XF_CHECK(boc_last % (2 * latent_channels) == 0, "config ", where, ": block_out_channels[-1] (",
           boc_last, ") must be a multiple of 2 * latent_channels (", 2 * latent_channels,
           "): the encoder's shortcut averages channel groups into the moments");
  XF_CHECK(boc_last % latent_channels == 0, "config ", where, ": block_out_channels[-1] (",
           boc_last, ") must be a multiple of latent_channels (", latent_channels, ")");
  for (size_t i = 0; i < block_out_channels.size(); ++i) {
    const int64_t out = block_out_channels[i];
    if (!down_spatial(i)) continue;
    const int64_t to = down_out(i), factor = down_temporal(i) ? 8 : 4;
    const int64_t group = factor * out;  // the packed input's channels
    XF_CHECK(to % factor == 0 && group % to == 0 && (!down_temporal(i) || (group / to) % 2 == 0),
             "config ", where, ": encoder down block ", i, " (", out, " -> ", to,
             " channels, factor ", factor,
             ") cannot pack: the output width must divide by the factor and divide factor * ",
             "input width (an even number of times where it resamples time)");
  }
  const size_t nb = block_out_channels.size();
  for (size_t i = 0; i < nb; ++i) {
    if (!up_spatial(i) && !up_temporal(i)) continue;
    const int64_t from = block_out_channels[nb - 1 - i], to = up_out(i);
    const int64_t factor = up_temporal(i) ? 8 : 4;
    XF_CHECK(from % factor == 0 && (factor * to) % from == 0 &&
                 (!up_temporal(i) || ((factor * to) / from) % 2 == 0),
             "config ", where, ": decoder up block ", i, " (", from, " -> ", to,
             " channels, factor ", factor,
             ") cannot unpack: the input width must divide by the factor and divide factor * ",
             "output width (an even number of times where it resamples time)");
  }
}

HunyuanVideo15VAEConfig HunyuanVideo15VAEConfig::from_json(const nlohmann::json& j,
                                                           const std::string& path) {
  const std::string where = path.empty() ? std::string("(memory)") : path;
  XF_CHECK(j.is_object(), "config ", where, " is not a JSON object");
  HunyuanVideo15VAEConfig c;
  c.in_channels = cfg(j, "in_channels", c.in_channels, path);
  c.out_channels = cfg(j, "out_channels", c.out_channels, path);
  c.latent_channels = cfg(j, "latent_channels", c.latent_channels, path);
  c.block_out_channels = cfg(j, "block_out_channels", c.block_out_channels, path);
  c.layers_per_block = cfg(j, "layers_per_block", c.layers_per_block, path);
  c.spatial_compression_ratio =
      cfg(j, "spatial_compression_ratio", c.spatial_compression_ratio, path);
  c.temporal_compression_ratio =
      cfg(j, "temporal_compression_ratio", c.temporal_compression_ratio, path);
  c.downsample_match_channel = cfg(j, "downsample_match_channel", c.downsample_match_channel, path);
  c.upsample_match_channel = cfg(j, "upsample_match_channel", c.upsample_match_channel, path);
  c.scaling_factor = cfg(j, "scaling_factor", c.scaling_factor, path);
  c.validate(where);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Model.

at::Tensor HunyuanVideo15Posterior::sample(c10::optional<at::Generator> generator) const {
  return mean + std * at::randn(mean.sizes(), generator, mean.options());
}

AutoencoderKLHunyuanVideo15::AutoencoderKLHunyuanVideo15(HunyuanVideo15VAEConfig config)
    : config_(std::move(config)) {
  config_.validate("AutoencoderKLHunyuanVideo15");
  encoder_ = child("encoder", std::make_shared<HunyuanVideo15Encoder3D>(config_));
  decoder_ = child("decoder", std::make_shared<HunyuanVideo15Decoder3D>(config_));
  tiling_.tile_latent_min_height = tiling_.tile_sample_min_height / spatial_scale();
  tiling_.tile_latent_min_width = tiling_.tile_sample_min_width / spatial_scale();
}

AutoencoderKLHunyuanVideo15::~AutoencoderKLHunyuanVideo15() = default;

c10::ScalarType AutoencoderKLHunyuanVideo15::dtype() const {
  const at::Tensor& w = decoder_->conv_in_weight();
  XF_CHECK(w.defined(), "AutoencoderKLHunyuanVideo15 used before its weights were loaded");
  return w.scalar_type();
}

void AutoencoderKLHunyuanVideo15::set_tiling(const HunyuanVideo15VAETiling& t) {
  const double f = t.tile_overlap_factor;
  XF_CHECK(f >= 0.0 && f < 1.0, "AutoencoderKLHunyuanVideo15 tiling: tile_overlap_factor (", f,
           ") must be in [0, 1)");
  const std::vector<std::pair<const char*, int64_t>> sizes = {
      {"tile_sample_min_height", t.tile_sample_min_height},
      {"tile_sample_min_width", t.tile_sample_min_width},
      {"tile_latent_min_height", t.tile_latent_min_height},
      {"tile_latent_min_width", t.tile_latent_min_width}};
  for (const auto& [name, v] : sizes) {
    XF_CHECK(v > 0 && static_cast<int64_t>(static_cast<double>(v) * (1.0 - f)) >= 1,
             "AutoencoderKLHunyuanVideo15 tiling: ", name, " (", v,
             ") must be positive and leave a stride int(", name, " * (1 - tile_overlap_factor ", f,
             ")) of at least 1");
  }
  tiling_ = t;
}

void AutoencoderKLHunyuanVideo15::check_video(const std::string& what, const at::Tensor& x) const {
  vae::check_video_input("AutoencoderKLHunyuanVideo15", what, x, config_.in_channels,
                         config_.temporal_compression_ratio);
}

void AutoencoderKLHunyuanVideo15::check_latent(const std::string& what, const at::Tensor& z) const {
  vae::check_video_latent("AutoencoderKLHunyuanVideo15", what, z, config_.latent_channels);
}

// --- encode ------------------------------------------------------------------------------------

// diffusers' _encode: the moments [B, 2 * latent_channels, 1+k, H/s, W/s].
at::Tensor AutoencoderKLHunyuanVideo15::encode_one(const at::Tensor& x) const {
  const auto& t = tiling_;
  if (t.use_tiling &&
      (x.size(4) > t.tile_sample_min_width || x.size(3) > t.tile_sample_min_height)) {
    return tiled_encode(x);
  }
  const int64_t s = spatial_scale();
  XF_CHECK(x.size(3) % s == 0 && x.size(4) % s == 0, "AutoencoderKLHunyuanVideo15: encode needs ",
           "a height and width that are multiples of spatial_compression_ratio ", s, ", got ",
           x.size(3), " x ", x.size(4),
           t.use_tiling ? " (a tile of the tiled encode: pick tile sizes and strides that are "
                          "multiples of it)"
                        : "");
  return encoder_->forward(x);
}

at::Tensor AutoencoderKLHunyuanVideo15::tiled_encode(const at::Tensor& x) const {
  const auto& t = tiling_;
  const int64_t height = x.size(3), width = x.size(4);
  const double f = t.tile_overlap_factor;
  const auto overlap_h =
      static_cast<int64_t>(static_cast<double>(t.tile_sample_min_height) * (1 - f));
  const auto overlap_w =
      static_cast<int64_t>(static_cast<double>(t.tile_sample_min_width) * (1 - f));
  const auto blend_h = static_cast<int64_t>(static_cast<double>(t.tile_latent_min_height) * f);
  const auto blend_w = static_cast<int64_t>(static_cast<double>(t.tile_latent_min_width) * f);
  const int64_t limit_h = t.tile_latent_min_height - blend_h;
  const int64_t limit_w = t.tile_latent_min_width - blend_w;

  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < height; i += overlap_h) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < width; j += overlap_w) {
      at::Tensor tile =
          slice(slice(x, 3, i, t.tile_sample_min_height), 4, j, t.tile_sample_min_width);
      const int64_t s = spatial_scale();
      XF_CHECK(tile.size(3) % s == 0 && tile.size(4) % s == 0,
               "AutoencoderKLHunyuanVideo15 tiled encode: the tile at rows ", i, ", columns ", j,
               " is ", tile.size(3), " x ", tile.size(4),
               " pixels, not a multiple of spatial_compression_ratio ", s,
               " (pick tile sizes, strides and a picture size that are multiples of it)");
      row.push_back(encoder_->forward(tile));
    }
    rows.push_back(std::move(row));
  }
  std::vector<at::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, 3, blend_h);
      if (j > 0) blend(rows[i][j - 1], tile, 4, blend_w);
      result_row.push_back(slice(slice(tile, 3, 0, limit_h), 4, 0, limit_w));
    }
    result_rows.push_back(at::cat(result_row, 4));
  }
  return at::cat(result_rows, 3);
}

HunyuanVideo15Posterior AutoencoderKLHunyuanVideo15::encode(const at::Tensor& x) const {
  XF_CONTEXT("AutoencoderKLHunyuanVideo15.encode");
  check_video("input video", x);
  at::Tensor xi = x.to(dtype());
  at::Tensor moments;
  if (use_slicing_ && xi.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : xi.split(1)) parts.push_back(encode_one(s));
    moments = at::cat(parts);
  } else {
    moments = encode_one(xi);
  }
  const int64_t l = config_.latent_channels;
  HunyuanVideo15Posterior p;
  p.mean = moments.narrow(1, 0, l);
  at::Tensor logvar = moments.narrow(1, l, l);
  const c10::ScalarType dt = logvar.scalar_type();
  at::Tensor lf = logvar.to(at::kFloat).clamp(-30.0, 20.0);
  p.logvar = lf.to(dt);
  p.std = at::exp(0.5 * lf).to(dt);
  return p;
}

// --- decode ------------------------------------------------------------------------------------

// diffusers' _decode.
at::Tensor AutoencoderKLHunyuanVideo15::decode_one(const at::Tensor& z,
                                                   const HunyuanVideoBand* band) const {
  const auto& t = tiling_;
  if (t.use_tiling &&
      (z.size(4) > t.tile_latent_min_width || z.size(3) > t.tile_latent_min_height)) {
    XF_CHECK(band == nullptr,
             "AutoencoderKLHunyuanVideo15: spatial tiling (enable_tiling / --enable_tiling) cannot "
             "be combined with the patch-parallel decode (--use_parallel_vae)");
    return tiled_decode(z);
  }
  return decoder_->forward(z, band);
}

at::Tensor AutoencoderKLHunyuanVideo15::tiled_decode(const at::Tensor& z) const {
  const auto& t = tiling_;
  const int64_t height = z.size(3), width = z.size(4);
  const double f = t.tile_overlap_factor;
  const auto overlap_h =
      static_cast<int64_t>(static_cast<double>(t.tile_latent_min_height) * (1 - f));
  const auto overlap_w =
      static_cast<int64_t>(static_cast<double>(t.tile_latent_min_width) * (1 - f));
  const auto blend_h = static_cast<int64_t>(static_cast<double>(t.tile_sample_min_height) * f);
  const auto blend_w = static_cast<int64_t>(static_cast<double>(t.tile_sample_min_width) * f);
  const int64_t limit_h = t.tile_sample_min_height - blend_h;
  const int64_t limit_w = t.tile_sample_min_width - blend_w;

  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < height; i += overlap_h) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < width; j += overlap_w) {
      row.push_back(decoder_->forward(
          slice(slice(z, 3, i, t.tile_latent_min_height), 4, j, t.tile_latent_min_width)));
    }
    rows.push_back(std::move(row));
  }
  std::vector<at::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, 3, blend_h);
      if (j > 0) blend(rows[i][j - 1], tile, 4, blend_w);
      result_row.push_back(slice(slice(tile, 3, 0, limit_h), 4, 0, limit_w));
    }
    result_rows.push_back(at::cat(result_row, 4));
  }
  return at::cat(result_rows, 3);
}

at::Tensor AutoencoderKLHunyuanVideo15::decode(const at::Tensor& z) const {
  return decode(z, nullptr);
}

at::Tensor AutoencoderKLHunyuanVideo15::decode(const at::Tensor& z,
                                               const HunyuanVideoBand* band) const {
  XF_CONTEXT("AutoencoderKLHunyuanVideo15.decode");
  check_latent("latent z", z);
  XF_CHECK(band == nullptr || band->ctx != nullptr,
           "AutoencoderKLHunyuanVideo15: a band decode needs a SpatialContext");
  at::Tensor zi = z.to(dtype());
  if (use_slicing_ && zi.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : zi.split(1)) parts.push_back(decode_one(s, band));
    return at::cat(parts);
  }
  return decode_one(zi, band);
}

// --- call --------------------------------------------------------------------------------------

uint64_t AutoencoderKLHunyuanVideo15::activation_bytes(const ActivationQuery& q) const {
  if (q.method == "encode") {
    // The encoder's first level: block_out_channels[0] channels at full resolution.
    const int64_t c0 = config_.block_out_channels.front();
    return vae::decoder_peak_bytes(static_cast<uint64_t>(q.batch * q.frames * q.height * q.width),
                                   c0, 5.0 * q.bytes + 9.0, c0, (q.frames + 2) * (q.height + 2),
                                   q.batch, q.cpu);
  }
  if (q.method != "decode") return 0;
  // Every frame at once, spatial tiles with tiling; the decoder's levels as
  // HunyuanVideo15Decoder3D builds them (measured: bench/run_plan_check).
  int64_t h = q.height, w = q.width;
  if (q.tiled) {
    h = std::min(h, tiling_.tile_sample_min_height);
    w = std::min(w, tiling_.tile_sample_min_width);
  }
  const auto& c = config_;
  const std::vector<int64_t> reversed(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  int64_t t = (q.frames - 1) / c.temporal_compression_ratio + 1;
  int64_t y = h / c.spatial_compression_ratio, x = w / c.spatial_compression_ratio;
  std::vector<vae::DecoderLevel> levels;
  int64_t in = reversed[0];
  for (size_t i = 0; i < reversed.size(); ++i) {
    levels.push_back({in, reversed[i], t, y, x});
    in = reversed[i];
    if (!c.up_spatial(i) && !c.up_temporal(i)) continue;
    if (c.up_temporal(i)) t = 1 + 2 * (t - 1);  // the first frame stays alone
    if (c.up_spatial(i)) {
      y *= 2;
      x *= 2;
    }
    in = c.up_out(i);
    levels.push_back({in, in, t, y, x});
  }
  return vae::decoder_levels_peak_bytes(levels, 5.0 * q.bytes + 9.0, q.batch, q.cpu);
}

TensorMap AutoencoderKLHunyuanVideo15::call(const std::string& method, const TensorMap& inputs) {
  XF_CONTEXT("AutoencoderKLHunyuanVideo15.", method);
  c10::InferenceMode guard;
  XF_CHECK(method == "decode" || method == "encode" || method == "forward",
           "AutoencoderKLHunyuanVideo15 has no method '", method,
           "' (known: forward, encode, decode)");
  const std::string input_name = method == "decode" ? "z" : "sample";
  for (const auto& [name, tensor] : inputs) {
    XF_CHECK(name == input_name, "AutoencoderKLHunyuanVideo15.", method, ": unknown input '", name,
             "' (accepted: ", input_name, ")");
  }
  auto it = inputs.find(input_name);
  XF_CHECK(it != inputs.end(), "AutoencoderKLHunyuanVideo15.", method, ": missing input '",
           input_name, "'");
  if (method == "decode") return {{"sample", decode(it->second)}};
  HunyuanVideo15Posterior post = encode(it->second);
  if (method == "encode") {
    return {{"latent_dist_mean", post.mean}, {"latent_dist_std", post.std}, {"sample", post.mean}};
  }
  return {{"sample", decode(post.mean)}};
}

void register_hunyuan_video15_vae_components() {
  static std::once_flag once;
  std::call_once(once, [] {
    ComponentRegistry::add("AutoencoderKLHunyuanVideo15",
                           [](const nlohmann::json& config, const std::string& config_path) {
                             return std::make_shared<AutoencoderKLHunyuanVideo15>(
                                 HunyuanVideo15VAEConfig::from_json(config, config_path));
                           });
  });
}

}  // namespace xfuser::models::hunyuan_video15
