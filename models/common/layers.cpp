#include "models/common/layers.h"

#include <cmath>
#include <sstream>

#include <ATen/ATen.h>

#include "backends/attention.h"
#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/fp8.h"
#include "backends/tensor_util.h"
#include "models/common/kernels.h"

namespace xfuser::models {
namespace {

// libtorch's CPU kernels lack float16 matmul and some activations: run those in float32 and
// round back (CUDA and other dtypes run natively).
bool is_cpu_half(const at::Tensor& x) { return x.scalar_type() == at::kHalf && !x.is_cuda(); }

}  // namespace

// ---- activations --------------------------------------------------------------------------------

Activation parse_activation(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh" || name == "gelu-approximate" || name == "gelu_pytorch_tanh" ||
      name == "gelu_new")
    return Activation::kGeluTanh;
  if (name == "relu") return Activation::kRelu;
  if (name == "linear" || name == "identity") return Activation::kIdentity;
  XF_THROW("unknown activation '", name,
           "' (accepted: silu, swish, gelu, gelu_tanh, gelu-approximate, gelu_pytorch_tanh, "
           "gelu_new, relu, linear, identity)");
}

at::Tensor activate(const at::Tensor& x, Activation act) {
  if (is_cpu_half(x) && act != Activation::kIdentity) {
    return activate(x.to(at::kFloat), act).to(at::kHalf);
  }
  switch (act) {
    case Activation::kSilu:
      return at::silu(x);
    case Activation::kGelu:
      return at::gelu(x);
    case Activation::kGeluTanh:
      return at::gelu(x, "tanh");
    case Activation::kRelu:
      return at::relu(x);
    case Activation::kIdentity:
      return x;
  }
  XF_THROW("invalid activation value ", static_cast<int>(act));
}

// ---- Linear, norms ------------------------------------------------------------------------------

at::Tensor linear(const at::Tensor& x, const ParamSlot& weight, const ParamSlot* bias) {
  const at::Tensor b = bias ? bias->value() : at::Tensor();
  weight.ensure_resident();
  at::Tensor y;
  if (weight.fp8 && weight.fp8->scale.defined()) {
    y = backends::fp8_linear(x, weight.fp8->data, weight.fp8->scale, b, weight.fp8->format,
                             x.scalar_type());
  } else {
    y = linear(x, weight.value(), b);
  }
  // Unfused LoRA adapters run beside the weight (models/common/lora.h).
  return weight.lora.empty() ? y : add_lora(x, std::move(y), weight.lora);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (backends::widen_cpu_products(x)) {  // CPU fp16, or bf16 without native bf16 products
    return at::linear(x.to(at::kFloat), w.to(at::kFloat), b.defined() ? b.to(at::kFloat) : b)
        .to(x.scalar_type());
  }
  return at::linear(x, w, b);
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features) {
  weight_ = &param("weight", {out_features, in_features});
  weight_->layer = LayerKind::kLinear;
  if (bias) {
    bias_ = &param("bias", {out_features});
    bias_->layer = LayerKind::kLinear;
  }
}

at::Tensor Linear::bias() const { return bias_ ? bias_->value() : at::Tensor(); }

at::Tensor Linear::forward(const at::Tensor& x) const {
  XF_CHECK(weight_->loaded(), "Linear [", out_, ", ", in_, "] used before loading");
  XF_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear expects [..., ", in_, "], got ",
           shape_string(x.sizes()));
  return linear(x, *weight_, bias_);
}

RMSNorm::RMSNorm(int64_t dim, double eps, bool elementwise_affine) : dim_(dim), eps_(eps) {
  if (elementwise_affine) weight_ = &param("weight", {dim});
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  XF_CHECK(x.size(-1) == dim_, "RMSNorm(", dim_, ") got ", shape_string(x.sizes()));
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  auto y = xf * at::rsqrt(var + eps_);
  if (!weight_) return y.to(x.scalar_type());
  const auto& w = weight_->value();
  if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) y = y.to(w.scalar_type());
  return (y * w).to(x.scalar_type());
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine, bool bias)
    : dim_(dim), eps_(eps) {
  if (elementwise_affine) {
    weight_ = &param("weight", {dim});
    if (bias) bias_ = &param("bias", {dim});
  }
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  XF_CHECK(x.size(-1) == dim_, "LayerNorm(", dim_, ") got ", shape_string(x.sizes()));
  at::Tensor w, b;
  if (weight_) w = weight_->value().to(at::kFloat);
  if (bias_) b = bias_->value().to(at::kFloat);
  return at::layer_norm(x.to(at::kFloat), {dim_}, w, b, eps_).to(x.scalar_type());
}

at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps).to(x.scalar_type());
}

// ---- timestep and text embeddings
// -----------------------------------------------------------------

at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos,
                              double downscale_freq_shift, double scale, double max_period) {
  XF_CHECK(timesteps.dim() == 1, "timestep embedding expects a 1-D tensor of timesteps, got ",
           shape_string(timesteps.sizes()));
  const int64_t half = dim / 2;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(timesteps.device());
  // Same float32 operation order as diffusers' get_timestep_embedding.
  auto exponent = at::arange(0, half, f32) * (-std::log(max_period));
  exponent = exponent / (static_cast<double>(half) - downscale_freq_shift);
  auto freqs = exponent.exp();                                            // [half]
  auto emb = timesteps.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);  // [N, half]
  if (scale != 1.0) emb = emb * scale;
  emb = at::cat({emb.sin(), emb.cos()}, -1);
  if (flip_sin_to_cos) emb = at::cat({emb.narrow(1, half, half), emb.narrow(1, 0, half)}, -1);
  if (dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1, 0, 0});
  return emb;  // [N, dim] float32
}

TimestepEmbedding::TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim, Activation act,
                                     std::optional<int64_t> out_dim)
    : act_(act) {
  linear_1_ = child("linear_1", std::make_shared<Linear>(in_channels, time_embed_dim));
  linear_2_ =
      child("linear_2", std::make_shared<Linear>(time_embed_dim, out_dim.value_or(time_embed_dim)));
}

at::Tensor TimestepEmbedding::forward(const at::Tensor& x) const {
  return linear_2_->forward(activate(linear_1_->forward(x), act_));
}

PixArtAlphaTextProjection::PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size,
                                                     Activation act,
                                                     std::optional<int64_t> out_features)
    : act_(act) {
  linear_1_ = child("linear_1", std::make_shared<Linear>(in_features, hidden_size));
  linear_2_ =
      child("linear_2", std::make_shared<Linear>(hidden_size, out_features.value_or(hidden_size)));
}

at::Tensor PixArtAlphaTextProjection::forward(const at::Tensor& x) const {
  return linear_2_->forward(activate(linear_1_->forward(x), act_));
}

// ---- feed-forward -------------------------------------------------------------------------------

FeedForwardKind parse_feed_forward_kind(const std::string& name) {
  if (name == "gelu") return FeedForwardKind::kGelu;
  if (name == "gelu-approximate") return FeedForwardKind::kGeluApproximate;
  if (name == "geglu") return FeedForwardKind::kGeglu;
  if (name == "geglu-approximate") return FeedForwardKind::kGegluApproximate;
  if (name == "swiglu") return FeedForwardKind::kSwiglu;
  if (name == "linear-silu") return FeedForwardKind::kLinearSilu;
  XF_THROW("unknown FeedForward activation_fn '", name,
           "' (accepted: gelu, gelu-approximate, geglu, geglu-approximate, swiglu, linear-silu)");
}

namespace {
bool is_gated(FeedForwardKind kind) {
  switch (kind) {
    case FeedForwardKind::kGeglu:
    case FeedForwardKind::kGegluApproximate:
    case FeedForwardKind::kSwiglu:
      return true;
    case FeedForwardKind::kGelu:
    case FeedForwardKind::kGeluApproximate:
    case FeedForwardKind::kLinearSilu:
      return false;
  }
  return false;
}
}  // namespace

FeedForward::FeedForward(int64_t dim, std::optional<int64_t> dim_out, double mult,
                         FeedForwardKind kind, std::optional<int64_t> inner_dim, bool bias)
    : kind_(kind) {
  const int64_t inner = inner_dim.value_or(static_cast<int64_t>(dim * mult));
  proj_ =
      child("net.0.proj", std::make_shared<Linear>(dim, is_gated(kind) ? 2 * inner : inner, bias));
  out_ = child("net.2", std::make_shared<Linear>(inner, dim_out.value_or(dim), bias));
}

at::Tensor feed_forward_activation(const at::Tensor& h, FeedForwardKind kind) {
  switch (kind) {
    case FeedForwardKind::kGelu:
      return activate(h, Activation::kGelu);
    case FeedForwardKind::kGeluApproximate:
      return activate(h, Activation::kGeluTanh);
    case FeedForwardKind::kLinearSilu:
      return activate(h, Activation::kSilu);
    case FeedForwardKind::kGeglu:
    case FeedForwardKind::kGegluApproximate:
    case FeedForwardKind::kSwiglu: {
      auto parts = h.chunk(2, -1);  // hidden, gate
      const Activation act = kind == FeedForwardKind::kSwiglu  ? Activation::kSilu
                             : kind == FeedForwardKind::kGeglu ? Activation::kGelu
                                                               : Activation::kGeluTanh;
      return parts[0] * activate(parts[1], act);
    }
  }
  XF_THROW("invalid feed-forward kind ", static_cast<int>(kind));
}

at::Tensor FeedForward::forward(const at::Tensor& x) const {
  return out_->forward(feed_forward_activation(proj_->forward(x), kind_));
}

// ---- AdaLN modulation
// -----------------------------------------------------------------------------

namespace {
void check_modulation_inputs(const char* what, const at::Tensor& x, const at::Tensor& temb,
                             int64_t dim) {
  XF_CHECK(x.dim() == 3 && x.size(2) == dim, what, ": x must be [B, S, ", dim, "], got ",
           shape_string(x.sizes()));
  XF_CHECK(temb.dim() == 2 && (temb.size(0) == x.size(0) || temb.size(0) == 1), what,
           ": conditioning must be [B, D] with B = ", x.size(0), ", got ",
           shape_string(temb.sizes()));
}
}  // namespace

AdaLayerNormZero::AdaLayerNormZero(int64_t dim, double eps, bool bias) : eps_(eps) {
  linear_ = child("linear", std::make_shared<Linear>(dim, 6 * dim, bias));
}

AdaLayerNormZero::Output AdaLayerNormZero::forward(const at::Tensor& x,
                                                   const at::Tensor& temb) const {
  check_modulation_inputs("AdaLayerNormZero", x, temb, linear_->in_features());
  auto emb = linear_->forward(activate(temb, Activation::kSilu));  // [B, 6D]
  auto c = emb.chunk(6, 1);
  Output o;
  o.x = kernels().norm_modulate(x, c[0], c[1], eps_);
  o.gate_msa = c[2];
  o.shift_mlp = c[3];
  o.scale_mlp = c[4];
  o.gate_mlp = c[5];
  return o;
}

AdaLayerNormZeroSingle::AdaLayerNormZeroSingle(int64_t dim, double eps, bool bias) : eps_(eps) {
  linear_ = child("linear", std::make_shared<Linear>(dim, 3 * dim, bias));
}

AdaLayerNormZeroSingle::Output AdaLayerNormZeroSingle::forward(const at::Tensor& x,
                                                               const at::Tensor& temb) const {
  check_modulation_inputs("AdaLayerNormZeroSingle", x, temb, linear_->in_features());
  auto emb = linear_->forward(activate(temb, Activation::kSilu));  // [B, 3D]
  auto c = emb.chunk(3, 1);
  return {kernels().norm_modulate(x, c[0], c[1], eps_), c[2]};
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, int64_t conditioning_dim,
                                               bool elementwise_affine, double eps, bool bias)
    : eps_(eps) {
  linear_ = child("linear", std::make_shared<Linear>(conditioning_dim, 2 * dim, bias));
  if (elementwise_affine) norm_ = child("norm", std::make_shared<LayerNorm>(dim, eps, true, bias));
}

at::Tensor AdaLayerNormContinuous::forward(const at::Tensor& x, const at::Tensor& cond) const {
  check_modulation_inputs("AdaLayerNormContinuous", x, cond, linear_->out_features() / 2);
  auto emb = linear_->forward(activate(cond, Activation::kSilu).to(x.scalar_type()));  // [B, 2D]
  auto c = emb.chunk(2, 1);  // scale, shift
  auto n = norm_ ? norm_->forward(x) : layer_norm_no_affine(x, eps_);
  return n * (1 + c[0].unsqueeze(1)) + c[1].unsqueeze(1);
}

// ---- rotary position embeddings
// ------------------------------------------------------------------

RotaryTables rotary_pos_embed_1d(int64_t dim, const at::Tensor& pos, double theta,
                                 bool repeat_interleave_real, double linear_factor,
                                 double ntk_factor) {
  XF_CHECK(dim % 2 == 0 && dim > 0, "rotary embedding dim must be even and positive, got ", dim);
  XF_CHECK(pos.dim() == 1, "rotary positions must be 1-D [S], got ", shape_string(pos.sizes()));
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(pos.device());
  auto exponent = at::arange(0, dim, 2, f64).narrow(0, 0, dim / 2) / static_cast<double>(dim);
  auto freqs = 1.0 / at::pow(theta * ntk_factor, exponent) / linear_factor;  // [dim/2]
  auto angles = at::outer(pos.to(at::kDouble), freqs);                       // [S, dim/2]
  if (repeat_interleave_real) {
    return {angles.cos().repeat_interleave(2, 1).to(at::kFloat),
            angles.sin().repeat_interleave(2, 1).to(at::kFloat)};
  }
  auto c = angles.cos(), s = angles.sin();
  return {at::cat({c, c}, -1).to(at::kFloat), at::cat({s, s}, -1).to(at::kFloat)};
}

RotaryTables multi_axis_rope(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                             double theta) {
  XF_CHECK(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dims.size()),
           "rotary ids must be [S, ", axes_dims.size(), "], got ", shape_string(ids.sizes()));
  auto pos = ids.to(at::kFloat);  // diffusers: ids.float()
  std::vector<at::Tensor> cos, sin;
  for (size_t i = 0; i < axes_dims.size(); ++i) {
    auto t = rotary_pos_embed_1d(axes_dims[i], pos.select(1, static_cast<int64_t>(i)), theta, true);
    cos.push_back(t.cos);
    sin.push_back(t.sin);
  }
  return {at::cat(cos, -1), at::cat(sin, -1)};
}

at::Tensor apply_rotary_emb(const at::Tensor& x, const RotaryTables& rope, RotaryPairing pairing) {
  XF_CHECK(x.dim() == 4, "apply_rotary_emb expects x [B, S, H, D], got ", shape_string(x.sizes()));
  const int64_t s = x.size(1), d = x.size(3);
  XF_CHECK(d % 2 == 0, "apply_rotary_emb needs an even head dim, got ", d);
  auto check_table = [&](const at::Tensor& t, const char* name) {
    XF_CHECK((t.dim() == 2 && t.size(0) == s && t.size(1) == d) ||
                 (t.dim() == 3 && (t.size(0) == x.size(0) || t.size(0) == 1) && t.size(1) == s &&
                  t.size(2) == d),
             "apply_rotary_emb: ", name, " table ", shape_string(t.sizes()), " does not match x ",
             shape_string(x.sizes()), " (expected [S, D] or [B, S, D])");
  };
  check_table(rope.cos, "cos");
  check_table(rope.sin, "sin");
  auto cos = rope.cos.to(at::kFloat).unsqueeze(-2);  // [(B,) S, 1, D]
  auto sin = rope.sin.to(at::kFloat).unsqueeze(-2);
  at::Tensor rotated;
  if (pairing == RotaryPairing::kInterleaved) {
    auto pairs = x.reshape({x.size(0), s, x.size(2), d / 2, 2});
    auto re = pairs.select(-1, 0), im = pairs.select(-1, 1);
    rotated = at::stack({im.neg(), re}, -1).flatten(3);  // [B, S, H, D]
  } else {
    auto re = x.narrow(-1, 0, d / 2), im = x.narrow(-1, d / 2, d / 2);
    rotated = at::cat({im.neg(), re}, -1);
  }
  return (x.to(at::kFloat) * cos + rotated.to(at::kFloat) * sin).to(x.scalar_type());
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  if (is_cpu_half(x)) return x + gate.unsqueeze(1) * y;  // libtorch 1.13: no CPU fp16 addcmul
  return at::addcmul(x, gate.unsqueeze(1), y);
}

std::pair<at::Tensor, at::Tensor> apply_rotary_emb_qk(const at::Tensor& q, const at::Tensor& k,
                                                      const RotaryTables& rope) {
  if (rope.cos.dim() == 2) return kernels().rope_qk(q, k, rope.cos, rope.sin);
  return {apply_rotary_emb(q, rope), apply_rotary_emb(k, rope)};  // per-batch tables
}

// ---- attention hook -----------------------------------------------------------------------------

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) {
  backends::AttentionOptions opts;
  opts.mask = call.mask;
  return backends::attention(q, k, v, opts).out;
}

}  // namespace xfuser::models
