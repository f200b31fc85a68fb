// Small reusable building blocks with diffusers' parameter names and math, shared by the model
// families (FLUX, SD3, Wan, HunyuanVideo): linear layers, norms, timestep and text embeddings,
// feed-forward blocks, AdaLN modulation, rotary position embeddings and the attention hook.
//
// Dtypes: parameters live in the model dtype chosen at load. Norm statistics, the sinusoidal
// timestep embedding, RoPE tables and rotations are computed in float32 and cast back, as
// diffusers does; everything else runs in the input dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/tensor_util.h"
#include "models/common/module.h"

namespace xfuser::models {

// ---- activations --------------------------------------------------------------------------------

enum class Activation { kSilu, kGelu, kGeluTanh, kRelu, kIdentity };

// Parses diffusers' names: "silu"/"swish", "gelu",
// "gelu_tanh"/"gelu-approximate"/"gelu_pytorch_tanh", "relu", "linear"/"identity". Unknown names
// are an error listing the accepted ones.
Activation parse_activation(const std::string& name);
at::Tensor activate(const at::Tensor& x, Activation act);

// ---- Linear, norms ------------------------------------------------------------------------------

// y = x W^T + b over a Linear layer's parameter slots, whatever their format (module.h's
// WeightFormat): the load dtype, fp8 storage (decoded per call), or fp8 with per-channel scales
// (backends::fp8_linear). float16 on the CPU runs in float32 and rounds back (libtorch's CPU
// kernels lack float16 matmul). `bias` may be null. Every Linear-like layer goes through here.
at::Tensor linear(const at::Tensor& x, const ParamSlot& weight, const ParamSlot* bias);
// The same on decoded tensors (a convolution run as a matmul over patches); `b` may be undefined.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

// nn.Linear: `weight` [out, in], optional `bias` [out].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;  // [..., in] -> [..., out]
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // The weight and bias in the compute dtype (decoded when held in fp8); bias undefined when
  // there is none.
  at::Tensor weight() const { return weight_->value(); }
  at::Tensor bias() const;
  // The compute dtype of the layer (its weight's).
  c10::ScalarType dtype() const { return weight_->compute_dtype(); }

 private:
  int64_t in_, out_;
  ParamSlot* weight_;
  ParamSlot* bias_ = nullptr;
};

// diffusers RMSNorm: var = mean(x^2) in float32, x * rsqrt(var + eps), cast to the weight dtype,
// times `weight` [dim] (when affine); without weight the result is cast back to x's dtype.
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps, bool elementwise_affine = true);
  at::Tensor forward(const at::Tensor& x) const;  // normalizes the last dim

 private:
  int64_t dim_;
  double eps_;
  ParamSlot* weight_ = nullptr;
};

// nn.LayerNorm over the last dim, statistics in float32; optional `weight`/`bias` [dim].
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps, bool elementwise_affine = true, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  int64_t dim_;
  double eps_;
  ParamSlot* weight_ = nullptr;
  ParamSlot* bias_ = nullptr;
};

// LayerNorm without affine parameters over the last dim, float32 statistics, x's dtype out.
at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps);

// ---- timestep and text embeddings
// -----------------------------------------------------------------

// diffusers get_timestep_embedding / Timesteps: for t [N] (any dtype, read as float32),
// f_k = exp(-ln(max_period) * k / (dim/2 - downscale_freq_shift)), arg = scale * t * f_k,
// emb = [sin || cos] ([cos || sin] with flip_sin_to_cos), zero-padded when dim is odd.
// Computed in float32 in diffusers' operation order; returns float32 [N, dim].
at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos,
                              double downscale_freq_shift, double scale = 1.0,
                              double max_period = 10000.0);

// TimestepEmbedding: linear_1 (in -> dim), act, linear_2 (dim -> out_dim or dim).
class TimestepEmbedding : public Module {
 public:
  TimestepEmbedding(int64_t in_channels, int64_t time_embed_dim, Activation act = Activation::kSilu,
                    std::optional<int64_t> out_dim = std::nullopt);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::shared_ptr<Linear> linear_1_, linear_2_;
  Activation act_;
};

// PixArtAlphaTextProjection: linear_1 (in -> hidden), act, linear_2 (hidden -> out or hidden).
class PixArtAlphaTextProjection : public Module {
 public:
  PixArtAlphaTextProjection(int64_t in_features, int64_t hidden_size,
                            Activation act = Activation::kGeluTanh,
                            std::optional<int64_t> out_features = std::nullopt);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::shared_ptr<Linear> linear_1_, linear_2_;
  Activation act_;
};

// ---- feed-forward -------------------------------------------------------------------------------

// diffusers FeedForward activation_fn values.
enum class FeedForwardKind {
  kGelu,              // "gelu": net.0.proj, erf GELU
  kGeluApproximate,   // "gelu-approximate": net.0.proj, tanh GELU
  kGeglu,             // "geglu": net.0.proj -> 2*inner, h * gelu(gate)
  kGegluApproximate,  // "geglu-approximate": as geglu with tanh GELU
  kSwiglu,            // "swiglu": net.0.proj -> 2*inner, h * silu(gate)
  kLinearSilu,        // "linear-silu": net.0.proj then SiLU
};
FeedForwardKind parse_feed_forward_kind(const std::string& name);
// The activation between a feed-forward's two projections (the gated kinds: first half times the
// activated second half), on the up-projection's output h.
at::Tensor feed_forward_activation(const at::Tensor& h, FeedForwardKind kind);

// FeedForward: `net.0.proj` (dim -> inner, or 2*inner for gated kinds), activation, dropout
// (net.1, inference: identity), `net.2` (inner -> dim_out). inner = inner_dim or mult*dim.
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, std::optional<int64_t> dim_out = std::nullopt, double mult = 4.0,
              FeedForwardKind kind = FeedForwardKind::kGeglu,
              std::optional<int64_t> inner_dim = std::nullopt, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::shared_ptr<Linear> proj_, out_;
  FeedForwardKind kind_;
};

// ---- AdaLN modulation
// -----------------------------------------------------------------------------

// AdaLayerNormZero: emb = linear(SiLU(temb)) [B, 6D] chunked into shift_msa, scale_msa,
// gate_msa, shift_mlp, scale_mlp, gate_mlp; x = LN_eps(x) * (1 + scale_msa) + shift_msa.
class AdaLayerNormZero : public Module {
 public:
  struct Output {
    at::Tensor x;                                         // [B, S, D] modulated
    at::Tensor gate_msa, shift_mlp, scale_mlp, gate_mlp;  // [B, D] each
  };
  explicit AdaLayerNormZero(int64_t dim, double eps = 1e-6, bool bias = true);
  Output forward(const at::Tensor& x, const at::Tensor& temb) const;  // x [B, S, D], temb [B, D]

 private:
  std::shared_ptr<Linear> linear_;
  double eps_;
};

// AdaLayerNormZeroSingle: emb = linear(SiLU(temb)) [B, 3D] -> shift, scale, gate.
class AdaLayerNormZeroSingle : public Module {
 public:
  struct Output {
    at::Tensor x;     // [B, S, D] modulated
    at::Tensor gate;  // [B, D]
  };
  explicit AdaLayerNormZeroSingle(int64_t dim, double eps = 1e-6, bool bias = true);
  Output forward(const at::Tensor& x, const at::Tensor& temb) const;

 private:
  std::shared_ptr<Linear> linear_;
  double eps_;
};

// AdaLayerNormContinuous: emb = linear(SiLU(cond).to(x dtype)) [B, 2D] -> **scale, shift**;
// x = LN(x) * (1 + scale) + shift. LN with or without affine (`norm.weight`/`norm.bias`).
class AdaLayerNormContinuous : public Module {
 public:
  AdaLayerNormContinuous(int64_t dim, int64_t conditioning_dim, bool elementwise_affine, double eps,
                         bool bias = true);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond) const;

 private:
  std::shared_ptr<Linear> linear_;
  std::shared_ptr<LayerNorm> norm_;  // null without affine
  double eps_;
};

// ---- rotary position embeddings
// ------------------------------------------------------------------

struct RotaryTables {
  at::Tensor cos;  // [S, dim] float32
  at::Tensor sin;  // [S, dim] float32
};

// diffusers get_1d_rotary_pos_embed(dim, pos, theta, use_real=True, ...): w_j = 1/theta'^(2j/dim)
// / linear_factor with theta' = theta * ntk_factor, angle = pos (x) w in float64; cos and sin
// repeat_interleave(2) on the last dim (repeat_interleave_real, FLUX/Hunyuan) or concatenated
// twice (otherwise), returned as float32 [S, dim]. `pos` [S] is read as float64 (callers that
// mirror diffusers' `ids.float()` round to float32 first).
RotaryTables rotary_pos_embed_1d(int64_t dim, const at::Tensor& pos, double theta = 10000.0,
                                 bool repeat_interleave_real = true, double linear_factor = 1.0,
                                 double ntk_factor = 1.0);

// Multi-axis RoPE (FluxPosEmbed): ids [S, n_axes] (float, rounded to float32 first as diffusers
// does); per-axis tables concatenated on the last dim: [S, sum(axes_dims)].
RotaryTables multi_axis_rope(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                             double theta = 10000.0);

enum class RotaryPairing {
  kInterleaved,  // pairs (2i, 2i+1) (diffusers use_real_unbind_dim=-1: FLUX, Hunyuan, Wan)
  kHalfSplit,    // pairs (i, i + D/2) (use_real_unbind_dim=-2)
};

// x + gate[:, None] * y in one pass (x, y [B, S, D], gate [B, D]): the gated residual of AdaLN
// blocks.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// apply_rotary_emb on x [B, S, H, D] with tables [S, D] or [B, S, D]:
// out = x * cos + rotate(x) * sin in float32 (rotate: (a, b) -> (-b, a) per pair), cast to x's
// dtype.
at::Tensor apply_rotary_emb(const at::Tensor& x, const RotaryTables& rope,
                            RotaryPairing pairing = RotaryPairing::kInterleaved);
// The same on q and k together (interleaved pairs), through the thread's kernel table
// (models/common/kernels.h): the fused override when the backend has one.
std::pair<at::Tensor, at::Tensor> apply_rotary_emb_qk(const at::Tensor& q, const at::Tensor& k,
                                                      const RotaryTables& rope);

// ---- attention hook -----------------------------------------------------------------------------

// What a model tells the attention hook about one attention call. q/k/v are [B, S, H, D] after
// projections, QK norms and RoPE; the hook returns [B, Sq, H, Dv] in q's dtype.
struct AttentionCall {
  int64_t layer = 0;        // index of this attention layer in model order (0-based)
  int64_t text_tokens = 0;  // joint attention: tokens of the text stream in the sequence
  bool text_first = true;   // [text, image] (FLUX) or [image, text] (SD3, HunyuanVideo)
  at::Tensor mask;          // optional boolean mask, as backends::AttentionOptions::mask
  // Joint attention with masked text keys: [B, text_tokens] bool, true = the text key is
  // attended (every image key is). A model that sets it sets `mask` to the same keys over the
  // whole sequence, for the local path; the sequence-parallel drivers use this one (the text is
  // whole on every rank, the image keys are spread over the ranks).
  at::Tensor text_key_mask;
  // Cross-attention (Wan): q from the image tokens, k/v from the text only. Sequence-parallel
  // drivers keep the text whole on every rank and run such calls locally.
  bool cross = false;
};

using AttentionHook = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const AttentionCall& call)>;

// The default hook: the local backends::attention op.
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call);

// "[1, 16, 4]" for error messages (backends/tensor_util.h).
using ::xfuser::shape_string;

}  // namespace xfuser::models
