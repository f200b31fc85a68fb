#include "models/hunyuan_video/hunyuan_video_vae.h"

#include <algorithm>
#include <cmath>
#include <tuple>

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

namespace xfuser::models::hunyuan_video {

using vae::Activation;
using vae::apply_activation;
using vae::GroupNorm;
using vae::Linear;

namespace {

constexpr double kEps = 1e-6;  // resnet_eps and every GroupNorm's eps
const char* const kDownBlock = "HunyuanVideoDownBlock3D";
const char* const kUpBlock = "HunyuanVideoUpBlock3D";

// libtorch 1.13's CPU kernels have no fp16 convolution or replication padding, and its bf16 CPU
// conv3d loses far more than torch 2.x's (see wan_vae.cpp): on the CPU, the 3D convolutions (and
// their padding) of fp16/bf16 tensors run in fp32 and round back, so activations still travel
// between ops in the model dtype.
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

// nn.GroupNorm on [B, C, T, H, W]: the statistics span every frame (as diffusers' 5D GroupNorm);
// on a band, over every band's rows (the context all-reduces the moments).
at::Tensor group_norm_5d(const GroupNorm& norm, const at::Tensor& x,
                         const HunyuanVideoBand* band = nullptr) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  return norm.forward(x.reshape({b, c, t * h, w}), band ? band->ctx : nullptr)
      .view({b, c, t, h, w});
}

// x [B, C, T, h, W] (a band) -> [B, C, T, h + 2p, W]: p halo rows from the neighbouring bands,
// or the edge row repeated where the band touches the picture's top / bottom (replicate padding).
at::Tensor pad_band_rows(const at::Tensor& x, int64_t p, const HunyuanVideoBand& band) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor padded =
      band.ctx->pad_rows(x.reshape({b, c * t, h, w}), p).view({b, c, t, h + 2 * p, w});
  at::Tensor above = band.top ? x.narrow(3, 0, 1).expand({b, c, t, p, w}) : padded.narrow(3, 0, p);
  at::Tensor below =
      band.bottom ? x.narrow(3, h - 1, 1).expand({b, c, t, p, w}) : padded.narrow(3, p + h, p);
  return at::cat({above, x, below}, 3);
}

// diffusers' nearest F.interpolate by integer factors (an exact copy: out[i] = in[i / f]).
at::Tensor nearest(const at::Tensor& x, int64_t ft, int64_t fs) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  if (ft == 1 && fs == 1) return x;
  return x.view({b, c, t, 1, h, 1, w, 1})
      .expand({b, c, t, ft, h, fs, w, fs})
      .reshape({b, c, t * ft, h * fs, w * fs});
}

using vae::blend;  // models/vae/tile_blend.h
using vae::slice;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layers.

// nn.Conv3d with bias: `prefix` + "weight" [out, in, kt, kh, kw] and + "bias" [out]. No padding of
// its own (the causal convolution pads first, the quant convs are 1x1x1).
class HunyuanVideoConv3d : public Module {
 public:
  HunyuanVideoConv3d(int64_t in, int64_t out, int64_t kernel, std::vector<int64_t> stride,
                     const std::string& prefix)
      : in_(in), kernel_(kernel), stride_(std::move(stride)) {
    weight_ = &param(prefix + "weight", {out, in, kernel, kernel, kernel});
    bias_ = &param(prefix + "bias", {out});
  }

  // x [B, in, T, H, W]; with `causal`, diffusers' HunyuanVideoCausalConv3d: F.pad(x,
  // (k/2, k/2, k/2, k/2, k-1, 0), mode="replicate") first.
  at::Tensor forward(const at::Tensor& x, bool causal,
                     const HunyuanVideoBand* band = nullptr) const {
    XF_CHECK(weight_->loaded(), "HunyuanVideoCausalConv3d used before its weights were loaded");
    XF_CHECK(x.dim() == 5 && x.size(1) == in_, "HunyuanVideoCausalConv3d expects [B, ", in_,
             ", T, H, W], got ", shape_string(x.sizes()));
    const bool up = needs_upcast(x);
    at::Tensor h = up ? x.to(at::kFloat) : x;
    if (causal && kernel_ > 1) {
      const int64_t p = kernel_ / 2;
      if (band == nullptr) {
        h = at::replication_pad3d(h, {p, p, p, p, kernel_ - 1, 0});
      } else {
        // Rows first (halo, or replicated at the picture's edge), then W and the causal frames
        // replicated: the same corners as one replication_pad3d of the whole picture.
        h = at::replication_pad3d(pad_band_rows(h, p, *band), {p, p, 0, 0, kernel_ - 1, 0});
      }
    }
    at::Tensor w = up ? weight_->value().to(at::kFloat) : weight_->value();
    at::Tensor b = up ? bias_->value().to(at::kFloat) : bias_->value();
    at::Tensor y = backends::conv3d(h, w, b, stride_, {0, 0, 0});
    return up ? y.to(x.scalar_type()) : y;
  }

  at::Tensor weight() const { return weight_->value(); }

 private:
  int64_t in_, kernel_;
  std::vector<int64_t> stride_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

namespace {

std::shared_ptr<HunyuanVideoConv3d> causal_conv(int64_t in, int64_t out, int64_t kernel,
                                                std::vector<int64_t> stride = {1, 1, 1}) {
  // HunyuanVideoCausalConv3d wraps its nn.Conv3d as `.conv`.
  return std::make_shared<HunyuanVideoConv3d>(in, out, kernel, std::move(stride), "conv.");
}

// HunyuanVideoResnetBlockCausal3D: shortcut(x) + conv2(act(norm2(conv1(act(norm1(x)))))).
class ResnetBlockCausal3D : public Module {
 public:
  ResnetBlockCausal3D(int64_t in, int64_t out, int64_t groups, Activation act) : act_(act) {
    norm1_ = child("norm1", std::make_shared<GroupNorm>(groups, in, kEps));
    conv1_ = child("conv1", causal_conv(in, out, 3));
    norm2_ = child("norm2", std::make_shared<GroupNorm>(groups, out, kEps));
    conv2_ = child("conv2", causal_conv(out, out, 3));
    if (in != out) conv_shortcut_ = child("conv_shortcut", causal_conv(in, out, 1));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = apply_activation(group_norm_5d(*norm1_, x, band), act_);
    h = conv1_->forward(h, true, band);
    h = apply_activation(group_norm_5d(*norm2_, h, band), act_);  // dropout: identity
    h = conv2_->forward(h, true, band);
    return h + (conv_shortcut_ ? conv_shortcut_->forward(x, true) : x);  // 1x1x1: no halo
  }

 private:
  Activation act_;
  std::shared_ptr<GroupNorm> norm1_, norm2_;
  std::shared_ptr<HunyuanVideoConv3d> conv1_, conv2_, conv_shortcut_;
};

// The mid-block Attention (_from_deprecated_attn_block, heads = 1, dim_head = C): group_norm over
// all T*H*W tokens, to_q / to_k / to_v / to_out.0, residual; the causal frame mask.
class CausalFrameAttention : public Module {
 public:
  CausalFrameAttention(int64_t channels, int64_t groups) : channels_(channels) {
    group_norm_ = child("group_norm", std::make_shared<GroupNorm>(groups, channels, kEps));
    to_q_ = child("to_q", std::make_shared<Linear>(channels, channels));
    to_k_ = child("to_k", std::make_shared<Linear>(channels, channels));
    to_v_ = child("to_v", std::make_shared<Linear>(channels, channels));
    to_out_ = child("to_out.0", std::make_shared<Linear>(channels, channels));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), hh = x.size(3), ww = x.size(4);
    const int64_t n = hh * ww;  // tokens per frame (of this band)
    // [B, C, T, H, W] -> [B, T*H*W, C] in (frame, row, column) order.
    at::Tensor tokens =
        group_norm_5d(*group_norm_, x, band).permute({0, 2, 3, 4, 1}).reshape({b, t * n, c});
    at::Tensor q = to_q_->forward(tokens).unsqueeze(2);  // [B, S, 1, C]
    at::Tensor k = to_k_->forward(tokens);               // [B, S, C]
    at::Tensor v = to_v_->forward(tokens);
    int64_t nk = n;  // keys per frame
    if (band != nullptr) {
      // Every band's keys / values of each frame: [B*T, n_r, C] -> [B*T, N, C] -> [B, T*N, C].
      k = band->ctx->gather_tokens(k.reshape({b * t, n, c}).contiguous());
      v = band->ctx->gather_tokens(v.reshape({b * t, n, c}).contiguous());
      nk = k.size(1);
      k = k.reshape({b, t * nk, c});
      v = v.reshape({b, t * nk, c});
    }
    k = k.unsqueeze(2);  // [B, S, 1, C]
    v = v.unsqueeze(2);
    backends::AttentionOptions opts;
    opts.scale = 1.0 / std::sqrt(static_cast<double>(c));
    // prepare_causal_attention_mask: frame f's queries see the keys of frames 0..f.
    std::vector<at::Tensor> outs;
    outs.reserve(t);
    for (int64_t f = 0; f < t; ++f) {
      outs.push_back(backends::attention(q.narrow(1, f * n, n), k.narrow(1, 0, (f + 1) * nk),
                                         v.narrow(1, 0, (f + 1) * nk), opts)
                         .out.squeeze(2));  // [B, n, C]
    }
    at::Tensor o = to_out_->forward(t == 1 ? outs[0] : at::cat(outs, 1));  // [B, S, C]
    o = o.view({b, t, hh, ww, c}).permute({0, 4, 1, 2, 3});
    return o + x;  // residual_connection, rescale_output_factor 1
  }

 private:
  int64_t channels_;
  std::shared_ptr<GroupNorm> group_norm_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, to_out_;
};

// HunyuanVideoMidBlock3D (num_layers 1): resnets.0, attentions.0 (optional), resnets.1.
class MidBlock3D : public Module {
 public:
  MidBlock3D(int64_t channels, int64_t groups, Activation act, bool add_attention) {
    resnet0_ =
        child("resnets.0", std::make_shared<ResnetBlockCausal3D>(channels, channels, groups, act));
    if (add_attention) {
      attention_ = child("attentions.0", std::make_shared<CausalFrameAttention>(channels, groups));
    }
    resnet1_ =
        child("resnets.1", std::make_shared<ResnetBlockCausal3D>(channels, channels, groups, act));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = resnet0_->forward(x, band);
    if (attention_) h = attention_->forward(h, band);
    return resnet1_->forward(h, band);
  }

 private:
  std::shared_ptr<ResnetBlockCausal3D> resnet0_, resnet1_;
  std::shared_ptr<CausalFrameAttention> attention_;
};

// HunyuanVideoUpsampleCausal3D: the first frame nearest x (1, fs, fs), the others (ft, fs, fs),
// then a causal 3x3x3 convolution.
class UpsampleCausal3D : public Module {
 public:
  UpsampleCausal3D(int64_t channels, int64_t ft, int64_t fs) : ft_(ft), fs_(fs) {
    conv_ = child("conv", causal_conv(channels, channels, 3));
  }

  // On a band the nearest upsampling doubles the band's rows, so bands stay aligned.
  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    const int64_t t = x.size(2);
    at::Tensor first = nearest(x.narrow(2, 0, 1), 1, fs_);
    at::Tensor h = t > 1 ? at::cat({first, nearest(x.narrow(2, 1, t - 1), ft_, fs_)}, 2) : first;
    return conv_->forward(h, true, band);
  }

 private:
  int64_t ft_, fs_;
  std::shared_ptr<HunyuanVideoConv3d> conv_;
};

// HunyuanVideoDownBlock3D / HunyuanVideoUpBlock3D: `layers` resnets, then the resampler.
class DownBlock3D : public Module {
 public:
  DownBlock3D(int64_t in, int64_t out, int64_t layers, int64_t groups, Activation act, int64_t st,
              int64_t ss) {
    for (int64_t i = 0; i < layers; ++i) {
      resnets_.push_back(
          child("resnets." + std::to_string(i),
                std::make_shared<ResnetBlockCausal3D>(i == 0 ? in : out, out, groups, act)));
    }
    // HunyuanVideoDownsampleCausal3D wraps a HunyuanVideoCausalConv3d as `.conv`.
    if (st > 1 || ss > 1)
      downsampler_ = child("downsamplers.0.conv", causal_conv(out, out, 3, {st, ss, ss}));
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = x;
    for (const auto& r : resnets_) h = r->forward(h);
    return downsampler_ ? downsampler_->forward(h, true) : h;
  }

 private:
  std::vector<std::shared_ptr<ResnetBlockCausal3D>> resnets_;
  std::shared_ptr<HunyuanVideoConv3d> downsampler_;
};

class UpBlock3D : public Module {
 public:
  UpBlock3D(int64_t in, int64_t out, int64_t layers, int64_t groups, Activation act, int64_t ft,
            int64_t fs) {
    for (int64_t i = 0; i < layers; ++i) {
      resnets_.push_back(
          child("resnets." + std::to_string(i),
                std::make_shared<ResnetBlockCausal3D>(i == 0 ? in : out, out, groups, act)));
    }
    if (ft > 1 || fs > 1)
      upsampler_ = child("upsamplers.0", std::make_shared<UpsampleCausal3D>(out, ft, fs));
  }

  at::Tensor forward(const at::Tensor& x, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = x;
    for (const auto& r : resnets_) h = r->forward(h, band);
    return upsampler_ ? upsampler_->forward(h, band) : h;
  }

 private:
  std::vector<std::shared_ptr<ResnetBlockCausal3D>> resnets_;
  std::shared_ptr<UpsampleCausal3D> upsampler_;
};

}  // namespace

// HunyuanVideoEncoder3D (double_z): conv_in, down_blocks, mid_block, conv_norm_out, SiLU, conv_out
// to 2 * latent_channels.
class HunyuanVideoEncoder3D : public Module {
 public:
  explicit HunyuanVideoEncoder3D(const HunyuanVideoVAEConfig& c) {
    const auto& boc = c.block_out_channels;
    const Activation act = vae::activation_from_name(c.act_fn);
    conv_in_ = child("conv_in", causal_conv(c.in_channels, boc[0], 3));
    int64_t out = boc[0];
    for (size_t i = 0; i < boc.size(); ++i) {
      const int64_t in = out;
      out = boc[i];
      down_blocks_.push_back(
          child("down_blocks." + std::to_string(i),
                std::make_shared<DownBlock3D>(in, out, c.layers_per_block, c.norm_num_groups, act,
                                              c.temporal_resample(i) ? 2 : 1,
                                              c.spatial_resample(i) ? 2 : 1)));
    }
    mid_block_ = child("mid_block", std::make_shared<MidBlock3D>(boc.back(), c.norm_num_groups, act,
                                                                 c.mid_block_add_attention));
    conv_norm_out_ =
        child("conv_norm_out", std::make_shared<GroupNorm>(c.norm_num_groups, boc.back(), kEps));
    conv_out_ = child("conv_out", causal_conv(boc.back(), 2 * c.latent_channels, 3));
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = conv_in_->forward(x, true);
    for (const auto& b : down_blocks_) h = b->forward(h);
    h = mid_block_->forward(h);
    h = apply_activation(group_norm_5d(*conv_norm_out_, h), Activation::kSilu);  // conv_act
    return conv_out_->forward(h, true);
  }

 private:
  std::shared_ptr<HunyuanVideoConv3d> conv_in_, conv_out_;
  std::vector<std::shared_ptr<DownBlock3D>> down_blocks_;
  std::shared_ptr<MidBlock3D> mid_block_;
  std::shared_ptr<GroupNorm> conv_norm_out_;
};

// HunyuanVideoDecoder3D: conv_in, mid_block, up_blocks (layers_per_block + 1 resnets each),
// conv_norm_out, SiLU, conv_out.
class HunyuanVideoDecoder3D : public Module {
 public:
  explicit HunyuanVideoDecoder3D(const HunyuanVideoVAEConfig& c) {
    const auto& boc = c.block_out_channels;
    const Activation act = vae::activation_from_name(c.act_fn);
    conv_in_ = child("conv_in", causal_conv(c.latent_channels, boc.back(), 3));
    mid_block_ = child("mid_block", std::make_shared<MidBlock3D>(boc.back(), c.norm_num_groups, act,
                                                                 c.mid_block_add_attention));
    const std::vector<int64_t> reversed(boc.rbegin(), boc.rend());
    int64_t out = reversed[0];
    for (size_t i = 0; i < reversed.size(); ++i) {
      const int64_t in = out;
      out = reversed[i];
      up_blocks_.push_back(
          child("up_blocks." + std::to_string(i),
                std::make_shared<UpBlock3D>(in, out, c.layers_per_block + 1, c.norm_num_groups, act,
                                            c.temporal_resample(i) ? 2 : 1,
                                            c.spatial_resample(i) ? 2 : 1)));
    }
    conv_norm_out_ =
        child("conv_norm_out", std::make_shared<GroupNorm>(c.norm_num_groups, boc[0], kEps));
    conv_out_ = child("conv_out", causal_conv(boc[0], c.out_channels, 3));
  }

  at::Tensor forward(const at::Tensor& z, const HunyuanVideoBand* band = nullptr) const {
    at::Tensor h = conv_in_->forward(z, true, band);
    h = mid_block_->forward(h, band);
    for (const auto& b : up_blocks_) h = b->forward(h, band);
    h = apply_activation(group_norm_5d(*conv_norm_out_, h, band), Activation::kSilu);  // conv_act
    return conv_out_->forward(h, true, band);
  }

  at::Tensor conv_in_weight() const { return conv_in_->weight(); }

 private:
  std::shared_ptr<HunyuanVideoConv3d> conv_in_, conv_out_;
  std::shared_ptr<MidBlock3D> mid_block_;
  std::vector<std::shared_ptr<UpBlock3D>> up_blocks_;
  std::shared_ptr<GroupNorm> conv_norm_out_;
};

// ---------------------------------------------------------------------------------------------
// Config.

bool HunyuanVideoVAEConfig::spatial_resample(size_t block) const {
  return static_cast<int64_t>(block) < floor_log2(spatial_compression_ratio);
}

bool HunyuanVideoVAEConfig::temporal_resample(size_t block) const {
  // temporal_compression_ratio 4 (the only one the decoder accepts): the two blocks before the
  // last.
  const int64_t n = static_cast<int64_t>(block_out_channels.size());
  const int64_t i = static_cast<int64_t>(block);
  return i >= n - 1 - floor_log2(temporal_compression_ratio) && i != n - 1;
}

void HunyuanVideoVAEConfig::validate(const std::string& where) const {
  XF_CHECK(in_channels > 0 && out_channels > 0 && latent_channels > 0, "config ", where,
           ": in_channels (", in_channels, "), out_channels (", out_channels,
           ") and latent_channels (", latent_channels, ") must be positive");
  XF_CHECK(!block_out_channels.empty(), "config ", where, ": block_out_channels is empty");
  const size_t n = block_out_channels.size();
  XF_CHECK(down_block_types.size() == n && up_block_types.size() == n, "config ", where,
           ": down_block_types (", down_block_types.size(), " entries) and up_block_types (",
           up_block_types.size(), ") need one entry per block_out_channels entry (", n, ")");
  for (const auto& t : down_block_types) {
    XF_CHECK(t == kDownBlock, "config ", where, ": unsupported down_block_type '", t,
             "' (AutoencoderKLHunyuanVideo knows only ", kDownBlock, ")");
  }
  for (const auto& t : up_block_types) {
    XF_CHECK(t == kUpBlock, "config ", where, ": unsupported up_block_type '", t,
             "' (AutoencoderKLHunyuanVideo knows only ", kUpBlock, ")");
  }
  XF_CHECK(layers_per_block >= 1, "config ", where, ": layers_per_block (", layers_per_block,
           ") must be at least 1");
  XF_CHECK(norm_num_groups > 0, "config ", where, ": norm_num_groups (", norm_num_groups,
           ") must be positive");
  for (int64_t c : block_out_channels) {
    XF_CHECK(c > 0 && c % norm_num_groups == 0, "config ", where, ": block_out_channels entry ", c,
             " is not a positive multiple of norm_num_groups (", norm_num_groups, ")");
  }
  // diffusers' get_activation names (ACT2CLS).
  const std::vector<std::string> acts = {"silu", "swish", "mish", "gelu", "relu"};
  XF_CHECK(std::find(acts.begin(), acts.end(), act_fn) != acts.end(), "config ", where,
           ": unsupported act_fn '", act_fn, "' (known: silu, swish, mish, gelu, relu)");
  XF_CHECK(temporal_compression_ratio == 4, "config ", where, ": temporal_compression_ratio ",
           temporal_compression_ratio,
           " is not supported (diffusers' HunyuanVideoDecoder3D accepts only 4)");
  XF_CHECK(is_power_of_two(spatial_compression_ratio) &&
               floor_log2(spatial_compression_ratio) <= static_cast<int64_t>(n),
           "config ", where, ": spatial_compression_ratio ", spatial_compression_ratio,
           " must be a power of two of at most 2^", n,
           " (one 2x downsampler per block, len(block_out_channels) = ", n, ")");
  int64_t temporal = 0;
  for (size_t i = 0; i < n; ++i) temporal += temporal_resample(i) ? 1 : 0;
  XF_CHECK(temporal == 2, "config ", where, ": ", n, " blocks give only ", temporal,
           " temporal downsamplers (diffusers places them on the two blocks before the last); "
           "temporal_compression_ratio 4 needs at least 3 blocks");
}

HunyuanVideoVAEConfig HunyuanVideoVAEConfig::from_json(const nlohmann::json& j,
                                                       const std::string& path) {
  const std::string where = path.empty() ? std::string("(memory)") : path;
  XF_CHECK(j.is_object(), "config ", where, " is not a JSON object");
  HunyuanVideoVAEConfig c;
  c.in_channels = cfg(j, "in_channels", c.in_channels, path);
  c.out_channels = cfg(j, "out_channels", c.out_channels, path);
  c.latent_channels = cfg(j, "latent_channels", c.latent_channels, path);
  c.down_block_types = cfg(j, "down_block_types", c.down_block_types, path);
  c.up_block_types = cfg(j, "up_block_types", c.up_block_types, path);
  c.block_out_channels = cfg(j, "block_out_channels", c.block_out_channels, path);
  c.layers_per_block = cfg(j, "layers_per_block", c.layers_per_block, path);
  c.act_fn = cfg(j, "act_fn", c.act_fn, path);
  c.norm_num_groups = cfg(j, "norm_num_groups", c.norm_num_groups, path);
  c.scaling_factor = cfg(j, "scaling_factor", c.scaling_factor, path);
  c.spatial_compression_ratio =
      cfg(j, "spatial_compression_ratio", c.spatial_compression_ratio, path);
  c.temporal_compression_ratio =
      cfg(j, "temporal_compression_ratio", c.temporal_compression_ratio, path);
  c.mid_block_add_attention = cfg(j, "mid_block_add_attention", c.mid_block_add_attention, path);
  c.validate(where);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Model.

AutoencoderKLHunyuanVideo::AutoencoderKLHunyuanVideo(HunyuanVideoVAEConfig config)
    : config_(std::move(config)) {
  config_.validate("AutoencoderKLHunyuanVideo");
  const int64_t l = config_.latent_channels;
  encoder_ = child("encoder", std::make_shared<HunyuanVideoEncoder3D>(config_));
  decoder_ = child("decoder", std::make_shared<HunyuanVideoDecoder3D>(config_));
  quant_conv_ = child("quant_conv", std::make_shared<HunyuanVideoConv3d>(
                                        2 * l, 2 * l, 1, std::vector<int64_t>{1, 1, 1}, ""));
  post_quant_conv_ = child("post_quant_conv", std::make_shared<HunyuanVideoConv3d>(
                                                  l, l, 1, std::vector<int64_t>{1, 1, 1}, ""));
}

AutoencoderKLHunyuanVideo::~AutoencoderKLHunyuanVideo() = default;

c10::ScalarType AutoencoderKLHunyuanVideo::dtype() const {
  const at::Tensor& w = decoder_->conv_in_weight();
  XF_CHECK(w.defined(), "AutoencoderKLHunyuanVideo used before its weights were loaded");
  return w.scalar_type();
}

void AutoencoderKLHunyuanVideo::set_tiling(const HunyuanVideoVAETiling& t) {
  const int64_t s = config_.spatial_compression_ratio, f = config_.temporal_compression_ratio;
  const std::vector<std::tuple<const char*, int64_t, const char*, int64_t, int64_t>> axes = {
      {"tile_sample_min_height", t.tile_sample_min_height, "tile_sample_stride_height",
       t.tile_sample_stride_height, s},
      {"tile_sample_min_width", t.tile_sample_min_width, "tile_sample_stride_width",
       t.tile_sample_stride_width, s},
      {"tile_sample_min_num_frames", t.tile_sample_min_num_frames, "tile_sample_stride_num_frames",
       t.tile_sample_stride_num_frames, f}};
  for (const auto& [min_name, min, stride_name, stride, ratio] : axes) {
    XF_CHECK(stride >= ratio && min >= stride, "AutoencoderKLHunyuanVideo tiling: ", stride_name,
             " (", stride, ") must be at least ", ratio,
             " (the compression ratio: a latent step) and ", min_name, " (", min,
             ") at least the stride (tiles must overlap or touch)");
  }
  tiling_ = t;
}

void AutoencoderKLHunyuanVideo::check_video(const std::string& what, const at::Tensor& x) const {
  vae::check_video_input("AutoencoderKLHunyuanVideo", what, x, config_.in_channels,
                         config_.temporal_compression_ratio);
}

void AutoencoderKLHunyuanVideo::check_latent(const std::string& what, const at::Tensor& z) const {
  vae::check_video_latent("AutoencoderKLHunyuanVideo", what, z, config_.latent_channels);
}

// --- encode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKLHunyuanVideo::encode_plain(const at::Tensor& x) const {
  return quant_conv_->forward(encoder_->forward(x), false);
}

// diffusers' _encode.
at::Tensor AutoencoderKLHunyuanVideo::encode_moments(const at::Tensor& x) const {
  const auto& t = tiling_;
  if (t.use_framewise_encoding && x.size(2) > t.tile_sample_min_num_frames) {
    return temporal_tiled_encode(x);
  }
  if (t.use_tiling &&
      (x.size(4) > t.tile_sample_min_width || x.size(3) > t.tile_sample_min_height)) {
    return tiled_encode(x);
  }
  return encode_plain(x);
}

at::Tensor AutoencoderKLHunyuanVideo::tiled_encode(const at::Tensor& x) const {
  const auto& t = tiling_;
  const int64_t s = config_.spatial_compression_ratio;
  const int64_t height = x.size(3), width = x.size(4);
  const int64_t latent_height = height / s, latent_width = width / s;
  const int64_t min_h = t.tile_sample_min_height / s, min_w = t.tile_sample_min_width / s;
  const int64_t stride_h = t.tile_sample_stride_height / s;
  const int64_t stride_w = t.tile_sample_stride_width / s;
  const int64_t blend_h = min_h - stride_h, blend_w = min_w - stride_w;

  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < height; i += t.tile_sample_stride_height) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < width; j += t.tile_sample_stride_width) {
      at::Tensor tile =
          slice(slice(x, 3, i, t.tile_sample_min_height), 4, j, t.tile_sample_min_width);
      row.push_back(encode_plain(tile));
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
      result_row.push_back(slice(slice(tile, 3, 0, stride_h), 4, 0, stride_w));
    }
    result_rows.push_back(at::cat(result_row, 4));
  }
  return slice(slice(at::cat(result_rows, 3), 3, 0, latent_height), 4, 0, latent_width);
}

at::Tensor AutoencoderKLHunyuanVideo::temporal_tiled_encode(const at::Tensor& x) const {
  const auto& t = tiling_;
  const int64_t r = config_.temporal_compression_ratio;
  const int64_t num_frames = x.size(2), height = x.size(3), width = x.size(4);
  const int64_t latent_num_frames = (num_frames - 1) / r + 1;
  const int64_t min_f = t.tile_sample_min_num_frames / r;
  const int64_t stride_f = t.tile_sample_stride_num_frames / r;
  const int64_t blend_f = min_f - stride_f;

  std::vector<at::Tensor> row;
  for (int64_t i = 0; i < num_frames; i += t.tile_sample_stride_num_frames) {
    at::Tensor tile = slice(x, 2, i, t.tile_sample_min_num_frames + 1);
    if (t.use_tiling && (height > t.tile_sample_min_height || width > t.tile_sample_min_width)) {
      tile = tiled_encode(tile);
    } else {
      tile = encode_plain(tile);
    }
    if (i > 0) tile = tile.narrow(2, 1, tile.size(2) - 1);
    row.push_back(tile);
  }
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < row.size(); ++i) {
    if (i > 0) {
      blend(row[i - 1], row[i], 2, blend_f);
      result.push_back(slice(row[i], 2, 0, stride_f));
    } else {
      result.push_back(slice(row[i], 2, 0, stride_f + 1));
    }
  }
  return slice(at::cat(result, 2), 2, 0, latent_num_frames);
}

std::pair<at::Tensor, at::Tensor> AutoencoderKLHunyuanVideo::encode(const at::Tensor& x) const {
  XF_CONTEXT("AutoencoderKLHunyuanVideo.encode");
  check_video("input video", x);
  at::Tensor xi = x.to(dtype());
  at::Tensor moments;
  if (use_slicing_ && xi.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : xi.split(1)) parts.push_back(encode_moments(s));
    moments = at::cat(parts);
  } else {
    moments = encode_moments(xi);
  }
  const int64_t l = config_.latent_channels;
  at::Tensor mean = moments.narrow(1, 0, l);
  at::Tensor logvar = moments.narrow(1, l, l);
  logvar = needs_upcast(logvar) ? logvar.to(at::kFloat).clamp(-30.0, 20.0).to(logvar.scalar_type())
                                : logvar.clamp(-30.0, 20.0);
  return {mean, logvar};
}

// --- decode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKLHunyuanVideo::decode_plain(const at::Tensor& z,
                                                   const HunyuanVideoBand* band) const {
  return decoder_->forward(post_quant_conv_->forward(z, false), band);
}

// diffusers' _decode, its tile thresholds included (the width against the stride: its quirk).
at::Tensor AutoencoderKLHunyuanVideo::decode_one(const at::Tensor& z,
                                                 const HunyuanVideoBand* band) const {
  const auto& t = tiling_;
  const int64_t s = config_.spatial_compression_ratio, r = config_.temporal_compression_ratio;
  const int64_t min_h = t.tile_sample_min_height / s;
  const int64_t min_w = t.tile_sample_stride_width / s;
  const int64_t min_f = t.tile_sample_min_num_frames / r;
  if (t.use_framewise_decoding && z.size(2) > min_f) return temporal_tiled_decode(z, band);
  XF_CHECK(band == nullptr || !t.use_tiling,
           "AutoencoderKLHunyuanVideo: spatial tiling (enable_tiling / --enable_tiling) cannot be "
           "combined with the patch-parallel decode (--use_parallel_vae)");
  if (t.use_tiling && (z.size(4) > min_w || z.size(3) > min_h)) return tiled_decode(z);
  return decode_plain(z, band);
}

at::Tensor AutoencoderKLHunyuanVideo::tiled_decode(const at::Tensor& z) const {
  const auto& t = tiling_;
  const int64_t s = config_.spatial_compression_ratio;
  const int64_t height = z.size(3), width = z.size(4);
  const int64_t sample_height = height * s, sample_width = width * s;
  const int64_t min_h = t.tile_sample_min_height / s, min_w = t.tile_sample_min_width / s;
  const int64_t stride_h = t.tile_sample_stride_height / s;
  const int64_t stride_w = t.tile_sample_stride_width / s;
  const int64_t blend_h = t.tile_sample_min_height - t.tile_sample_stride_height;
  const int64_t blend_w = t.tile_sample_min_width - t.tile_sample_stride_width;

  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < height; i += stride_h) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < width; j += stride_w) {
      row.push_back(decode_plain(slice(slice(z, 3, i, min_h), 4, j, min_w), nullptr));
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
      result_row.push_back(
          slice(slice(tile, 3, 0, t.tile_sample_stride_height), 4, 0, t.tile_sample_stride_width));
    }
    result_rows.push_back(at::cat(result_row, 4));
  }
  return slice(slice(at::cat(result_rows, 3), 3, 0, sample_height), 4, 0, sample_width);
}

at::Tensor AutoencoderKLHunyuanVideo::temporal_tiled_decode(const at::Tensor& z,
                                                            const HunyuanVideoBand* band) const {
  const auto& t = tiling_;
  const int64_t s = config_.spatial_compression_ratio, r = config_.temporal_compression_ratio;
  const int64_t num_frames = z.size(2);
  const int64_t num_sample_frames = (num_frames - 1) * r + 1;
  const int64_t min_h = t.tile_sample_min_height / s, min_w = t.tile_sample_min_width / s;
  const int64_t min_f = t.tile_sample_min_num_frames / r;
  const int64_t stride_f = t.tile_sample_stride_num_frames / r;
  const int64_t blend_f = t.tile_sample_min_num_frames - t.tile_sample_stride_num_frames;

  std::vector<at::Tensor> row;
  for (int64_t i = 0; i < num_frames; i += stride_f) {
    at::Tensor tile = slice(z, 2, i, min_f + 1);
    XF_CHECK(band == nullptr || !t.use_tiling,
             "AutoencoderKLHunyuanVideo: spatial tiling (enable_tiling / --enable_tiling) cannot "
             "be combined with the patch-parallel decode (--use_parallel_vae)");
    at::Tensor decoded = t.use_tiling && (tile.size(4) > min_w || tile.size(3) > min_h)
                             ? tiled_decode(tile)
                             : decode_plain(tile, band);
    if (i > 0) decoded = decoded.narrow(2, 1, decoded.size(2) - 1);
    row.push_back(decoded);
  }
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < row.size(); ++i) {
    if (i > 0) {
      blend(row[i - 1], row[i], 2, blend_f);
      result.push_back(slice(row[i], 2, 0, t.tile_sample_stride_num_frames));
    } else {
      result.push_back(slice(row[i], 2, 0, t.tile_sample_stride_num_frames + 1));
    }
  }
  return slice(at::cat(result, 2), 2, 0, num_sample_frames);
}

at::Tensor AutoencoderKLHunyuanVideo::decode(const at::Tensor& z) const {
  return decode(z, nullptr);
}

at::Tensor AutoencoderKLHunyuanVideo::decode(const at::Tensor& z,
                                             const HunyuanVideoBand* band) const {
  XF_CONTEXT("AutoencoderKLHunyuanVideo.decode");
  check_latent("latent z", z);
  XF_CHECK(band == nullptr || band->ctx != nullptr,
           "AutoencoderKLHunyuanVideo: a band decode needs a SpatialContext");
  at::Tensor zi = z.to(dtype());
  if (use_slicing_ && zi.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : zi.split(1)) parts.push_back(decode_one(s, band));
    return at::cat(parts);
  }
  return decode_one(zi, band);
}

// --- call --------------------------------------------------------------------------------------

uint64_t AutoencoderKLHunyuanVideo::activation_bytes(const ActivationQuery& q) const {
  if (q.method != "decode") return 0;
  // Temporal tiles of tile_sample_min_num_frames + 1 frames (framewise decoding), spatial tiles
  // with tiling; the decoder's levels as HunyuanVideoDecoder3D builds them (measured:
  // bench/run_plan_check).
  const int64_t frames = std::min<int64_t>(q.frames, tiling_.tile_sample_min_num_frames + 1);
  int64_t h = q.height, w = q.width;
  if (q.tiled) {
    h = std::min(h, tiling_.tile_sample_min_height);
    w = std::min(w, tiling_.tile_sample_min_width);
  }
  const auto& c = config_;
  const std::vector<int64_t> reversed(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  int64_t t = (frames - 1) / c.temporal_compression_ratio + 1;
  int64_t y = h / c.spatial_compression_ratio, x = w / c.spatial_compression_ratio;
  std::vector<vae::DecoderLevel> levels;
  int64_t out = reversed[0];
  for (size_t i = 0; i < reversed.size(); ++i) {
    const int64_t in = out;
    out = reversed[i];
    levels.push_back({in, out, t, y, x});
    if (!c.temporal_resample(i) && !c.spatial_resample(i)) continue;
    if (c.temporal_resample(i)) t = 1 + 2 * (t - 1);  // the first frame stays alone
    if (c.spatial_resample(i)) {
      y *= 2;
      x *= 2;
    }
    levels.push_back({out, out, t, y, x});
  }
  return vae::decoder_levels_peak_bytes(levels, 3.15 * q.bytes + 8.8, q.batch, q.cpu);
}

TensorMap AutoencoderKLHunyuanVideo::call(const std::string& method, const TensorMap& inputs) {
  XF_CONTEXT("AutoencoderKLHunyuanVideo.", method);
  c10::InferenceMode guard;
  XF_CHECK(method == "decode" || method == "encode" || method == "forward",
           "AutoencoderKLHunyuanVideo has no method '", method,
           "' (known: forward, encode, decode)");
  const std::string input_name = method == "decode" ? "z" : "sample";
  for (const auto& [name, tensor] : inputs) {
    XF_CHECK(name == input_name, "AutoencoderKLHunyuanVideo.", method, ": unknown input '", name,
             "' (accepted: ", input_name, ")");
  }
  auto it = inputs.find(input_name);
  XF_CHECK(it != inputs.end(), "AutoencoderKLHunyuanVideo.", method, ": missing input '",
           input_name, "'");
  if (method == "decode") return {{"sample", decode(it->second)}};
  auto [mean, logvar] = encode(it->second);
  if (method == "encode") {
    return {{"latent_dist_mean", mean},
            {"latent_dist_std", at::exp(0.5 * logvar.to(at::kFloat)).to(logvar.scalar_type())},
            {"sample", mean}};
  }
  return {{"sample", decode(mean)}};
}

}  // namespace xfuser::models::hunyuan_video
