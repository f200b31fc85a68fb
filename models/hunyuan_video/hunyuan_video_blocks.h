// HunyuanVideoTransformer3DModel's building blocks (diffusers v0.33.1), shared with the
// HunyuanVideo-1.5 transformer (models/hunyuan_video15/), which has the same module trees and
// parameter names for them: the timestep / pooled-text conditioning, the token refiner, the patch
// embedding, the QK-normed joint attention and the double-stream block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/common/kernels.h"
#include "models/common/layers.h"
#include "models/common/tensor_parallel.h"
#include "models/hunyuan_video/hunyuan_video_config.h"

namespace xfuser::models::hunyuan_video {

inline constexpr double kNormEps = 1e-6;
inline constexpr int64_t kTimestepChannels = 256;
// HunyuanVideoTokenRefiner builds its blocks with mlp_width_ratio's default, not config.mlp_ratio.
inline constexpr double kRefinerMlpRatio = 4.0;

// [B, S, H*hd] -> [B, S, H, hd]
inline at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads});
}

using AttendFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const AttentionCall&)>;

// The key mask [B, n + L] of the joint [image, text] sequence: every image key, the text keys of
// `text_keys` [B, L]; undefined when no text key is masked.
inline at::Tensor joint_key_mask(const at::Tensor& text_keys, int64_t image_tokens) {
  if (!text_keys.defined()) return {};
  auto image = at::ones({text_keys.size(0), image_tokens}, text_keys.options());
  return at::cat({image, text_keys}, 1);
}

// ---- embedders ----------------------------------------------------------------------------------

// HunyuanVideoConditionEmbedding (image_condition_type null / latent_concat): Timesteps(256,
// flip_sin_to_cos, shift 0) -> timestep_embedder; text_embedder (PixArtAlphaTextProjection,
// SiLU) of the pooled projection; + guidance_embedder(Timesteps(guidance)) with guidance_embeds.
// Also CombinedTimestepTextProjEmbeddings (the token refiner's), without the guidance.
class HunyuanVideoConditionEmbedding : public Module {
 public:
  HunyuanVideoConditionEmbedding(int64_t dim, int64_t pooled_dim, bool guidance) {
    timestep_embedder_ =
        child("timestep_embedder", std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
    text_embedder_ = child("text_embedder", std::make_shared<PixArtAlphaTextProjection>(
                                                pooled_dim, dim, Activation::kSilu));
    if (guidance) {
      guidance_embedder_ =
          child("guidance_embedder", std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
    }
  }
  c10::ScalarType dtype() const {
    const auto* w = timestep_embedder_->named_parameters().front().second;
    XF_CHECK(w->loaded(), "HunyuanVideoTransformer3DModel used before its weights were loaded");
    return w->compute_dtype();
  }
  // timestep [B|1], pooled [B, P] (the model dtype), guidance [B|1] or undefined -> [B, D].
  at::Tensor forward(const at::Tensor& timestep, const at::Tensor& pooled,
                     const at::Tensor& guidance) const {
    const auto dtype = pooled.scalar_type();
    auto t = timestep_embedding(timestep, kTimestepChannels, true, 0.0).to(dtype);
    auto cond = timestep_embedder_->forward(t) + text_embedder_->forward(pooled);
    if (guidance_embedder_) {
      auto g = timestep_embedding(guidance, kTimestepChannels, true, 0.0).to(dtype);
      cond = cond + guidance_embedder_->forward(g);
    }
    return cond;
  }

 private:
  std::shared_ptr<TimestepEmbedding> timestep_embedder_, guidance_embedder_;
  std::shared_ptr<PixArtAlphaTextProjection> text_embedder_;
};

// HunyuanVideoIndividualTokenRefinerBlock: norm1 (LayerNorm, affine), attn (diffusers Attention
// with AttnProcessor2_0: to_q/k/v, to_out.0, biases, no QK norm), norm2, ff (FeedForward
// linear-silu), norm_out.linear (HunyuanVideoAdaNorm: SiLU(temb) -> [gate_msa | gate_mlp]).
class RefinerBlock : public Module {
 public:
  RefinerBlock(int64_t dim, int64_t heads) : heads_(heads) {
    norm1_ = child("norm1", std::make_shared<LayerNorm>(dim, kNormEps));
    to_q_ = child("attn.to_q", std::make_shared<Linear>(dim, dim));
    to_k_ = child("attn.to_k", std::make_shared<Linear>(dim, dim));
    to_v_ = child("attn.to_v", std::make_shared<Linear>(dim, dim));
    to_out_ = child("attn.to_out.0", std::make_shared<Linear>(dim, dim));
    norm2_ = child("norm2", std::make_shared<LayerNorm>(dim, kNormEps));
    ff_ = child("ff", std::make_shared<FeedForward>(dim, dim, kRefinerMlpRatio,
                                                    FeedForwardKind::kLinearSilu));
    norm_out_ = child("norm_out.linear", std::make_shared<Linear>(dim, 2 * dim));
  }
  // x [B, L, D], temb [B|1, D], mask [B, 1, L, L] bool or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& mask) const {
    const int64_t b = x.size(0), l = x.size(1), d = x.size(2);
    auto n = norm1_->forward(x);
    AttentionCall call;
    call.mask = mask;
    auto o = local_attention(split_heads(to_q_->forward(n), heads_),
                             split_heads(to_k_->forward(n), heads_),
                             split_heads(to_v_->forward(n), heads_), call)
                 .reshape({b, l, d});
    o = to_out_->forward(o);
    auto gates = norm_out_->forward(activate(temb, Activation::kSilu)).chunk(2, 1);
    auto h = x + o * gates[0].unsqueeze(1);
    return h + ff_->forward(norm2_->forward(h)) * gates[1].unsqueeze(1);
  }

 private:
  int64_t heads_;
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, to_out_, norm_out_;
  std::shared_ptr<FeedForward> ff_;
};

// HunyuanVideoTokenRefiner: time_text_embed (CombinedTimestepTextProjEmbeddings of the masked
// mean of the text), proj_in, token_refiner.refiner_blocks. `key_zero_visible` (HunyuanVideo
// 1.0): query i sees key j when both are valid, and every query sees key 0. Without it
// (HunyuanVideo-1.5's HunyuanVideo15TokenRefiner, the same module tree): every query sees the
// valid keys. 1.5 masks the pairs (i, j) both valid, which leaves the rows of the padded queries
// fully masked; the model zeroes those tokens right after the refiner, so only the valid queries'
// rows matter, and they are the same (the padded rows stay finite here).
class HunyuanVideoTokenRefiner : public Module {
 public:
  HunyuanVideoTokenRefiner(int64_t in_channels, int64_t heads, int64_t head_dim, int64_t layers,
                           bool key_zero_visible = true)
      : key_zero_visible_(key_zero_visible) {
    const int64_t dim = heads * head_dim;
    time_text_embed_ = child("time_text_embed", std::make_shared<HunyuanVideoConditionEmbedding>(
                                                    dim, in_channels, false));
    proj_in_ = child("proj_in", std::make_shared<Linear>(in_channels, dim));
    for (int64_t i = 0; i < layers; ++i) {
      blocks_.push_back(child("token_refiner.refiner_blocks." + std::to_string(i),
                              std::make_shared<RefinerBlock>(dim, heads)));
    }
  }
  // text [B, L, C_text] (model dtype), timestep [B|1], mask [B, L] bool or undefined -> [B, L, D].
  at::Tensor forward(const at::Tensor& text, const at::Tensor& timestep,
                     const at::Tensor& mask) const {
    at::Tensor pooled;
    if (!mask.defined()) {
      pooled = text.mean(1);
    } else {
      // (x * m).sum(1) / m.sum(1) with the mask as float32, back to the text's dtype.
      auto m = mask.to(at::kFloat).unsqueeze(-1);  // [B, L, 1]
      pooled = ((text * m).sum(1) / m.sum(1)).to(text.scalar_type());
    }
    auto temb = time_text_embed_->forward(timestep, pooled, {});
    auto h = proj_in_->forward(text);
    at::Tensor pair;
    if (mask.defined()) {
      const int64_t b = mask.size(0), l = mask.size(1);
      auto m1 = mask.view({b, 1, 1, l}).expand({b, 1, l, l});
      if (key_zero_visible_) {
        // Query i sees key j when both are valid; every query sees key 0.
        pair = at::logical_and(m1, m1.transpose(2, 3)).contiguous();
        pair.select(3, 0).fill_(true);
      } else {
        pair = m1;  // every query sees the valid keys
      }
    }
    for (const auto& block : blocks_) h = block->forward(h, temb, pair);
    return h;
  }

 private:
  bool key_zero_visible_;
  std::shared_ptr<HunyuanVideoConditionEmbedding> time_text_embed_;
  std::shared_ptr<Linear> proj_in_;
  std::vector<std::shared_ptr<RefinerBlock>> blocks_;
};

// [D, C, pt, p, p], `proj.bias` [D].
class HunyuanVideoPatchEmbed : public Module {
 public:
  HunyuanVideoPatchEmbed(int64_t in_channels, const std::vector<int64_t>& patch, int64_t dim)
      : dim_(dim) {
    weight_ = &param("proj.weight", {dim, in_channels, patch[0], patch[1], patch[2]});
    bias_ = &param("proj.bias", {dim});
    weight_->layer = bias_->layer = LayerKind::kConv;
  }
  at::Tensor forward(const at::Tensor& tokens) const {  // [B, n, C*pt*p*p] -> [B, n, D]
    return linear(tokens, weight_->value().reshape({dim_, -1}), bias_->value());
  }

 private:
  int64_t dim_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

// ---- attention ----------------------------------------------------------------------------------

// diffusers Attention with HunyuanVideoAttnProcessor2_0: to_q/k/v with RMSNorm QK norms over the
// head dim; the double-stream variant adds add_{q,k,v}_proj, norm_added_{q,k}, to_out.0 and
// to_add_out; the single-stream one (pre_only) has no output projection. Tensor parallel: the
// projections column-parallel by whole heads, the outputs row-parallel.
class HunyuanVideoAttention : public Module {
 public:
  HunyuanVideoAttention(int64_t dim, int64_t heads, int64_t head_dim, bool joint,
                        const TensorParallel& tp)
      : heads_(heads / tp.size), head_dim_(head_dim) {
    const int64_t inner = heads * head_dim;
    auto column = [&] { return std::make_shared<ColumnParallelLinear>(dim, inner, tp); };
    to_q_ = child("to_q", column());
    to_k_ = child("to_k", column());
    to_v_ = child("to_v", column());
    norm_q_ = child("norm_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
    norm_k_ = child("norm_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
    if (joint) {
      add_k_proj_ = child("add_k_proj", column());
      add_v_proj_ = child("add_v_proj", column());
      add_q_proj_ = child("add_q_proj", column());
      norm_added_q_ = child("norm_added_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
      norm_added_k_ = child("norm_added_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
      to_out_ = child("to_out.0", std::make_shared<RowParallelLinear>(inner, dim, tp));
      to_add_out_ = child("to_add_out", std::make_shared<RowParallelLinear>(inner, dim, tp));
    }
  }
  struct Qkv {
    at::Tensor q, k, v;  // [B, S, H_r, hd]
  };
  Qkv project(const at::Tensor& x) const {
    return {norm_q_->forward(split_heads(to_q_->forward(x), heads_)),
            norm_k_->forward(split_heads(to_k_->forward(x), heads_)),
            split_heads(to_v_->forward(x), heads_)};
  }
  Qkv project_context(const at::Tensor& c) const {
    return {norm_added_q_->forward(split_heads(add_q_proj_->forward(c), heads_)),
            norm_added_k_->forward(split_heads(add_k_proj_->forward(c), heads_)),
            split_heads(add_v_proj_->forward(c), heads_)};
  }
  at::Tensor out(const at::Tensor& x, const TensorParallelOps& ops) const {
    return to_out_->forward(x, ops);
  }
  at::Tensor add_out(const at::Tensor& c, const TensorParallelOps& ops) const {
    return to_add_out_->forward(c, ops);
  }
  int64_t inner() const { return heads_ * head_dim_; }  // this rank's width

 private:
  int64_t heads_, head_dim_;
  std::shared_ptr<ColumnParallelLinear> to_q_, to_k_, to_v_, add_q_proj_, add_k_proj_, add_v_proj_;
  std::shared_ptr<RowParallelLinear> to_out_, to_add_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

// RoPE on the first `n` rows (the image tokens) of q and k [B, S, H, hd]; the text rows after
// them are not rotated.
inline std::pair<at::Tensor, at::Tensor> rotate_image_rows(const at::Tensor& q, const at::Tensor& k,
                                                           int64_t n, const RotaryTables& rope) {
  const int64_t s = q.size(1);
  if (n == s) return apply_rotary_emb_qk(q, k, rope);
  auto [qi, ki] = apply_rotary_emb_qk(q.narrow(1, 0, n), k.narrow(1, 0, n), rope);
  return {at::cat({qi, q.narrow(1, n, s - n)}, 1), at::cat({ki, k.narrow(1, n, s - n)}, 1)};
}

// ---- double-stream block ------------------------------------------------------------------------

// HunyuanVideoTransformerBlock: norm1 / norm1_context (AdaLayerNormZero), the joint attention
// over [image, text], norm2 / norm2_context (LayerNorm without affine) modulated, ff / ff_context
// (FeedForward gelu-approximate, mult mlp_ratio).
class HunyuanVideoTransformerBlock : public Module {
 public:
  HunyuanVideoTransformerBlock(const HunyuanVideoConfig& c, const TensorParallel& tp) {
    const int64_t dim = c.inner_dim();
    norm1_ = child("norm1", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    norm1_context_ =
        child("norm1_context", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    attn_ = child("attn", std::make_shared<HunyuanVideoAttention>(dim, c.num_attention_heads,
                                                                  c.attention_head_dim, true, tp));
    ff_ = child("ff", std::make_shared<ParallelFeedForward>(dim, dim, c.mlp_ratio,
                                                            FeedForwardKind::kGeluApproximate, tp));
    ff_context_ =
        child("ff_context", std::make_shared<ParallelFeedForward>(
                                dim, dim, c.mlp_ratio, FeedForwardKind::kGeluApproximate, tp));
  }

  // norm1's modulated image input x [B, n, D] (TeaCache's signal).
  at::Tensor modulated_input(const at::Tensor& x, const at::Tensor& temb,
                             const TensorParallelOps& ops) const {
    return norm1_->forward(x, temb, ops).x;
  }

  // x [B, n, D], c [B, L, D], temb [B|1, D], rope [n, hd], mask [B, n + L] and text_keys
  // [B, L] (its text part) or both undefined.
  void forward(at::Tensor& x, at::Tensor& c, const at::Tensor& temb, const RotaryTables& rope,
               const at::Tensor& mask, const at::Tensor& text_keys, const AttendFn& attend,
               int64_t layer, const TensorParallelOps& ops) const {
    const int64_t b = x.size(0), n = x.size(1), l = c.size(1), inner = attn_->inner();
    auto nx = norm1_->forward(x, temb, ops);
    auto nc = norm1_context_->forward(c, temb, ops);
    auto img = attn_->project(nx.x);          // [B, n, H_r, hd]
    auto txt = attn_->project_context(nc.x);  // [B, L, H_r, hd]
    auto [qi, ki] = apply_rotary_emb_qk(img.q, img.k, rope);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = l;
    call.text_first = false;
    call.mask = mask;
    call.text_key_mask = text_keys;
    auto o =
        attend(at::cat({qi, txt.q}, 1), at::cat({ki, txt.k}, 1), at::cat({img.v, txt.v}, 1), call)
            .reshape({b, n + l, inner})
            .to(x.scalar_type());
    auto img_out = attn_->out(o.narrow(1, 0, n), ops);      // [B, n, D]
    auto txt_out = attn_->add_out(o.narrow(1, n, l), ops);  // [B, L, D]

    x = gated_residual(x, nx.gate_msa, img_out);
    auto hx = kernels().norm_modulate(x, nx.shift_mlp, nx.scale_mlp, kNormEps);
    x = gated_residual(x, nx.gate_mlp, ff_->forward(hx, ops));

    c = gated_residual(c, nc.gate_msa, txt_out);
    auto hc = kernels().norm_modulate(c, nc.shift_mlp, nc.scale_mlp, kNormEps);
    c = gated_residual(c, nc.gate_mlp, ff_context_->forward(hc, ops));
  }

 private:
  std::shared_ptr<ParallelAdaLayerNormZero> norm1_, norm1_context_;
  std::shared_ptr<HunyuanVideoAttention> attn_;
  std::shared_ptr<ParallelFeedForward> ff_, ff_context_;
};

}  // namespace xfuser::models::hunyuan_video
