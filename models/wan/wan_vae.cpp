#include "models/wan/wan_vae.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/attention.h"
#include "backends/error.h"
#include "backends/kernels.h"
#include "backends/tensor_util.h"
#include "models/vae/vae_blocks.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::wan {

using vae::Activation;
using vae::apply_activation;
using vae::Conv2d;

namespace {

// diffusers' CACHE_T: frames of its input each causal convolution keeps for the next chunk.
constexpr int64_t kCacheFrames = 2;

// libtorch 1.13's CPU kernels have no fp16 convolution (or clamp), and its bf16 CPU conv3d loses
// far more than diffusers' (torch 2.x) bf16 convolutions (2.6x its relative l2 error on the
// fixture): on the CPU, 3D convolutions and RMS norms of fp16/bf16 tensors run in fp32 and round
// back, so activations still travel between ops in the model dtype.
bool needs_upcast(const at::Tensor& x) {
  return (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) && x.device().is_cpu();
}

// The last `n` frames (dim 2) of x, or all of them when it has fewer.
at::Tensor last_frames(const at::Tensor& x, int64_t n) {
  const int64_t t = x.size(2);
  return x.narrow(2, std::max<int64_t>(0, t - n), std::min(n, t));
}

}  // namespace

// One encode / decode call's feature cache (diffusers' feat_cache list and feat_idx): entry i
// belongs to the i-th cached layer in forward order; `idx` is reset to 0 before every chunk.
struct WanFeatCache {
  struct Entry {
    bool rep = false;  // diffusers' "Rep" marker (upsample3d after its first chunk)
    at::Tensor t;      // undefined and !rep: None
    bool empty() const { return !rep && !t.defined(); }
  };
  std::vector<Entry> entries;
  size_t idx = 0;
  // The patch-parallel decode's band context (null: the tensors are whole frames).
  const vae::SpatialContext* ctx = nullptr;

  Entry& current() {
    if (idx >= entries.size()) entries.resize(idx + 1);
    return entries[idx];
  }
};

// ---------------------------------------------------------------------------------------------
// Layers.

// WanCausalConv3d: nn.Conv3d whose temporal padding is all at the front (2 * pad_t frames of
// zeros, fewer when cached frames of the previous chunk are prepended); spatial zero padding
// (pad_h, pad_w) on both sides.
class WanCausalConv3d : public Module {
 public:
  WanCausalConv3d(int64_t in, int64_t out, std::vector<int64_t> kernel,
                  std::vector<int64_t> stride = {1, 1, 1}, std::vector<int64_t> padding = {0, 0, 0})
      : in_(in), stride_(std::move(stride)), padding_(std::move(padding)) {
    weight_ = &param("weight", {out, in, kernel[0], kernel[1], kernel[2]});
    bias_ = &param("bias", {out});
  }

  // x [B, in, T, H, W]; `cache` (undefined: none) [B, in, <= 2*pad_t, H, W] precedes x in time.
  // With a context, x and cache are a band of rows: the row padding comes from ctx->pad_rows on
  // [cache, x] (the neighbours' rows of the same frames: each rank caches only its own rows).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cache = {},
                     const vae::SpatialContext* ctx = nullptr) const {
    XF_CHECK(weight_->loaded(), "WanCausalConv3d used before its weights were loaded");
    XF_CHECK(x.dim() == 5 && x.size(1) == in_, "WanCausalConv3d expects [B, ", in_,
             ", T, H, W], got ", shape_string(x.sizes()));
    int64_t front = 2 * padding_[0];
    at::Tensor h = x;
    if (cache.defined() && front > 0) {
      h = at::cat({cache, x}, 2);
      front -= cache.size(2);
    }
    int64_t pad_h = padding_[1];
    if (ctx != nullptr && pad_h > 0) {
      // [B, C, T, h, W] -> [B, C*T, h, W] -> halo rows -> [B, C, T, h + 2 pad_h, W]; before the
      // zero frames (whose halo rows are zeros: not sent).
      const int64_t b = h.size(0), c = h.size(1), t = h.size(2), w = h.size(4);
      h = ctx->pad_rows(h.reshape({b, c * t, h.size(3), w}), pad_h);
      h = h.view({b, c, t, h.size(2), w});
      pad_h = 0;
    }
    if (front > 0) h = at::constant_pad_nd(h, {0, 0, 0, 0, front, 0}, 0.0);
    const bool up = needs_upcast(h);
    at::Tensor w = up ? weight_->value().to(at::kFloat) : weight_->value();
    at::Tensor b = up ? bias_->value().to(at::kFloat) : bias_->value();
    at::Tensor y =
        backends::conv3d(up ? h.to(at::kFloat) : h, w, b, stride_, {0, pad_h, padding_[2]});
    return up ? y.to(x.scalar_type()) : y;
  }

  at::Tensor weight() const { return weight_->value(); }

 private:
  int64_t in_;
  std::vector<int64_t> stride_, padding_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

namespace {

// The cached causal convolution step diffusers repeats in every block: run `conv` on x after the
// cached frames of the previous chunk, then cache x's last 2 frames (with the previous cache's
// last frame in front when x has only one).
at::Tensor cached_conv(const WanCausalConv3d& conv, const at::Tensor& x, WanFeatCache& cache) {
  WanFeatCache::Entry& e = cache.current();
  at::Tensor cache_x = last_frames(x, kCacheFrames).clone();
  if (cache_x.size(2) < 2 && e.t.defined()) {
    cache_x = at::cat({last_frames(e.t, 1), cache_x}, 2);
  }
  at::Tensor y = conv.forward(x, e.t, cache.ctx);
  e.t = cache_x;
  ++cache.idx;
  return y;
}

// WanRMS_norm: F.normalize(x, dim=1) * sqrt(dim) * gamma (bias False: + 0). `gamma` is
// [dim, 1, 1, 1] for 5D inputs (images=False) and [dim, 1, 1] for 4D (images=True).
class WanRMSNorm : public Module {
 public:
  WanRMSNorm(int64_t dim, bool images) : dim_(dim), scale_(std::sqrt(static_cast<double>(dim))) {
    std::vector<int64_t> shape =
        images ? std::vector<int64_t>{dim, 1, 1} : std::vector<int64_t>{dim, 1, 1, 1};
    gamma_ = &param("gamma", shape);
  }

  at::Tensor forward(const at::Tensor& x) const {
    XF_CHECK(gamma_->loaded(), "WanRMS_norm used before its weights were loaded");
    XF_CHECK(x.size(1) == dim_, "WanRMS_norm expects ", dim_, " channels, got ",
             shape_string(x.sizes()));
    const bool up = needs_upcast(x);
    at::Tensor xi = up ? x.to(at::kFloat) : x;
    // F.normalize: x / max(||x||_2 over dim 1, 1e-12).
    at::Tensor denom = at::linalg_vector_norm(xi, 2.0, {1}, /*keepdim=*/true).clamp_min(1e-12);
    at::Tensor y = xi / denom * scale_ * (up ? gamma_->value().to(at::kFloat) : gamma_->value());
    return up ? y.to(x.scalar_type()) : y;
  }

 private:
  int64_t dim_;
  double scale_;
  ParamSlot* gamma_;
};

// Something in a down_blocks / up_blocks list: a residual block or a resampler.
class CachedLayer : public Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const = 0;
};

// WanResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))); conv1 and conv2
// cached; conv_shortcut (1x1x1) when in != out.
class WanResidualBlock : public CachedLayer {
 public:
  WanResidualBlock(int64_t in, int64_t out) {
    norm1_ = child("norm1", std::make_shared<WanRMSNorm>(in, false));
    conv1_ = child("conv1", std::make_shared<WanCausalConv3d>(
                                in, out, std::vector<int64_t>{3, 3, 3},
                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
    norm2_ = child("norm2", std::make_shared<WanRMSNorm>(out, false));
    conv2_ = child("conv2", std::make_shared<WanCausalConv3d>(
                                out, out, std::vector<int64_t>{3, 3, 3},
                                std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
    if (in != out) {
      conv_shortcut_ = child("conv_shortcut", std::make_shared<WanCausalConv3d>(
                                                  in, out, std::vector<int64_t>{1, 1, 1}));
    }
  }

  at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const override {
    at::Tensor h = conv_shortcut_ ? conv_shortcut_->forward(x) : x;
    at::Tensor y = apply_activation(norm1_->forward(x), Activation::kSilu);
    y = cached_conv(*conv1_, y, cache);
    y = apply_activation(norm2_->forward(y), Activation::kSilu);  // dropout: identity
    y = cached_conv(*conv2_, y, cache);
    return y + h;
  }

 private:
  std::shared_ptr<WanRMSNorm> norm1_, norm2_;
  std::shared_ptr<WanCausalConv3d> conv1_, conv2_, conv_shortcut_;
};

// WanAttentionBlock: single-head self-attention over the H*W pixels of each frame; RMS norm
// (images=True), to_qkv and proj are 1x1 Conv2d; residual.
class WanAttentionBlock : public Module {
 public:
  explicit WanAttentionBlock(int64_t dim) : dim_(dim) {
    norm_ = child("norm", std::make_shared<WanRMSNorm>(dim, true));
    to_qkv_ = child("to_qkv", std::make_shared<Conv2d>(dim, 3 * dim, 1));
    proj_ = child("proj", std::make_shared<Conv2d>(dim, dim, 1));
  }

  // With a context, x is a band of rows: the queries stay local, the keys/values of the whole
  // frame come from ctx->gather_tokens (rows in band order: the frame's row-major order).
  at::Tensor forward(const at::Tensor& x, const vae::SpatialContext* ctx = nullptr) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), hh = x.size(3), ww = x.size(4);
    at::Tensor h = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, hh, ww});  // [BT, C, H, W]
    h = norm_->forward(h);
    at::Tensor qkv = to_qkv_->forward(h, 1, 0).reshape({b * t, 3 * c, hh * ww}).transpose(1, 2);
    // [BT, HW, 3C] -> q, k, v [BT, HW, 1, C]
    at::Tensor q = qkv.narrow(2, 0, c).unsqueeze(2);
    at::Tensor k = qkv.narrow(2, c, c).unsqueeze(2);
    at::Tensor v = qkv.narrow(2, 2 * c, c).unsqueeze(2);
    if (ctx != nullptr) {
      k = ctx->gather_tokens(k.squeeze(2).contiguous()).unsqueeze(2);  // [BT, N, 1, C]
      v = ctx->gather_tokens(v.squeeze(2).contiguous()).unsqueeze(2);
    }
    backends::AttentionOptions opts;
    opts.scale = 1.0 / std::sqrt(static_cast<double>(dim_));
    at::Tensor o = backends::attention(q, k, v, opts).out;  // [BT, HW, 1, C]
    o = o.squeeze(2).transpose(1, 2).reshape({b * t, c, hh, ww});
    o = proj_->forward(o, 1, 0);
    o = o.view({b, t, c, hh, ww}).permute({0, 2, 1, 3, 4});  // [B, C, T, H, W]
    return o + x;
  }

 private:
  int64_t dim_;
  std::shared_ptr<WanRMSNorm> norm_;
  std::shared_ptr<Conv2d> to_qkv_, proj_;
};

enum class ResampleMode { kUpsample2d, kUpsample3d, kDownsample2d, kDownsample3d };

// WanResample: the 2D resampler (resample.1, a Conv2d) on every frame, plus for the 3D modes a
// temporal convolution (time_conv): upsample3d doubles the frames of every chunk after the first
// (interleaving the two halves of its 2*dim output channels); downsample3d convolves stride 2
// over the previous chunk's last frame and this chunk, and passes the first chunk unchanged.
class WanResample : public CachedLayer {
 public:
  WanResample(int64_t dim, ResampleMode mode) : mode_(mode) {
    const bool up = mode == ResampleMode::kUpsample2d || mode == ResampleMode::kUpsample3d;
    conv_ = child("resample.1", std::make_shared<Conv2d>(dim, up ? dim / 2 : dim, 3));
    if (mode == ResampleMode::kUpsample3d) {
      time_conv_ =
          child("time_conv", std::make_shared<WanCausalConv3d>(
                                 dim, 2 * dim, std::vector<int64_t>{3, 1, 1},
                                 std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 0, 0}));
    } else if (mode == ResampleMode::kDownsample3d) {
      time_conv_ = child("time_conv",
                         std::make_shared<WanCausalConv3d>(dim, dim, std::vector<int64_t>{3, 1, 1},
                                                           std::vector<int64_t>{2, 1, 1}));
    }
  }

  at::Tensor forward(const at::Tensor& input, WanFeatCache& cache) const override {
    at::Tensor x = input;
    const int64_t b = x.size(0), c = x.size(1), hh = x.size(3), ww = x.size(4);
    if (mode_ == ResampleMode::kUpsample3d) {
      WanFeatCache::Entry& e = cache.current();
      if (e.empty()) {
        e.rep = true;
        ++cache.idx;
      } else {
        const int64_t t = x.size(2);
        at::Tensor cache_x = last_frames(x, kCacheFrames).clone();
        if (cache_x.size(2) < 2 && !e.rep) {
          cache_x = at::cat({last_frames(e.t, 1), cache_x}, 2);
        }
        if (cache_x.size(2) < 2 && e.rep) cache_x = at::cat({at::zeros_like(cache_x), cache_x}, 2);
        x = e.rep ? time_conv_->forward(x) : time_conv_->forward(x, e.t);  // [B, 2C, T, H, W]
        e.rep = false;
        e.t = cache_x;
        ++cache.idx;
        // [B, 2, C, T, H, W] -> [B, C, T, 2, H, W] -> [B, C, 2T, H, W]
        x = x.reshape({b, 2, c, t, hh, ww});
        x = at::stack({x.select(1, 0), x.select(1, 1)}, 3).reshape({b, c, t * 2, hh, ww});
      }
    }
    const int64_t t = x.size(2);
    at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, hh, ww});  // [BT, C, H, W]
    switch (mode_) {
      case ResampleMode::kUpsample2d:
      case ResampleMode::kUpsample3d: {
        // WanUpsample: nearest-exact 2x in fp32, back to the input dtype; conv padding 1.
        at::Tensor up =
            at::_upsample_nearest_exact2d(frames.to(at::kFloat), {2 * hh, 2 * ww}, 2.0, 2.0)
                .to(frames.scalar_type());
        frames = conv_->forward(up, 1, 1, cache.ctx);
        break;
      }
      case ResampleMode::kDownsample2d:
      case ResampleMode::kDownsample3d:
        // ZeroPad2d((0, 1, 0, 1)), conv stride 2.
        frames = conv_->forward(at::constant_pad_nd(frames, {0, 1, 0, 1}, 0.0), 2, 0);
        break;
    }
    x = frames.view({b, t, frames.size(1), frames.size(2), frames.size(3)})
            .permute({0, 2, 1, 3, 4});  // [B, C', T, H', W']

    if (mode_ == ResampleMode::kDownsample3d) {
      WanFeatCache::Entry& e = cache.current();
      if (e.empty()) {
        e.t = x.clone();
      } else {
        at::Tensor cache_x = last_frames(x, 1).clone();
        x = time_conv_->forward(at::cat({last_frames(e.t, 1), x}, 2));
        e.t = cache_x;
      }
      ++cache.idx;
    }
    return x;
  }

 private:
  ResampleMode mode_;
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<WanCausalConv3d> time_conv_;  // the 3D modes only
};

// WanMidBlock (num_layers 1): resnets.0, attentions.0, resnets.1.
class WanMidBlock : public Module {
 public:
  explicit WanMidBlock(int64_t dim) {
    attention_ = child("attentions.0", std::make_shared<WanAttentionBlock>(dim));
    resnet0_ = child("resnets.0", std::make_shared<WanResidualBlock>(dim, dim));
    resnet1_ = child("resnets.1", std::make_shared<WanResidualBlock>(dim, dim));
  }

  at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const {
    at::Tensor h = resnet0_->forward(x, cache);
    h = attention_->forward(h, cache.ctx);
    return resnet1_->forward(h, cache);
  }

 private:
  std::shared_ptr<WanAttentionBlock> attention_;
  std::shared_ptr<WanResidualBlock> resnet0_, resnet1_;
};

// WanUpBlock: num_res_blocks + 1 residual blocks, then upsamplers.0 (all but the last block).
class WanUpBlock : public Module {
 public:
  WanUpBlock(int64_t in, int64_t out, int64_t num_res_blocks, const ResampleMode* upsample) {
    int64_t current = in;
    for (int64_t i = 0; i <= num_res_blocks; ++i) {
      resnets_.push_back(
          child("resnets." + std::to_string(i), std::make_shared<WanResidualBlock>(current, out)));
      current = out;
    }
    if (upsample != nullptr) {
      upsampler_ = child("upsamplers.0", std::make_shared<WanResample>(out, *upsample));
    }
  }

  at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const {
    at::Tensor h = x;
    for (const auto& r : resnets_) h = r->forward(h, cache);
    return upsampler_ ? upsampler_->forward(h, cache) : h;
  }

 private:
  std::vector<std::shared_ptr<WanResidualBlock>> resnets_;
  std::shared_ptr<WanResample> upsampler_;
};

}  // namespace

// WanEncoder3d: conv_in, down_blocks (num_res_blocks residual blocks per level, then a
// downsample2d/3d resampler except after the last level, one flat list), mid_block, norm_out,
// SiLU, conv_out to `out` (2 * z_dim) channels.
class WanEncoder3d : public Module {
 public:
  WanEncoder3d(const WanVAEConfig& c, int64_t out) {
    std::vector<int64_t> dims = {c.base_dim};
    for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
    conv_in_ = child("conv_in", std::make_shared<WanCausalConv3d>(
                                    3, dims[0], std::vector<int64_t>{3, 3, 3},
                                    std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
    int64_t out_dim = dims[0];
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      int64_t in_dim = dims[i];
      out_dim = dims[i + 1];
      for (int64_t r = 0; r < c.num_res_blocks; ++r) {
        add_layer(std::make_shared<WanResidualBlock>(in_dim, out_dim));
        in_dim = out_dim;
      }
      if (i + 1 != c.dim_mult.size()) {
        add_layer(std::make_shared<WanResample>(out_dim, c.temperal_downsample[i]
                                                             ? ResampleMode::kDownsample3d
                                                             : ResampleMode::kDownsample2d));
      }
    }
    mid_block_ = child("mid_block", std::make_shared<WanMidBlock>(out_dim));
    norm_out_ = child("norm_out", std::make_shared<WanRMSNorm>(out_dim, false));
    conv_out_ =
        child("conv_out", std::make_shared<WanCausalConv3d>(
                              out_dim, out, std::vector<int64_t>{3, 3, 3},
                              std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  }

  at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const {
    at::Tensor h = cached_conv(*conv_in_, x, cache);
    for (const auto& layer : down_blocks_) h = layer->forward(h, cache);
    h = mid_block_->forward(h, cache);
    h = apply_activation(norm_out_->forward(h), Activation::kSilu);
    return cached_conv(*conv_out_, h, cache);
  }

 private:
  void add_layer(std::shared_ptr<CachedLayer> layer) {
    down_blocks_.push_back(child("down_blocks." + std::to_string(down_blocks_.size()), layer));
  }

  std::shared_ptr<WanCausalConv3d> conv_in_, conv_out_;
  std::vector<std::shared_ptr<CachedLayer>> down_blocks_;
  std::shared_ptr<WanMidBlock> mid_block_;
  std::shared_ptr<WanRMSNorm> norm_out_;
};

// WanDecoder3d: conv_in, mid_block, up_blocks (upsample3d where the reversed
// temperal_downsample is true, else upsample2d; none on the last), norm_out, SiLU, conv_out to 3.
class WanDecoder3d : public Module {
 public:
  explicit WanDecoder3d(const WanVAEConfig& c) {
    std::vector<int64_t> dims = {c.base_dim * c.dim_mult.back()};
    for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) {
      dims.push_back(c.base_dim * *it);
    }
    conv_in_ = child("conv_in", std::make_shared<WanCausalConv3d>(
                                    c.z_dim, dims[0], std::vector<int64_t>{3, 3, 3},
                                    std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
    mid_block_ = child("mid_block", std::make_shared<WanMidBlock>(dims[0]));
    const std::vector<bool> temperal_upsample(c.temperal_downsample.rbegin(),
                                              c.temperal_downsample.rend());
    int64_t out_dim = dims[0];
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      const int64_t in_dim = i > 0 ? dims[i] / 2 : dims[i];
      out_dim = dims[i + 1];
      std::optional<ResampleMode> mode;
      if (i + 1 != c.dim_mult.size()) {
        mode = temperal_upsample[i] ? ResampleMode::kUpsample3d : ResampleMode::kUpsample2d;
      }
      up_blocks_.push_back(child("up_blocks." + std::to_string(i),
                                 std::make_shared<WanUpBlock>(in_dim, out_dim, c.num_res_blocks,
                                                              mode ? &*mode : nullptr)));
    }
    norm_out_ = child("norm_out", std::make_shared<WanRMSNorm>(out_dim, false));
    conv_out_ =
        child("conv_out", std::make_shared<WanCausalConv3d>(
                              out_dim, 3, std::vector<int64_t>{3, 3, 3},
                              std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  }

  at::Tensor forward(const at::Tensor& x, WanFeatCache& cache) const {
    at::Tensor h = cached_conv(*conv_in_, x, cache);
    h = mid_block_->forward(h, cache);
    for (const auto& b : up_blocks_) h = b->forward(h, cache);
    h = apply_activation(norm_out_->forward(h), Activation::kSilu);
    return cached_conv(*conv_out_, h, cache);
  }

  at::Tensor conv_in_weight() const { return conv_in_->weight(); }

 private:
  std::shared_ptr<WanCausalConv3d> conv_in_, conv_out_;
  std::shared_ptr<WanMidBlock> mid_block_;
  std::vector<std::shared_ptr<WanUpBlock>> up_blocks_;
  std::shared_ptr<WanRMSNorm> norm_out_;
};

// ---------------------------------------------------------------------------------------------
// Config.

WanVAEConfig::WanVAEConfig()
    : latents_mean{-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                   0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921},
      latents_std{2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                  3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160} {}

WanVAEConfig WanVAEConfig::from_json(const nlohmann::json& j, const std::string& path) {
  const std::string where = path.empty() ? std::string("(memory)") : path;
  XF_CHECK(j.is_object(), "config ", where, " is not a JSON object");
  WanVAEConfig c;
  c.base_dim = cfg(j, "base_dim", c.base_dim, path);
  c.z_dim = cfg(j, "z_dim", c.z_dim, path);
  c.dim_mult = cfg(j, "dim_mult", c.dim_mult, path);
  c.num_res_blocks = cfg(j, "num_res_blocks", c.num_res_blocks, path);
  c.attn_scales = cfg(j, "attn_scales", c.attn_scales, path);
  c.temperal_downsample = cfg(j, "temperal_downsample", c.temperal_downsample, path);
  c.dropout = cfg(j, "dropout", c.dropout, path);
  c.latents_mean = cfg(j, "latents_mean", c.latents_mean, path);
  c.latents_std = cfg(j, "latents_std", c.latents_std, path);
  // Wan 2.2's VAE settings (the TI2V-5B VAE: patchified pixels, residual blocks, a wider
  // decoder) are not built: each must keep the value of Wan 2.1's VAE, which is diffusers'
  // default, or the error names it.
  const std::pair<const char*, nlohmann::json> wan21[] = {{"decoder_base_dim", nullptr},
                                                          {"is_residual", false},
                                                          {"in_channels", 3},
                                                          {"out_channels", 3},
                                                          {"patch_size", nullptr}};
  for (const auto& [key, value] : wan21) {
    const auto it = j.find(key);
    if (it == j.end() || *it == value || (value.is_null() && it->is_null())) continue;
    if (std::string(key) == "decoder_base_dim" && *it == c.base_dim) continue;  // the same width
    XF_THROW("config ", where, ": ", key, " = ", it->dump(),
             " is not supported (Wan 2.2's TI2V VAE); AutoencoderKLWan is built as Wan 2.1's, ",
             key, " = ", value.dump());
  }

  XF_CHECK(c.base_dim > 0 && c.z_dim > 0 && c.num_res_blocks >= 0, "config ", where, ": base_dim (",
           c.base_dim, ") and z_dim (", c.z_dim, ") must be positive and num_res_blocks (",
           c.num_res_blocks, ") non-negative");
  XF_CHECK(!c.dim_mult.empty(), "config ", where, ": dim_mult is empty");
  for (int64_t m : c.dim_mult) {
    XF_CHECK(m > 0, "config ", where, ": dim_mult entry ", m, " is not positive");
  }
  XF_CHECK(c.temperal_downsample.size() + 1 == c.dim_mult.size(), "config ", where,
           ": temperal_downsample has ", c.temperal_downsample.size(),
           " entries; AutoencoderKLWan needs one per level transition, len(dim_mult) - 1 = ",
           c.dim_mult.size() - 1);
  // The pipeline's latent grid factors: diffusers' WanPipeline reads them, xfuser derives them
  // from the architecture; they must agree.
  int64_t temporal = 1;
  for (bool down : c.temperal_downsample) temporal *= down ? 2 : 1;
  const int64_t spatial = int64_t{1} << c.temperal_downsample.size();
  for (const auto& [key, derived] :
       {std::pair<const char*, int64_t>{"scale_factor_temporal", temporal},
        std::pair<const char*, int64_t>{"scale_factor_spatial", spatial}}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    XF_CHECK(it->is_number_integer() && it->get<int64_t>() == derived, "config ", where, ": ", key,
             " = ", it->dump(), " disagrees with the architecture (temperal_downsample gives ",
             derived, ")");
  }
  XF_CHECK(
      c.attn_scales.empty(), "config ", where, ": attn_scales with ", c.attn_scales.size(),
      " entries is not supported: diffusers v0.33.1's WanEncoder3d cannot run down-block attention "
      "(its feature-cache loop calls WanAttentionBlock with cache arguments); Wan 2.1 uses []");
  XF_CHECK(static_cast<int64_t>(c.latents_mean.size()) == c.z_dim &&
               static_cast<int64_t>(c.latents_std.size()) == c.z_dim,
           "config ", where, ": latents_mean (", c.latents_mean.size(),
           " entries) and latents_std (", c.latents_std.size(), " entries) need z_dim = ", c.z_dim,
           " entries each (diffusers' defaults have 16)");
  return c;
}

// ---------------------------------------------------------------------------------------------
// Model.

AutoencoderKLWan::AutoencoderKLWan(WanVAEConfig config) : config_(std::move(config)) {
  XF_CHECK(config_.temperal_downsample.size() + 1 == config_.dim_mult.size() &&
               config_.attn_scales.empty(),
           "AutoencoderKLWan: inconsistent config (use WanVAEConfig::from_json to check it)");
  const int64_t z = config_.z_dim;
  encoder_ = child("encoder", std::make_shared<WanEncoder3d>(config_, 2 * z));
  quant_conv_ = child(
      "quant_conv", std::make_shared<WanCausalConv3d>(2 * z, 2 * z, std::vector<int64_t>{1, 1, 1}));
  post_quant_conv_ = child("post_quant_conv",
                           std::make_shared<WanCausalConv3d>(z, z, std::vector<int64_t>{1, 1, 1}));
  decoder_ = child("decoder", std::make_shared<WanDecoder3d>(config_));
}

AutoencoderKLWan::~AutoencoderKLWan() = default;

int64_t AutoencoderKLWan::temporal_scale() const {
  int64_t s = 1;
  for (bool down : config_.temperal_downsample) s *= down ? 2 : 1;
  return s;
}

int64_t AutoencoderKLWan::spatial_scale() const {
  return int64_t{1} << config_.temperal_downsample.size();
}

c10::ScalarType AutoencoderKLWan::dtype() const {
  const at::Tensor& w = decoder_->conv_in_weight();
  XF_CHECK(w.defined(), "AutoencoderKLWan used before its weights were loaded");
  return w.scalar_type();
}

void AutoencoderKLWan::check_video(const std::string& what, const at::Tensor& x) const {
  XF_CHECK(x.defined(), "AutoencoderKLWan: ", what, " is undefined");
  const int64_t s = spatial_scale();
  XF_CHECK(x.dim() == 5 && x.size(0) > 0 && x.size(1) == 3 && x.size(2) > 0 && x.size(3) >= s &&
               x.size(4) >= s,
           "AutoencoderKLWan: ", what, " has shape ", shape_string(x.sizes()),
           ", expected [B, 3, F, H, W] with H, W >= ", s);
  XF_CHECK((x.size(2) - 1) % 4 == 0, "AutoencoderKLWan: ", what, " has ", x.size(2),
           " frames (shape ", shape_string(x.sizes()),
           "); encode needs 1 + 4k frames (the first frame, then chunks of 4)");
  XF_CHECK(x.is_floating_point(), "AutoencoderKLWan: ", what,
           " must be a floating-point tensor, got ", x.scalar_type());
}

void AutoencoderKLWan::check_latent(const std::string& what, const at::Tensor& z) const {
  XF_CHECK(z.defined(), "AutoencoderKLWan: ", what, " is undefined");
  XF_CHECK(z.dim() == 5 && z.size(0) > 0 && z.size(1) == config_.z_dim && z.size(2) > 0 &&
               z.size(3) > 0 && z.size(4) > 0,
           "AutoencoderKLWan: ", what, " has shape ", shape_string(z.sizes()), ", expected [B, ",
           config_.z_dim, " (z_dim), f, h, w]");
  XF_CHECK(z.is_floating_point(), "AutoencoderKLWan: ", what,
           " must be a floating-point tensor, got ", z.scalar_type());
}

// --- encode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKLWan::encode_moments(const at::Tensor& x) const {
  WanFeatCache cache;
  const int64_t chunks = 1 + (x.size(2) - 1) / 4;
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < chunks; ++i) {
    cache.idx = 0;
    at::Tensor chunk = i == 0 ? x.narrow(2, 0, 1) : x.narrow(2, 1 + 4 * (i - 1), 4);
    outs.push_back(encoder_->forward(chunk, cache));  // [B, 2z, 1, h, w]
  }
  return quant_conv_->forward(at::cat(outs, 2));  // [B, 2z, f, h, w]
}

std::pair<at::Tensor, at::Tensor> AutoencoderKLWan::encode(const at::Tensor& x) const {
  XF_CONTEXT("AutoencoderKLWan.encode");
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
  const int64_t z = config_.z_dim;
  at::Tensor mean = moments.narrow(1, 0, z);
  at::Tensor logvar = moments.narrow(1, z, z);
  logvar = needs_upcast(logvar) ? logvar.to(at::kFloat).clamp(-30.0, 20.0).to(logvar.scalar_type())
                                : logvar.clamp(-30.0, 20.0);
  return {mean, logvar};
}

// --- decode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKLWan::decode_one(const at::Tensor& z, const vae::SpatialContext* ctx) const {
  at::Tensor x = post_quant_conv_->forward(z);
  WanFeatCache cache;
  cache.ctx = ctx;
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < x.size(2); ++i) {
    cache.idx = 0;
    outs.push_back(decoder_->forward(x.narrow(2, i, 1), cache));
  }
  at::Tensor out = at::cat(outs, 2);
  if (needs_upcast(out)) return out.to(at::kFloat).clamp(-1.0, 1.0).to(out.scalar_type());
  return out.clamp(-1.0, 1.0);
}

at::Tensor AutoencoderKLWan::decode(const at::Tensor& z) const { return decode(z, nullptr); }

at::Tensor AutoencoderKLWan::decode(const at::Tensor& z, const vae::SpatialContext* ctx) const {
  XF_CONTEXT("AutoencoderKLWan.decode");
  check_latent(ctx != nullptr ? "latent band z" : "latent z", z);
  at::Tensor zi = z.to(dtype());
  if (use_slicing_ && zi.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : zi.split(1)) parts.push_back(decode_one(s, ctx));
    return at::cat(parts);
  }
  return decode_one(zi, ctx);
}

// --- call --------------------------------------------------------------------------------------

uint64_t AutoencoderKLWan::activation_bytes(const ActivationQuery& q) const {
  // Encoding runs chunk by chunk as decoding does, at the same sizes (measured alike).
  if (q.method != "decode" && q.method != "encode") return 0;
  // The decoder runs one latent frame at a time (its causal convolutions keep two frames of
  // cache): 1 output frame, then temporal_scale() frames per latent frame, at full resolution;
  // the frames gather into the output video in fp32. Its full-resolution level has base_dim x
  // dim_mult[0] channels; the VAE computes in fp32 (measured: bench/run_plan_check).
  const int64_t frames = q.frames > 1 ? temporal_scale() : 1;
  const int64_t channels = config_.base_dim * config_.dim_mult.front();
  const auto positions = static_cast<uint64_t>(q.batch * frames * q.height * q.width);
  const auto video = static_cast<uint64_t>(q.batch * q.frames * q.height * q.width);
  // Causal convolutions: two cached frames before the chunk's, one row of padding each side.
  return vae::decoder_peak_bytes(positions, channels, 26.0, channels, (frames + 2) * (q.height + 2),
                                 q.batch, q.cpu) +
         video * 16;
}

TensorMap AutoencoderKLWan::call(const std::string& method, const TensorMap& inputs) {
  XF_CONTEXT("AutoencoderKLWan.", method);
  c10::InferenceMode guard;
  XF_CHECK(method == "decode" || method == "encode" || method == "forward",
           "AutoencoderKLWan has no method '", method, "' (known: forward, encode, decode)");
  const std::string input_name = method == "decode" ? "z" : "sample";
  for (const auto& [name, tensor] : inputs) {
    XF_CHECK(name == input_name, "AutoencoderKLWan.", method, ": unknown input '", name,
             "' (accepted: ", input_name, ")");
  }
  auto it = inputs.find(input_name);
  XF_CHECK(it != inputs.end(), "AutoencoderKLWan.", method, ": missing input '", input_name, "'");
  if (method == "decode") return {{"sample", decode(it->second)}};
  auto [mean, logvar] = encode(it->second);
  if (method == "encode") {
    return {{"latent_dist_mean", mean},
            {"latent_dist_std", at::exp(0.5 * logvar.to(at::kFloat)).to(logvar.scalar_type())},
            {"sample", mean}};
  }
  return {{"sample", decode(mean)}};
}

}  // namespace xfuser::models::wan
