#include "models/sd3/sd3_transformer.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/kernels.h"
#include "profiling/trace.h"

namespace xfuser::models::sd3 {
namespace {

constexpr double kNormEps = 1e-6;
constexpr int64_t kTimestepChannels = 256;

// [B, S, H*hd] -> [B, S, H, hd]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads});
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

using AttendFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const AttentionCall&)>;

}  // namespace

// ---- attention ----------------------------------------------------------------------------------

// diffusers Attention with JointAttnProcessor2_0 as SD3 configures it: to_q/k/v and to_out.0
// with biases; with qk_norm "rms_norm" norm_q/norm_k (eps 1e-6, per head). The joint variant
// (added_kv_proj_dim = dim) adds add_{q,k,v}_proj, norm_added_{q,k} and, unless
// context_pre_only, to_add_out. Tensor parallel: q/k/v column-parallel by whole heads, outputs
// row-parallel.
class SD3Attention : public Module {
 public:
  SD3Attention(int64_t dim, int64_t heads, int64_t head_dim, bool qk_norm, bool joint,
               bool context_pre_only, const TensorParallel& tp)
      : heads_(heads / tp.size), head_dim_(head_dim) {
    const int64_t inner = heads * head_dim;
    auto column = [&](int64_t in, int64_t out) {
      return std::make_shared<ColumnParallelLinear>(in, out, tp);
    };
    if (qk_norm) {
      norm_q_ = child("norm_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
      norm_k_ = child("norm_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
    }
    to_q_ = child("to_q", column(dim, inner));
    to_k_ = child("to_k", column(dim, inner));
    to_v_ = child("to_v", column(dim, inner));
    if (joint) {
      add_k_proj_ = child("add_k_proj", column(dim, inner));
      add_v_proj_ = child("add_v_proj", column(dim, inner));
      add_q_proj_ = child("add_q_proj", column(dim, inner));
    }
    to_out_ = child("to_out.0", std::make_shared<RowParallelLinear>(inner, dim, tp));
    if (joint && !context_pre_only) {
      to_add_out_ = child("to_add_out", std::make_shared<RowParallelLinear>(inner, dim, tp));
    }
    if (joint && qk_norm) {
      norm_added_q_ = child("norm_added_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
      norm_added_k_ = child("norm_added_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
    }
  }

  struct Qkv {
    at::Tensor q, k, v;  // [B, S, H_r, hd]
  };

  Qkv project(const at::Tensor& x) const {  // x [B, N, D]
    auto q = split_heads(to_q_->forward(x), heads_);
    auto k = split_heads(to_k_->forward(x), heads_);
    if (norm_q_) q = norm_q_->forward(q);
    if (norm_k_) k = norm_k_->forward(k);
    return {q, k, split_heads(to_v_->forward(x), heads_)};
  }
  Qkv project_context(const at::Tensor& c) const {  // c [B, L, D]
    auto q = split_heads(add_q_proj_->forward(c), heads_);
    auto k = split_heads(add_k_proj_->forward(c), heads_);
    if (norm_added_q_) q = norm_added_q_->forward(q);
    if (norm_added_k_) k = norm_added_k_->forward(k);
    return {q, k, split_heads(add_v_proj_->forward(c), heads_)};
  }
  at::Tensor out(const at::Tensor& x, const TensorParallelOps& ops) const {
    return to_out_->forward(x, ops);
  }
  at::Tensor add_out(const at::Tensor& c, const TensorParallelOps& ops) const {
    return to_add_out_->forward(c, ops);
  }
  int64_t inner() const { return heads_ * head_dim_; }  // this rank's heads * hd

 private:
  int64_t heads_, head_dim_;
  std::shared_ptr<ColumnParallelLinear> to_q_, to_k_, to_v_, add_q_proj_, add_k_proj_, add_v_proj_;
  std::shared_ptr<RowParallelLinear> to_out_, to_add_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

// SD35AdaLayerNormZeroX with the modulation linear column-parallel (the [B, 9D] output is
// all-gathered): emb = linear(SiLU(temb)) -> shift_msa, scale_msa, gate_msa, shift_mlp,
// scale_mlp, gate_mlp, shift_msa2, scale_msa2, gate_msa2; n = LN(x);
// x1 = n (1 + scale_msa) + shift_msa, x2 = n (1 + scale_msa2) + shift_msa2.
class ParallelAdaLayerNormZeroX : public Module {
 public:
  struct Output {
    at::Tensor x, x2;                                                // [B, S, D]
    at::Tensor gate_msa, shift_mlp, scale_mlp, gate_mlp, gate_msa2;  // [B, D]
  };
  ParallelAdaLayerNormZeroX(int64_t dim, const TensorParallel& tp) {
    linear_ = child("linear", std::make_shared<ColumnParallelLinear>(dim, 9 * dim, tp));
  }
  Output forward(const at::Tensor& x, const at::Tensor& temb, const TensorParallelOps& ops) const {
    auto c = linear_->forward_gathered(activate(temb, Activation::kSilu), ops).chunk(9, 1);
    Output o;
    o.x = kernels().norm_modulate(x, c[0], c[1], kNormEps);
    o.gate_msa = c[2];
    o.shift_mlp = c[3];
    o.scale_mlp = c[4];
    o.gate_mlp = c[5];
    o.x2 = kernels().norm_modulate(x, c[6], c[7], kNormEps);
    o.gate_msa2 = c[8];
    return o;
  }

 private:
  std::shared_ptr<ColumnParallelLinear> linear_;
};

// ---- JointTransformerBlock ----------------------------------------------------------------------

class SD3JointBlock : public Module {
 public:
  SD3JointBlock(int64_t dim, int64_t heads, int64_t head_dim, bool context_pre_only, bool qk_norm,
                bool dual, const TensorParallel& tp)
      : context_pre_only_(context_pre_only), dual_(dual) {
    if (dual) {
      norm1_x_ = child("norm1", std::make_shared<ParallelAdaLayerNormZeroX>(dim, tp));
    } else {
      norm1_ = child("norm1", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    }
    if (context_pre_only) {
      norm1_context_last_ = child(
          "norm1_context", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, kNormEps));
    } else {
      norm1_context_ =
          child("norm1_context", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    }
    attn_ = child("attn", std::make_shared<SD3Attention>(dim, heads, head_dim, qk_norm, true,
                                                         context_pre_only, tp));
    if (dual) {
      attn2_ = child(
          "attn2", std::make_shared<SD3Attention>(dim, heads, head_dim, qk_norm, false, false, tp));
    }
    ff_ = child("ff", std::make_shared<ParallelFeedForward>(dim, dim, 4.0,
                                                            FeedForwardKind::kGeluApproximate, tp));
    if (!context_pre_only) {
      ff_context_ = child("ff_context", std::make_shared<ParallelFeedForward>(
                                            dim, dim, 4.0, FeedForwardKind::kGeluApproximate, tp));
    }
  }

  // x [B, N, D], c [B, L, D], temb [B, D]; updates x and c (c undefined after the last block).
  void forward(at::Tensor& x, at::Tensor& c, const at::Tensor& temb, const AttendFn& attend,
               int64_t layer, int64_t layer2, const TensorParallelOps& ops) const {
    const int64_t b = x.size(0), n = x.size(1), l = c.size(1), inner = attn_->inner();
    at::Tensor nx, nx2, gate_msa, shift_mlp, scale_mlp, gate_mlp, gate_msa2;
    if (dual_) {
      auto o = norm1_x_->forward(x, temb, ops);
      nx = o.x, nx2 = o.x2, gate_msa = o.gate_msa, shift_mlp = o.shift_mlp;
      scale_mlp = o.scale_mlp, gate_mlp = o.gate_mlp, gate_msa2 = o.gate_msa2;
    } else {
      auto o = norm1_->forward(x, temb, ops);
      nx = o.x, gate_msa = o.gate_msa, shift_mlp = o.shift_mlp;
      scale_mlp = o.scale_mlp, gate_mlp = o.gate_mlp;
    }
    AdaLayerNormZero::Output nc;
    if (context_pre_only_) {
      nc.x = norm1_context_last_->forward(c, temb);
    } else {
      nc = norm1_context_->forward(c, temb, ops);
    }

    // Joint attention over [image, text].
    auto img = attn_->project(nx);            // [B, N, H_r, hd] each
    auto txt = attn_->project_context(nc.x);  // [B, L, H_r, hd] each
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = l;
    call.text_first = false;
    auto q = at::cat({img.q, txt.q}, 1);  // [B, N+L, H_r, hd]
    auto o = attend(q, at::cat({img.k, txt.k}, 1), at::cat({img.v, txt.v}, 1), call)
                 .reshape({b, n + l, inner})
                 .to(q.scalar_type());
    x = gated_residual(x, gate_msa, attn_->out(o.narrow(1, 0, n), ops));

    if (dual_) {  // attn2: self-attention over the image tokens
      auto p = attn2_->project(nx2);
      AttentionCall call2;
      call2.layer = layer2;
      call2.text_tokens = 0;
      call2.text_first = false;
      auto o2 = attend(p.q, p.k, p.v, call2).reshape({b, n, inner}).to(p.q.scalar_type());
      x = gated_residual(x, gate_msa2, attn2_->out(o2, ops));
    }
    auto hx = kernels().norm_modulate(x, shift_mlp, scale_mlp, kNormEps);
    x = gated_residual(x, gate_mlp, ff_->forward(hx, ops));

    if (context_pre_only_) {
      c = at::Tensor();
      return;
    }
    c = gated_residual(c, nc.gate_msa, attn_->add_out(o.narrow(1, n, l), ops));
    auto hc = kernels().norm_modulate(c, nc.shift_mlp, nc.scale_mlp, kNormEps);
    c = gated_residual(c, nc.gate_mlp, ff_context_->forward(hc, ops));
  }

 private:
  bool context_pre_only_, dual_;
  std::shared_ptr<ParallelAdaLayerNormZero> norm1_, norm1_context_;
  std::shared_ptr<ParallelAdaLayerNormZeroX> norm1_x_;
  std::shared_ptr<AdaLayerNormContinuous> norm1_context_last_;
  std::shared_ptr<SD3Attention> attn_, attn2_;
  std::shared_ptr<ParallelFeedForward> ff_, ff_context_;
};

// ---- PatchEmbed ---------------------------------------------------------------------------------

// diffusers PatchEmbed (pos_embed_max_size set): `proj` Conv2d(C, D, k = s = p) and the stored
// table `pos_embed` [1, M*M, D]. On tokens the conv is a matmul over patches.
class SD3Transformer2DModel::PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t patch, int64_t dim, int64_t max_size)
      : dim_(dim), max_size_(max_size) {
    weight_ = &param("proj.weight", {dim, in_channels, patch, patch});
    bias_ = &param("proj.bias", {dim});
    table_ = &param("pos_embed", {1, max_size * max_size, dim});
    weight_->layer = bias_->layer = LayerKind::kConv;  // diffusers' `proj` Conv2d
  }
  // tokens [B, n, C*p*p], ids [n, 2] (row, col) -> [B, n, D]
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& ids) const {
    XF_CHECK(weight_->loaded(), "pos_embed used before loading");
    auto x = linear(tokens, weight_->value().reshape({dim_, -1}), bias_->value());
    auto rc = ids.to(table_->value().device());
    rc = (at::isFloatingType(rc.scalar_type()) ? rc.round() : rc).to(at::kLong);  // [n, 2]
    auto rows = rc.select(1, 0) * max_size_ + rc.select(1, 1);                    // [n]
    auto pos = table_->value().select(0, 0).index_select(0, rows);                // [n, D]
    return x + pos.unsqueeze(0);
  }

 private:
  int64_t dim_, max_size_;
  ParamSlot* weight_;
  ParamSlot* bias_;
  ParamSlot* table_;
};

// ---- the model ----------------------------------------------------------------------------------

SD3Transformer2DModel::SD3Transformer2DModel(SD3Config config, dit::DiTPart part, TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  config_.validate("SD3Transformer2DModel config");
  resolve_part();
  const auto& c = config_;
  const int64_t dim = c.inner_dim();
  auto held = [&](int64_t block) { return part_.block_begin <= block && block < part_.block_end; };
  // Declaration order follows diffusers' __init__.
  if (part_.embedders) {
    pos_embed_ = child(
        "pos_embed", std::make_shared<PatchEmbed>(c.in_channels, c.patch_size, dim, c.max_grid()));
  }
  timestep_embedder_ = child("time_text_embed.timestep_embedder",
                             std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
  text_embedder_ = child(
      "time_text_embed.text_embedder",
      std::make_shared<PixArtAlphaTextProjection>(c.pooled_projection_dim, dim, Activation::kSilu));
  if (part_.embedders) {
    context_embedder_ =
        child("context_embedder",
              std::make_shared<Linear>(c.joint_attention_dim, c.caption_projection_dim));
  }
  blocks_.resize(c.num_layers);
  attn2_layer_.assign(c.num_layers, -1);
  int64_t dual_seen = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool dual = c.is_dual(i);
    if (dual) attn2_layer_[i] = c.num_layers + dual_seen++;
    if (!held(i)) continue;
    blocks_[i] =
        child("transformer_blocks." + std::to_string(i),
              std::make_shared<SD3JointBlock>(dim, c.num_attention_heads, c.attention_head_dim,
                                              i == c.num_layers - 1, c.has_qk_norm(), dual, tp_));
  }
  if (part_.head) {
    norm_out_ =
        child("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, kNormEps));
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, c.output_dim()));
  }
}

SD3Transformer2DModel::~SD3Transformer2DModel() = default;

c10::ScalarType SD3Transformer2DModel::dtype() const {
  // time_text_embed is held by every part; its first parameter has the compute dtype.
  const auto* w = timestep_embedder_->named_parameters().front().second;
  XF_CHECK(w->loaded(), "SD3Transformer2DModel used before its weights were loaded");
  return w->compute_dtype();
}

std::vector<int64_t> SD3Transformer2DModel::block_parameters() const {
  const auto& c = config_;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    // Declaring a block allocates no tensors: count an unsharded one.
    SD3JointBlock block(c.inner_dim(), c.num_attention_heads, c.attention_head_dim,
                        i == c.num_layers - 1, c.has_qk_norm(), c.is_dual(i), TensorParallel{});
    out.push_back(block.num_parameters());
  }
  return out;
}

std::vector<int64_t> SD3Transformer2DModel::other_parameters() const {
  const auto& c = config_;
  const int64_t d = c.inner_dim(), m = c.max_grid();
  const int64_t embedders =
      (c.token_channels() * d + d) + m * m * d +
      (c.joint_attention_dim * c.caption_projection_dim + c.caption_projection_dim);
  const int64_t conditioning =
      (kTimestepChannels * d + d) + (d * d + d) + (c.pooled_projection_dim * d + d) + (d * d + d);
  const int64_t head = (d * 2 * d + 2 * d) + (d * c.output_dim() + c.output_dim());
  return {embedders, conditioning, head};
}

const std::vector<std::string>& SD3Transformer2DModel::input_names() {
  static const std::vector<std::string> kNames = {"hidden_states", "encoder_hidden_states",
                                                  "pooled_projections", "timestep"};
  return kNames;
}

at::Tensor SD3Transformer2DModel::patchify(const at::Tensor& latents, int64_t patch) {
  XF_CHECK(latents.dim() == 4, "SD3 patchify: latents must be [B, C, H, W], got ",
           shape_string(latents.sizes()));
  XF_CHECK(patch >= 1 && latents.size(2) % patch == 0 && latents.size(3) % patch == 0,
           "SD3 patchify: height and width of ", shape_string(latents.sizes()),
           " must be multiples of the patch size ", patch);
  const int64_t b = latents.size(0), ch = latents.size(1);
  const int64_t h = latents.size(2) / patch, w = latents.size(3) / patch;
  return latents.reshape({b, ch, h, patch, w, patch})
      .permute({0, 2, 4, 1, 3, 5})  // [B, h, w, C, p, p]
      .reshape({b, h * w, ch * patch * patch});
}

at::Tensor SD3Transformer2DModel::unpatchify(const at::Tensor& tokens, int64_t grid_h,
                                             int64_t grid_w, int64_t patch, int64_t channels) {
  XF_CHECK(tokens.dim() == 3 && tokens.size(1) == grid_h * grid_w &&
               tokens.size(2) == patch * patch * channels,
           "SD3 unpatchify: tokens must be [B, ", grid_h * grid_w, ", ", patch * patch * channels,
           "] for a ", grid_h, " x ", grid_w, " grid of ", patch, " x ", patch, " x ", channels,
           " patches, got ", shape_string(tokens.sizes()));
  const int64_t b = tokens.size(0);
  return tokens.reshape({b, grid_h, grid_w, patch, patch, channels})
      .permute({0, 5, 1, 3, 2, 4})  // nhwpqc -> nchpwq
      .reshape({b, channels, grid_h * patch, grid_w * patch});
}

at::Tensor SD3Transformer2DModel::token_ids(int64_t grid_h, int64_t grid_w,
                                            int64_t pos_embed_max_size,
                                            const at::TensorOptions& options) {
  XF_CHECK(grid_h >= 1 && grid_w >= 1, "SD3 token_ids: empty grid ", grid_h, " x ", grid_w);
  XF_CHECK(grid_h <= pos_embed_max_size && grid_w <= pos_embed_max_size, "SD3: a ", grid_h, " x ",
           grid_w, " patch grid is larger than the position table (pos_embed_max_size ",
           pos_embed_max_size, ")");
  const int64_t top = (pos_embed_max_size - grid_h) / 2, left = (pos_embed_max_size - grid_w) / 2;
  auto opts = options.dtype(at::kFloat);
  auto rows = at::arange(top, top + grid_h, opts).view({grid_h, 1}).expand({grid_h, grid_w});
  auto cols = at::arange(left, left + grid_w, opts).view({1, grid_w}).expand({grid_h, grid_w});
  return at::stack({rows.reshape({-1}), cols.reshape({-1})}, 1);  // [h*w, 2]
}

at::Tensor SD3Transformer2DModel::sincos_pos_table(int64_t dim, int64_t max_size, int64_t base_size,
                                                   const at::TensorOptions& options) {
  XF_CHECK(dim % 4 == 0 && max_size >= 1 && base_size >= 1,
           "SD3 position table: dim must divide by 4 and sizes be positive, got dim ", dim,
           ", max_size ", max_size, ", base_size ", base_size);
  auto f32 = options.dtype(at::kFloat);
  auto f64 = options.dtype(at::kDouble);
  // diffusers: positions arange(M) / (M / base) in float32; frequencies and angles in float64.
  auto pos = (at::arange(max_size, f32) / (static_cast<double>(max_size) / base_size))
                 .to(at::kDouble);  // [M]
  const int64_t quarter = dim / 4;
  auto omega = 1.0 / at::pow(10000.0, at::arange(quarter, f64) / static_cast<double>(quarter));
  auto sincos = [&](const at::Tensor& p) {  // [S] -> [S, dim/2]
    auto out = at::outer(p, omega);
    return at::cat({at::sin(out), at::cos(out)}, 1);
  };
  auto grid_w = pos.view({1, max_size}).expand({max_size, max_size}).reshape({-1});
  auto grid_h = pos.view({max_size, 1}).expand({max_size, max_size}).reshape({-1});
  return at::cat({sincos(grid_w), sincos(grid_h)}, 1).to(at::kFloat);  // [M*M, dim]
}

dit::DiTInputs SD3Transformer2DModel::parse_forward_inputs(const TensorMap& inputs) const {
  XF_CONTEXT("SD3Transformer2DModel.forward inputs");
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "SD3Transformer2DModel.forward: unknown input(s) ", join(unknown),
           "; accepted inputs: ", join(names));
  auto get = [&](const std::string& name) {
    auto it = inputs.find(name);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  const auto& c = config_;
  const int64_t p = c.patch_size, m = c.max_grid();
  auto hs = get("hidden_states");
  const std::string hs_shape = "[B, " + std::to_string(c.in_channels) + ", H, W]";
  XF_CHECK(hs.defined(), "missing required input 'hidden_states' (expected ", hs_shape, ")");
  XF_CHECK(hs.dim() == 4 && hs.size(1) == c.in_channels && hs.size(0) >= 1,
           "hidden_states must be ", hs_shape, ", got ", shape_string(hs.sizes()));
  XF_CHECK(at::isFloatingType(hs.scalar_type()), "hidden_states must be floating point, got ",
           hs.scalar_type());
  XF_CHECK(hs.size(2) >= p && hs.size(3) >= p && hs.size(2) % p == 0 && hs.size(3) % p == 0,
           "hidden_states height and width (", hs.size(2), " x ", hs.size(3),
           ") must be positive multiples of patch_size ", p);
  const int64_t gh = hs.size(2) / p, gw = hs.size(3) / p;
  XF_CHECK(gh <= m && gw <= m, "hidden_states ", shape_string(hs.sizes()), " is a ", gh, " x ", gw,
           " patch grid, larger than pos_embed_max_size ", m, " (at most ", m * p, " x ", m * p,
           " latents)");
  dit::DiTInputs in;
  in.tokens = patchify(hs, p);
  in.token_ids = token_ids(gh, gw, m, hs.options());
  in.text = get("encoder_hidden_states");
  in.pooled = get("pooled_projections");
  in.timestep = get("timestep");
  check_inputs(in);
  return in;
}

void SD3Transformer2DModel::check_inputs(const dit::DiTInputs& in) const {
  XF_CONTEXT("SD3Transformer2DModel.forward inputs");
  const auto& c = config_;
  const std::string tok_shape = "[B, N, " + std::to_string(c.token_channels()) + "]";
  const std::string enc_shape = "[B, L, " + std::to_string(c.joint_attention_dim) + "]";
  const std::string pooled_shape = "[B, " + std::to_string(c.pooled_projection_dim) + "]";
  auto require = [](const at::Tensor& t, const char* name, const std::string& shape) {
    XF_CHECK(t.defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  require(in.tokens, "hidden_states", tok_shape + " patchified tokens");
  require(in.token_ids, "token_ids", "[N, 2]");
  require(in.text, "encoder_hidden_states", enc_shape);
  require(in.pooled, "pooled_projections", pooled_shape);
  require(in.timestep, "timestep", "[B]");

  const auto& tok = in.tokens;
  XF_CHECK(
      tok.dim() == 3 && tok.size(2) == c.token_channels() && tok.size(0) >= 1 && tok.size(1) >= 1,
      "hidden_states tokens must be ", tok_shape, " (", c.patch_size, " x ", c.patch_size,
      " patches of ", c.in_channels, " channels), got ", shape_string(tok.sizes()));
  const int64_t b = tok.size(0), n = tok.size(1);
  const auto& ids = in.token_ids;
  XF_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) == 2, "token_ids must be [", n,
           ", 2] (row, col of each token), got ", shape_string(ids.sizes()));
  XF_CHECK(at::isFloatingType(ids.scalar_type()) || at::isIntegralType(ids.scalar_type(), false),
           "token_ids must be a real tensor, got ", ids.scalar_type());
  // The ids index the position table. Their values are read only where that is free (host
  // tensors): on a GPU it would synchronise every step, and the ids there are the ones
  // token_ids() made from a grid checked against the table (the pipeline, parse_forward_inputs).
  if (ids.device().is_cpu()) {
    auto f = ids.to(at::kDouble);
    const double lo = f.min().item<double>(), hi = f.max().item<double>();
    const bool integral = at::equal(f, f.round());
    XF_CHECK(integral && lo >= 0 && hi <= c.max_grid() - 1, "token_ids must be whole positions in ",
             "the ", c.max_grid(), " x ", c.max_grid(),
             " position table (pos_embed_max_size), got values in [", lo, ", ", hi, "]");
  }
  const auto& enc = in.text;
  XF_CHECK(enc.dim() == 3 && enc.size(0) == b && enc.size(2) == c.joint_attention_dim &&
               enc.size(1) >= 1,
           "encoder_hidden_states must be [", b, ", L, ", c.joint_attention_dim, "], got ",
           shape_string(enc.sizes()));
  const auto& pooled = in.pooled;
  XF_CHECK(pooled.dim() == 2 && pooled.size(0) == b && pooled.size(1) == c.pooled_projection_dim,
           "pooled_projections must be [", b, ", ", c.pooled_projection_dim, "], got ",
           shape_string(pooled.sizes()));
  XF_CHECK(in.timestep.dim() == 1 && (in.timestep.size(0) == b || in.timestep.size(0) == 1),
           "timestep must be [", b, "] (or [1]), got ", shape_string(in.timestep.sizes()));
  XF_CHECK(at::isFloatingType(in.timestep.scalar_type()) ||
               at::isIntegralType(in.timestep.scalar_type(), false),
           "timestep must be an integer or floating tensor, got ", in.timestep.scalar_type());
  XF_CHECK(at::isFloatingType(tok.scalar_type()) && at::isFloatingType(enc.scalar_type()) &&
               at::isFloatingType(pooled.scalar_type()),
           "hidden_states, encoder_hidden_states and pooled_projections must be floating point, "
           "got ",
           tok.scalar_type(), ", ", enc.scalar_type(), ", ", pooled.scalar_type());
}

dit::DiTActivations SD3Transformer2DModel::embed(const dit::DiTInputs& in) const {
  XF_CONTEXT("SD3Transformer2DModel.embed");
  const auto dtype = this->dtype();
  dit::DiTActivations a;
  if (pos_embed_) a.hidden = pos_embed_->forward(in.tokens.to(dtype), in.token_ids);  // [B, n, D]
  // diffusers: the float32 sinusoid of t (not scaled), cast to the pooled projection's dtype.
  auto temb = timestep_embedder_->forward(
      timestep_embedding(in.timestep, kTimestepChannels, true, 0.0).to(dtype));      // [B|1, D]
  a.temb = temb + text_embedder_->forward(in.pooled.to(dtype));                      // [B, D]
  if (context_embedder_) a.context = context_embedder_->forward(in.text.to(dtype));  // [B, L, D]
  a.text_tokens = in.text.size(1);
  return a;
}

void SD3Transformer2DModel::run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const {
  XF_CHECK(0 <= begin && begin <= end && end <= config_.num_layers, "run_blocks: range [", begin,
           ", ", end, ") is outside the ", config_.num_layers, " blocks");
  if (begin == end) return;
  XF_CHECK(a.hidden.defined(), "run_blocks: the image stream is undefined (a part without the ",
           "embedders needs the previous stage's activations)");
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("transformer_blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(blocks_[i], "transformer_blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    XF_CHECK(a.context.defined(), "transformer_blocks.", i,
             ": the text stream is undefined (it ends after the last block)");
    blocks_[i]->forward(a.hidden, a.context, a.temb, attend, i, attn2_layer_[i], tp_ops());
  }
}

at::Tensor SD3Transformer2DModel::finalize(const dit::DiTActivations& a) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  XF_CHECK(a.hidden.defined(), "finalize: the image stream is undefined");
  return proj_out_->forward(norm_out_->forward(a.hidden, a.temb));  // [B, n, p*p*out_C]
}

TensorMap SD3Transformer2DModel::forward_outputs(const at::Tensor& tokens,
                                                 const TensorMap& inputs) const {
  auto it = inputs.find("hidden_states");
  XF_CHECK(it != inputs.end() && it->second.dim() == 4,
           "SD3Transformer2DModel: the outputs need the 4-D hidden_states input");
  const int64_t p = config_.patch_size;
  return {{"sample", unpatchify(tokens, it->second.size(2) / p, it->second.size(3) / p, p,
                                config_.resolved_out_channels())}};
}

std::shared_ptr<dit::DiTTransformer> make_sd3_transformer(const nlohmann::json& config,
                                                          const std::string& config_path,
                                                          dit::DiTPart part, TensorParallel tp) {
  return std::make_shared<SD3Transformer2DModel>(SD3Config::from_json(config, config_path), part,
                                                 tp);
}

}  // namespace xfuser::models::sd3
