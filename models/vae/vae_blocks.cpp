#include "models/vae/vae_blocks.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "backends/attention.h"
#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/tensor_util.h"

namespace xfuser::models::vae {
namespace {

// libtorch 1.13's CPU kernels have no fp16 convolution, matmul, activation or softmax, and a CPU
// without native bf16 products runs bf16 convolutions emulated, ~8x slower than float32: on such
// tensors (backends::widen_cpu_products) those ops run in fp32 on the widened operands and round
// their result back, so activations still travel between ops in the compute dtype.
bool needs_upcast(const at::Tensor& x) { return backends::widen_cpu_products(x); }

at::Tensor maybe_float(const at::Tensor& t, bool up) { return up ? t.to(at::kFloat) : t; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// SpatialContext: the whole image.

at::Tensor SpatialContext::pad_rows(const at::Tensor& x, int64_t halo) const {
  return at::constant_pad_nd(x, {0, 0, halo, halo}, 0.0);
}

std::pair<at::Tensor, at::Tensor> SpatialContext::group_moments(const at::Tensor& x) const {
  auto [var, mean] = at::var_mean(x, {-1}, /*unbiased=*/false);
  return {mean, var};
}

at::Tensor SpatialContext::gather_tokens(const at::Tensor& tokens) const { return tokens; }

// ---------------------------------------------------------------------------------------------
// Activations.

Activation activation_from_name(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "mish") return Activation::kMish;
  if (name == "gelu") return Activation::kGelu;
  if (name == "relu") return Activation::kRelu;
  XF_THROW("unsupported act_fn '", name, "' (known: silu, swish, mish, gelu, relu)");
}

at::Tensor apply_activation(const at::Tensor& x, Activation act) {
  const bool up = needs_upcast(x);
  at::Tensor xi = maybe_float(x, up);
  at::Tensor y;
  switch (act) {
    case Activation::kSilu:
      y = at::silu(xi);
      break;
    case Activation::kMish:
      y = at::mish(xi);
      break;
    case Activation::kGelu:
      y = at::gelu(xi);
      break;
    case Activation::kRelu:
      y = at::relu(xi);
      break;
  }
  return up ? y.to(x.scalar_type()) : y;
}

// ---------------------------------------------------------------------------------------------
// Conv2d, GroupNorm, Linear.

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
    : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {
  weight_ = &param("weight", {out_channels, in_channels, kernel_size, kernel_size});
  bias_ = &param("bias", {out_channels});
}

at::Tensor Conv2d::forward(const at::Tensor& x, int64_t stride, int64_t padding,
                           const SpatialContext* ctx) const {
  XF_CHECK(weight_->loaded(), "Conv2d used before its weights were loaded");
  XF_CHECK(x.dim() == 4 && x.size(1) == in_channels_, "Conv2d expects [B, ", in_channels_,
           ", H, W], got ", shape_string(x.sizes()));
  const bool up = needs_upcast(x);
  at::Tensor w = maybe_float(weight_->value(), up);
  at::Tensor b = maybe_float(bias_->value(), up);
  at::Tensor xi = maybe_float(x, up);
  const std::vector<int64_t> strides = {stride, stride};
  at::Tensor y;
  if (ctx != nullptr && padding > 0) {
    // [B, C, h + 2p, W]: the band with its halo rows; columns padded by the convolution.
    const std::vector<int64_t> pads = {0, padding};
    y = at::conv2d(ctx->pad_rows(xi, padding), w, b, strides, pads);
  } else {
    const std::vector<int64_t> pads = {padding, padding};
    y = at::conv2d(xi, w, b, strides, pads);
  }
  return up ? y.to(x.scalar_type()) : y;
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps)
    : groups_(groups), channels_(channels), eps_(eps) {
  XF_CHECK(groups > 0 && channels % groups == 0, "GroupNorm: ", channels,
           " channels are not divisible into ", groups, " groups (norm_num_groups)");
  weight_ = &param("weight", {channels});
  weight_->dtype = at::kFloat;
  bias_ = &param("bias", {channels});
  bias_->dtype = at::kFloat;
}

at::Tensor GroupNorm::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  XF_CHECK(weight_->loaded(), "GroupNorm used before its weights were loaded");
  XF_CHECK(x.dim() == 4 && x.size(1) == channels_, "GroupNorm expects [B, ", channels_,
           ", H, W], got ", shape_string(x.sizes()));
  const at::Tensor w = weight_->value().to(at::kFloat);
  const at::Tensor b = bias_->value().to(at::kFloat);
  // [B, C, H, W] fp32, contiguous: libtorch's composite group_norm (the kernel of devices without
  // their own, as the checked device on libtorch 2.11) views its input.
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y;
  if (ctx == nullptr) {
    y = at::group_norm(xf, groups_, w, b, eps_);
  } else {
    const int64_t batch = x.size(0);
    at::Tensor grouped = xf.reshape({batch, groups_, -1});  // [B, G, C/G * h * W]
    auto [mean, var] = ctx->group_moments(grouped);         // [B, G]
    at::Tensor normed = (grouped - mean.unsqueeze(-1)) * at::rsqrt(var.unsqueeze(-1) + eps_);
    y = normed.reshape({batch, channels_, -1}) * w.view({1, -1, 1}) + b.view({1, -1, 1});
    y = y.reshape(x.sizes());
  }
  return y.to(x.scalar_type());
}

Linear::Linear(int64_t in_features, int64_t out_features) {
  weight_ = &param("weight", {out_features, in_features});
  bias_ = &param("bias", {out_features});
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  XF_CHECK(weight_->loaded(), "Linear used before its weights were loaded");
  const bool up = needs_upcast(x);
  at::Tensor y = at::linear(maybe_float(x, up), maybe_float(weight_->value(), up),
                            maybe_float(bias_->value(), up));
  return up ? y.to(x.scalar_type()) : y;
}

// ---------------------------------------------------------------------------------------------
// Resnet, samplers, attention.

ResnetBlock2D::ResnetBlock2D(int64_t in_channels, int64_t out_channels, int64_t groups, double eps,
                             Activation act)
    : act_(act) {
  norm1_ = child("norm1", std::make_shared<GroupNorm>(groups, in_channels, eps));
  conv1_ = child("conv1", std::make_shared<Conv2d>(in_channels, out_channels, 3));
  norm2_ = child("norm2", std::make_shared<GroupNorm>(groups, out_channels, eps));
  conv2_ = child("conv2", std::make_shared<Conv2d>(out_channels, out_channels, 3));
  if (in_channels != out_channels) {
    conv_shortcut_ = child("conv_shortcut", std::make_shared<Conv2d>(in_channels, out_channels, 1));
  }
}

at::Tensor ResnetBlock2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = apply_activation(norm1_->forward(x, ctx), act_);
  h = conv1_->forward(h, 1, 1, ctx);
  h = apply_activation(norm2_->forward(h, ctx), act_);
  h = conv2_->forward(h, 1, 1, ctx);
  at::Tensor shortcut = conv_shortcut_ ? conv_shortcut_->forward(x, 1, 0) : x;
  return shortcut + h;  // output_scale_factor 1
}

Downsample2D::Downsample2D(int64_t channels) {
  conv_ = child("conv", std::make_shared<Conv2d>(channels, channels, 3));
}

at::Tensor Downsample2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  // [B, C, H + 1, W + 1] -> [B, C, H/2, W/2] (floor((H + 1 - 3) / 2) + 1)
  if (!ctx) return conv_->forward(at::constant_pad_nd(x, {0, 1, 0, 1}, 0.0), 2, 0);
  XF_CHECK(x.size(2) % 2 == 0, "patch-parallel VAE encode: a band of ", x.size(2),
           " rows reaches a downsampler (bands must be a multiple of the VAE's scale)");
  // The band and the row below it (the image's zero padding at the bottom edge); the row above
  // is not read by a stride-2 window starting on the band's first (even) row.
  const at::Tensor rows = ctx->pad_rows(x, 1).narrow(2, 1, x.size(2) + 1);
  return conv_->forward(at::constant_pad_nd(rows, {0, 1}, 0.0), 2, 0);
}

Upsample2D::Upsample2D(int64_t channels) {
  conv_ = child("conv", std::make_shared<Conv2d>(channels, channels, 3));
}

at::Tensor Upsample2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  const bool up = needs_upcast(x);
  // [B, C, H, W] -> [B, C, 2H, 2W]; out[i] = in[floor(i / 2)]: a band stays a band.
  at::Tensor y =
      at::upsample_nearest2d(maybe_float(x, up), {2 * x.size(2), 2 * x.size(3)}, 2.0, 2.0);
  if (up) y = y.to(x.scalar_type());
  return conv_->forward(y, 1, 1, ctx);
}

SpatialAttention::SpatialAttention(int64_t channels, int64_t groups, double eps)
    : channels_(channels) {
  group_norm_ = child("group_norm", std::make_shared<GroupNorm>(groups, channels, eps));
  to_q_ = child("to_q", std::make_shared<Linear>(channels, channels));
  to_k_ = child("to_k", std::make_shared<Linear>(channels, channels));
  to_v_ = child("to_v", std::make_shared<Linear>(channels, channels));
  to_out_ = child("to_out.0", std::make_shared<Linear>(channels, channels));
}

at::Tensor SpatialAttention::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  const int64_t batch = x.size(0), height = x.size(2), width = x.size(3);
  at::Tensor h = group_norm_->forward(x, ctx);
  at::Tensor tokens = h.reshape({batch, channels_, height * width}).transpose(1, 2);  // [B, S, C]
  at::Tensor q = to_q_->forward(tokens);                                              // [B, S, C]
  at::Tensor k = to_k_->forward(tokens);
  at::Tensor v = to_v_->forward(tokens);
  if (ctx != nullptr) {
    k = ctx->gather_tokens(k);  // [B, N, C]
    v = ctx->gather_tokens(v);
  }
  backends::AttentionOptions opts;
  opts.scale = 1.0 / std::sqrt(static_cast<double>(channels_));
  // One head: [B, S, 1, C].
  at::Tensor o = backends::attention(q.unsqueeze(2), k.unsqueeze(2), v.unsqueeze(2), opts).out;
  o = to_out_->forward(o.squeeze(2));                                // [B, S, C]
  o = o.transpose(1, 2).reshape({batch, channels_, height, width});  // [B, C, H, W]
  return o + x;  // residual_connection, rescale_output_factor 1
}

// ---------------------------------------------------------------------------------------------
// Blocks.

UNetMidBlock2D::UNetMidBlock2D(int64_t channels, int64_t groups, double eps, Activation act,
                               bool add_attention) {
  if (add_attention) {
    attention_ = child("attentions.0", std::make_shared<SpatialAttention>(channels, groups, eps));
  }
  resnet0_ =
      child("resnets.0", std::make_shared<ResnetBlock2D>(channels, channels, groups, eps, act));
  resnet1_ =
      child("resnets.1", std::make_shared<ResnetBlock2D>(channels, channels, groups, eps, act));
}

at::Tensor UNetMidBlock2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = resnet0_->forward(x, ctx);
  if (attention_) h = attention_->forward(h, ctx);
  return resnet1_->forward(h, ctx);
}

DownEncoderBlock2D::DownEncoderBlock2D(int64_t in_channels, int64_t out_channels, int num_layers,
                                       int64_t groups, double eps, Activation act,
                                       bool add_downsample) {
  for (int i = 0; i < num_layers; ++i) {
    resnets_.push_back(child("resnets." + std::to_string(i),
                             std::make_shared<ResnetBlock2D>(i == 0 ? in_channels : out_channels,
                                                             out_channels, groups, eps, act)));
  }
  if (add_downsample) {
    downsampler_ = child("downsamplers.0", std::make_shared<Downsample2D>(out_channels));
  }
}

at::Tensor DownEncoderBlock2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = x;
  for (const auto& r : resnets_) h = r->forward(h, ctx);
  return downsampler_ ? downsampler_->forward(h, ctx) : h;
}

UpDecoderBlock2D::UpDecoderBlock2D(int64_t in_channels, int64_t out_channels, int num_layers,
                                   int64_t groups, double eps, Activation act, bool add_upsample) {
  for (int i = 0; i < num_layers; ++i) {
    resnets_.push_back(child("resnets." + std::to_string(i),
                             std::make_shared<ResnetBlock2D>(i == 0 ? in_channels : out_channels,
                                                             out_channels, groups, eps, act)));
  }
  if (add_upsample) upsampler_ = child("upsamplers.0", std::make_shared<Upsample2D>(out_channels));
}

at::Tensor UpDecoderBlock2D::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = x;
  for (const auto& r : resnets_) h = r->forward(h, ctx);
  return upsampler_ ? upsampler_->forward(h, ctx) : h;
}

// ---------------------------------------------------------------------------------------------
// Encoder, Decoder.

namespace {
constexpr double kResnetEps = 1e-6;
}

Encoder::Encoder(const CoderConfig& c) : act_(c.act) {
  const auto& boc = c.block_out_channels;
  XF_CHECK(!boc.empty(), "Encoder: block_out_channels is empty");
  conv_in_ = child("conv_in", std::make_shared<Conv2d>(c.in_channels, boc[0], 3));
  int64_t output_channel = boc[0];
  for (size_t i = 0; i < boc.size(); ++i) {
    const int64_t input_channel = output_channel;
    output_channel = boc[i];
    down_blocks_.push_back(child(
        "down_blocks." + std::to_string(i),
        std::make_shared<DownEncoderBlock2D>(input_channel, output_channel, c.layers_per_block,
                                             c.norm_num_groups, kResnetEps, c.act,
                                             /*add_downsample=*/i + 1 != boc.size())));
  }
  mid_block_ =
      child("mid_block", std::make_shared<UNetMidBlock2D>(boc.back(), c.norm_num_groups, kResnetEps,
                                                          c.act, c.mid_block_add_attention));
  conv_norm_out_ = child("conv_norm_out",
                         std::make_shared<GroupNorm>(c.norm_num_groups, boc.back(), kResnetEps));
  conv_out_ = child("conv_out", std::make_shared<Conv2d>(boc.back(), 2 * c.out_channels, 3));
}

at::Tensor Encoder::forward(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = conv_in_->forward(x, 1, 1, ctx);
  for (const auto& b : down_blocks_) h = b->forward(h, ctx);
  h = mid_block_->forward(h, ctx);
  h = apply_activation(conv_norm_out_->forward(h, ctx), act_);
  return conv_out_->forward(h, 1, 1, ctx);
}

Decoder::Decoder(const CoderConfig& c) : act_(c.act) {
  const auto& boc = c.block_out_channels;
  XF_CHECK(!boc.empty(), "Decoder: block_out_channels is empty");
  conv_in_ = child("conv_in", std::make_shared<Conv2d>(c.in_channels, boc.back(), 3));
  std::vector<int64_t> reversed(boc.rbegin(), boc.rend());
  int64_t output_channel = reversed[0];
  // diffusers registers up_blocks (an empty ModuleList) before mid_block: keep its order.
  for (size_t i = 0; i < reversed.size(); ++i) {
    const int64_t prev_output_channel = output_channel;
    output_channel = reversed[i];
    up_blocks_.push_back(child(
        "up_blocks." + std::to_string(i),
        std::make_shared<UpDecoderBlock2D>(prev_output_channel, output_channel,
                                           c.layers_per_block + 1, c.norm_num_groups, kResnetEps,
                                           c.act, /*add_upsample=*/i + 1 != reversed.size())));
  }
  mid_block_ =
      child("mid_block", std::make_shared<UNetMidBlock2D>(boc.back(), c.norm_num_groups, kResnetEps,
                                                          c.act, c.mid_block_add_attention));
  conv_norm_out_ =
      child("conv_norm_out", std::make_shared<GroupNorm>(c.norm_num_groups, boc[0], kResnetEps));
  conv_out_ = child("conv_out", std::make_shared<Conv2d>(boc[0], c.out_channels, 3));
}

at::Tensor Decoder::forward(const at::Tensor& z, const SpatialContext* ctx) const {
  at::Tensor h = conv_in_->forward(z, 1, 1, ctx);  // [B, C_last, h, w]
  h = mid_block_->forward(h, ctx);
  for (const auto& b : up_blocks_) h = b->forward(h, ctx);  // [B, C_0, h*f, w*f]
  h = apply_activation(conv_norm_out_->forward(h, ctx), act_);
  return conv_out_->forward(h, 1, 1, ctx);  // [B, out, h*f, w*f]
}

int64_t Decoder::upscale_factor() const {
  int64_t f = 1;
  for (const auto& b : up_blocks_) f *= b->upsamples() ? 2 : 1;
  return f;
}

}  // namespace xfuser::models::vae
