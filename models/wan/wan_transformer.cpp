#include "models/wan/wan_transformer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "profiling/trace.h"

namespace xfuser::models::wan {
namespace {

// [B, S, H*hd] -> [B, S, H, hd]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads});
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string grid_string(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + ")";
}

using AttendFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const AttentionCall&)>;

// FP32LayerNorm(elementwise_affine=False) of x in float32, then * (1 + scale) + shift (float32
// [B|1, 1, D]) and back to x's dtype: the modulated norms of diffusers' Wan block and head.
at::Tensor modulated_norm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                          double eps) {
  return (layer_norm_no_affine(x.to(at::kFloat), eps) * (1 + scale) + shift).to(x.scalar_type());
}

}  // namespace

// ---- condition embedder ------------------------------------------------------------------------

// WanImageEmbedding: FP32LayerNorm norm1 (image_dim), FeedForward ff (mult 1, erf GELU,
// image_dim -> D), FP32LayerNorm norm2 (D).
class WanImageEmbedding : public Module {
 public:
  WanImageEmbedding(int64_t in_features, int64_t out_features) {
    norm1_ = child("norm1", std::make_shared<LayerNorm>(in_features, 1e-5));
    ff_ = child("ff", std::make_shared<FeedForward>(in_features, out_features, 1.0,
                                                    FeedForwardKind::kGelu));
    norm2_ = child("norm2", std::make_shared<LayerNorm>(out_features, 1e-5));
  }
  at::Tensor forward(const at::Tensor& x) const {
    return norm2_->forward(ff_->forward(norm1_->forward(x)));
  }

 private:
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<FeedForward> ff_;
};

// WanTimeTextImageEmbedding: Timesteps(freq_dim, flip_sin_to_cos, shift 0) -> time_embedder
// (TimestepEmbedding freq_dim -> D) = temb; time_proj(SiLU(temb)) [B, 6D]; text_embedder
// (PixArtAlphaTextProjection text_dim -> D, tanh GELU); image_embedder (I2V).
class WanConditionEmbedder : public Module {
 public:
  explicit WanConditionEmbedder(const WanConfig& c) : freq_dim_(c.freq_dim) {
    const int64_t d = c.inner_dim();
    time_embedder_ = child("time_embedder", std::make_shared<TimestepEmbedding>(c.freq_dim, d));
    time_proj_ = child("time_proj", std::make_shared<Linear>(d, 6 * d));
    text_embedder_ = child("text_embedder", std::make_shared<PixArtAlphaTextProjection>(
                                                c.text_dim, d, Activation::kGeluTanh));
    if (c.image_dim) {
      image_embedder_ =
          child("image_embedder", std::make_shared<WanImageEmbedding>(*c.image_dim, d));
    }
  }
  c10::ScalarType dtype() const {
    const auto* w = time_proj_->named_parameters().front().second;
    XF_CHECK(w->loaded(), "WanTransformer3DModel used before its weights were loaded");
    return w->compute_dtype();
  }
  struct Output {
    at::Tensor temb, timestep_proj, text, image;
  };
  Output forward(const at::Tensor& timestep, const at::Tensor& text,
                 const at::Tensor& image) const {
    const auto dtype = this->dtype();
    Output o;
    // diffusers: the float32 sinusoid, cast to time_embedder's dtype (float32: kept), then
    // temb.type_as(encoder_hidden_states) (the model dtype).
    const auto time_dtype = time_embedder_->named_parameters().front().second->compute_dtype();
    auto t = timestep_embedding(timestep, freq_dim_, true, 0.0).to(time_dtype);
    o.temb = time_embedder_->forward(t).to(dtype);                               // [B|1, D]
    o.timestep_proj = time_proj_->forward(activate(o.temb, Activation::kSilu));  // [B|1, 6D]
    o.text = text_embedder_->forward(text.to(dtype));                            // [B, L, D]
    if (image.defined()) o.image = image_embedder_->forward(image.to(dtype));    // [B, L_img, D]
    return o;
  }

 private:
  int64_t freq_dim_;
  std::shared_ptr<TimestepEmbedding> time_embedder_;
  std::shared_ptr<Linear> time_proj_;
  std::shared_ptr<PixArtAlphaTextProjection> text_embedder_;
  std::shared_ptr<WanImageEmbedding> image_embedder_;
};

// ---- attention ---------------------------------------------------------------------------------

// RMSNorm over all heads (qk_norm "rms_norm_across_heads") on this rank's heads: `weight`
// [D] sharded with the heads; the mean of squares is over the whole D, so with tensor
// parallelism the per-rank sums of squares are all-reduced first (diffusers' RMSNorm math
// otherwise: float32 statistics, weight in its dtype).
class HeadShardedRMSNorm : public Module {
 public:
  HeadShardedRMSNorm(int64_t dim, double eps, const TensorParallel& tp)
      : dim_(dim), eps_(eps), parts_(tp.size) {
    weight_ = &sharded_param("weight", {dim}, tp.shard(0));
  }
  at::Tensor forward(const at::Tensor& x, const TensorParallelOps& ops) const {
    XF_CHECK(x.size(-1) * parts_ == dim_, "RMSNorm across heads (", dim_, " over ", parts_,
             " ranks) got ", shape_string(x.sizes()));
    auto xf = x.to(at::kFloat);
    at::Tensor var;
    if (parts_ == 1) {
      var = xf.pow(2).mean(-1, /*keepdim=*/true);
    } else {
      auto sum = xf.pow(2).sum(-1, /*keepdim=*/true).contiguous();
      ops.all_reduce(sum);
      var = sum / static_cast<double>(dim_);
    }
    auto y = xf * at::rsqrt(var + eps_);
    const auto& w = weight_->value();
    if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) y = y.to(w.scalar_type());
    return (y * w).to(x.scalar_type());
  }

 private:
  int64_t dim_;
  double eps_;
  int parts_;
  ParamSlot* weight_;
};

// diffusers Attention with WanAttnProcessor2_0: to_q/k/v and to_out.0 with biases, norm_q /
// norm_k RMSNorm over all heads (rms_norm_across_heads, applied before the head split); with
// added_kv_proj_dim (I2V attn2) add_k_proj, add_v_proj and norm_added_k (no add_q_proj, no
// to_add_out). Tensor parallel: projections column-parallel by whole heads, to_out row-parallel.
class WanAttention : public Module {
 public:
  WanAttention(int64_t dim, int64_t heads, double eps, std::optional<int64_t> added_kv_proj_dim,
               const TensorParallel& tp)
      : heads_(heads / tp.size) {
    auto column = [&](int64_t in) { return std::make_shared<ColumnParallelLinear>(in, dim, tp); };
    to_q_ = child("to_q", column(dim));
    to_k_ = child("to_k", column(dim));
    to_v_ = child("to_v", column(dim));
    to_out_ = child("to_out.0", std::make_shared<RowParallelLinear>(dim, dim, tp));
    norm_q_ = child("norm_q", std::make_shared<HeadShardedRMSNorm>(dim, eps, tp));
    norm_k_ = child("norm_k", std::make_shared<HeadShardedRMSNorm>(dim, eps, tp));
    if (added_kv_proj_dim) {
      add_k_proj_ = child("add_k_proj", column(*added_kv_proj_dim));
      add_v_proj_ = child("add_v_proj", column(*added_kv_proj_dim));
      norm_added_k_ = child("norm_added_k", std::make_shared<HeadShardedRMSNorm>(dim, eps, tp));
    }
  }
  bool has_image_kv() const { return add_k_proj_ != nullptr; }

  // [B, N, D] -> [B, N, H_r, hd]
  at::Tensor query(const at::Tensor& x, const TensorParallelOps& ops) const {
    return split_heads(norm_q_->forward(to_q_->forward(x), ops), heads_);
  }
  // Text keys and values [B, L, H_r, hd].
  std::pair<at::Tensor, at::Tensor> key_value(const at::Tensor& c,
                                              const TensorParallelOps& ops) const {
    return {split_heads(norm_k_->forward(to_k_->forward(c), ops), heads_),
            split_heads(to_v_->forward(c), heads_)};
  }
  // Image keys and values (I2V) [B, L_img, H_r, hd].
  std::pair<at::Tensor, at::Tensor> image_key_value(const at::Tensor& c,
                                                    const TensorParallelOps& ops) const {
    return {split_heads(norm_added_k_->forward(add_k_proj_->forward(c), ops), heads_),
            split_heads(add_v_proj_->forward(c), heads_)};
  }
  // [B, N, H_r*hd] -> [B, N, D]
  at::Tensor out(const at::Tensor& o, const TensorParallelOps& ops) const {
    return to_out_->forward(o, ops);
  }

 private:
  int64_t heads_;
  std::shared_ptr<ColumnParallelLinear> to_q_, to_k_, to_v_, add_k_proj_, add_v_proj_;
  std::shared_ptr<RowParallelLinear> to_out_;
  std::shared_ptr<HeadShardedRMSNorm> norm_q_, norm_k_, norm_added_k_;
};

// FeedForward(dim, inner_dim=ffn_dim, "gelu-approximate"): net.0.proj column-parallel, tanh
// GELU, net.2 row-parallel (one all-reduce).
class WanFeedForward : public Module {
 public:
  WanFeedForward(int64_t dim, int64_t inner, const TensorParallel& tp) {
    proj_ = child("net.0.proj", std::make_shared<ColumnParallelLinear>(dim, inner, tp));
    out_ = child("net.2", std::make_shared<RowParallelLinear>(inner, dim, tp));
  }
  at::Tensor forward(const at::Tensor& x, const TensorParallelOps& ops) const {
    return out_->forward(
        feed_forward_activation(proj_->forward(x), FeedForwardKind::kGeluApproximate), ops);
  }

 private:
  std::shared_ptr<ColumnParallelLinear> proj_;
  std::shared_ptr<RowParallelLinear> out_;
};

// ---- WanTransformerBlock -----------------------------------------------------------------------

class WanBlock : public Module {
 public:
  WanBlock(const WanConfig& c, const TensorParallel& tp) : eps_(c.eps) {
    const int64_t d = c.inner_dim();
    // Declaration order as diffusers' __init__ (norm1 and norm3 have no parameters).
    attn1_ = child(
        "attn1", std::make_shared<WanAttention>(d, c.num_attention_heads, c.eps, std::nullopt, tp));
    attn2_ = child("attn2", std::make_shared<WanAttention>(d, c.num_attention_heads, c.eps,
                                                           c.added_kv_proj_dim, tp));
    if (c.cross_attn_norm) {
      norm2_ = child("norm2", std::make_shared<LayerNorm>(d, c.eps, true));
    }
    ffn_ = child("ffn", std::make_shared<WanFeedForward>(d, c.ffn_dim, tp));
    table_ = &param("scale_shift_table", {1, 6, d});
  }

  // x [B, n, D], context [B, (L_img +) L, D] (I2V: the first image_tokens are the image's),
  // timestep_proj [B|1, 6, D]; updates x.
  void forward(at::Tensor& x, const at::Tensor& context, int64_t image_tokens,
               const at::Tensor& timestep_proj, const RotaryTables& rope, const AttendFn& attend,
               int64_t layer, int64_t num_layers, const TensorParallelOps& ops) const {
    const int64_t b = x.size(0), n = x.size(1);
    const auto dtype = x.scalar_type();
    // Modulation in float32: (scale_shift_table + timestep_proj.float()).chunk(6, dim=1).
    auto mod = (table_->value().to(at::kFloat) + timestep_proj.to(at::kFloat)).chunk(6, 1);
    const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const auto &c_shift_msa = mod[3], &c_scale_msa = mod[4], &c_gate_msa = mod[5];

    // 1. Self-attention over the image tokens, with RoPE.
    {
      auto nx = modulated_norm(x, shift_msa, scale_msa, eps_);
      auto q = attn1_->query(nx, ops);
      auto [k, v] = attn1_->key_value(nx, ops);
      std::tie(q, k) = apply_rotary_emb_qk(q, k, rope);
      AttentionCall call;
      call.layer = layer;
      call.text_tokens = 0;
      call.cross = false;
      auto o = attend(q, k, v, call).reshape({b, n, -1}).to(q.scalar_type());
      x = (x.to(at::kFloat) + attn1_->out(o, ops) * gate_msa).to(dtype);
    }
    // 2. Cross-attention to the text (and, I2V, to the image embeddings); no gate.
    {
      auto nx = norm2_ ? norm2_->forward(x.to(at::kFloat)).to(dtype) : x;
      at::Tensor text = context, image;
      if (attn2_->has_image_kv()) {
        XF_CHECK(image_tokens > 0 && image_tokens < context.size(1), "blocks.", layer,
                 ": an image-to-video block needs the image tokens ahead of the text in its "
                 "context (",
                 image_tokens, " of ", context.size(1), ")");
        image = context.narrow(1, 0, image_tokens);
        text = context.narrow(1, image_tokens, context.size(1) - image_tokens);
      }
      auto q = attn2_->query(nx, ops);
      auto [k, v] = attn2_->key_value(text, ops);
      AttentionCall call;
      call.layer = num_layers + layer;
      call.cross = true;
      at::Tensor o_img;
      if (image.defined()) {
        auto [ki, vi] = attn2_->image_key_value(image, ops);
        AttentionCall call_img = call;
        call_img.layer = 2 * num_layers + layer;
        o_img = attend(q, ki, vi, call_img).reshape({b, n, -1}).to(q.scalar_type());
      }
      auto o = attend(q, k, v, call).reshape({b, n, -1}).to(q.scalar_type());
      if (o_img.defined()) o = o + o_img;
      x = x + attn2_->out(o, ops);
    }
    // 3. Feed-forward.
    {
      auto nx = modulated_norm(x, c_shift_msa, c_scale_msa, eps_);
      auto ff = ffn_->forward(nx, ops);
      x = (x.to(at::kFloat) + ff.to(at::kFloat) * c_gate_msa).to(dtype);
    }
  }

 private:
  double eps_;
  std::shared_ptr<WanAttention> attn1_, attn2_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<WanFeedForward> ffn_;
  ParamSlot* table_;
};

// ---- patch embedding ---------------------------------------------------------------------------

// nn.Conv3d(C, D, kernel = stride = patch) as a matmul over patchified tokens: `weight`
// [D, C, pt, ph, pw], `bias` [D].
class WanTransformer3DModel::PatchEmbedding : public Module {
 public:
  PatchEmbedding(int64_t in_channels, const std::vector<int64_t>& patch, int64_t dim) : dim_(dim) {
    weight_ = &param("weight", {dim, in_channels, patch[0], patch[1], patch[2]});
    bias_ = &param("bias", {dim});
    weight_->layer = bias_->layer = LayerKind::kConv;
  }
  at::Tensor forward(const at::Tensor& tokens) const {  // [B, n, C*pt*ph*pw] -> [B, n, D]
    return linear(tokens, weight_->value().reshape({dim_, -1}), bias_->value());
  }

 private:
  int64_t dim_;
  ParamSlot* weight_;
  ParamSlot* bias_;
};

// ---- WanTransformer3DModel ---------------------------------------------------------------------

WanTransformer3DModel::WanTransformer3DModel(WanConfig config, dit::DiTPart part, TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  const auto& c = config_;
  c.validate();
  resolve_part();
  const int64_t dim = c.inner_dim();
  auto held = [&](int64_t block) { return part_.block_begin <= block && block < part_.block_end; };
  // Declaration order follows diffusers' __init__ (rope has no parameters).
  if (part_.embedders) {
    patch_embedding_ = child("patch_embedding",
                             std::make_shared<PatchEmbedding>(c.in_channels, c.patch_size, dim));
  }
  condition_embedder_ = child("condition_embedder", std::make_shared<WanConditionEmbedder>(c));
  blocks_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (!held(i)) continue;
    blocks_[i] = child("blocks." + std::to_string(i), std::make_shared<WanBlock>(c, tp_));
  }
  if (part_.head) {
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, c.output_dim()));
    scale_shift_table_ = &param("scale_shift_table", {1, 2, dim});
  }
  // diffusers' _keep_in_fp32_modules: a parameter with a name component time_embedder,
  // scale_shift_table, norm1, norm2 or norm3 loads in float32 whatever the model dtype.
  for (auto& [name, slot] : named_parameters()) {
    size_t begin = 0;
    while (begin <= name.size()) {
      const size_t end = std::min(name.find('.', begin), name.size());
      const std::string part = name.substr(begin, end - begin);
      if (part == "time_embedder" || part == "scale_shift_table" || part == "norm1" ||
          part == "norm2" || part == "norm3") {
        slot->dtype = at::kFloat;
        break;
      }
      begin = end + 1;
    }
  }
}

WanTransformer3DModel::~WanTransformer3DModel() = default;

c10::ScalarType WanTransformer3DModel::dtype() const { return condition_embedder_->dtype(); }

std::vector<int64_t> WanTransformer3DModel::block_parameters() const {
  // Declaring a block allocates no tensors; all blocks are alike.
  WanBlock block(config_, TensorParallel{});
  return std::vector<int64_t>(config_.num_layers, block.num_parameters());
}

std::vector<int64_t> WanTransformer3DModel::other_parameters() const {
  const auto& c = config_;
  const int64_t d = c.inner_dim();
  PatchEmbedding patch(c.in_channels, c.patch_size, d);
  WanConditionEmbedder conditioning(c);
  const int64_t head = (d * c.output_dim() + c.output_dim()) + 2 * d;
  return {patch.num_parameters(), conditioning.num_parameters(), head};
}

const std::vector<std::string>& WanTransformer3DModel::input_names() {
  static const std::vector<std::string> kNames = {
      "hidden_states", "timestep", "encoder_hidden_states", "encoder_hidden_states_image"};
  return kNames;
}

at::Tensor WanTransformer3DModel::patchify(const at::Tensor& latents,
                                           const std::vector<int64_t>& patch) {
  XF_CHECK(latents.dim() == 5, "Wan patchify: latents must be [B, C, F, H, W], got ",
           shape_string(latents.sizes()));
  XF_CHECK(patch.size() == 3 && patch[0] >= 1 && patch[1] >= 1 && patch[2] >= 1,
           "Wan patchify: patch must be (t, h, w), got ", grid_string(patch));
  XF_CHECK(latents.size(2) % patch[0] == 0 && latents.size(3) % patch[1] == 0 &&
               latents.size(4) % patch[2] == 0,
           "Wan patchify: frames, height and width of ", shape_string(latents.sizes()),
           " must be multiples of the patch size ", grid_string(patch));
  const int64_t b = latents.size(0), ch = latents.size(1);
  const int64_t pt = patch[0], ph = patch[1], pw = patch[2];
  const int64_t f = latents.size(2) / pt, h = latents.size(3) / ph, w = latents.size(4) / pw;
  return latents.reshape({b, ch, f, pt, h, ph, w, pw})
      .permute({0, 2, 4, 6, 1, 3, 5, 7})  // [B, F', H', W', C, pt, ph, pw]
      .reshape({b, f * h * w, ch * pt * ph * pw});
}

at::Tensor WanTransformer3DModel::unpatchify(const at::Tensor& tokens, int64_t frames,
                                             int64_t height, int64_t width,
                                             const std::vector<int64_t>& patch, int64_t channels) {
  XF_CHECK(patch.size() == 3, "Wan unpatchify: patch must be (t, h, w), got ", grid_string(patch));
  const int64_t pt = patch[0], ph = patch[1], pw = patch[2];
  XF_CHECK(tokens.dim() == 3 && tokens.size(1) == frames * height * width &&
               tokens.size(2) == pt * ph * pw * channels,
           "Wan unpatchify: tokens must be [B, ", frames * height * width, ", ",
           pt * ph * pw * channels, "] for a ", frames, " x ", height, " x ", width, " grid of ",
           grid_string(patch), " patches of ", channels, " channels, got ",
           shape_string(tokens.sizes()));
  const int64_t b = tokens.size(0);
  return tokens.reshape({b, frames, height, width, pt, ph, pw, channels})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .reshape({b, channels, frames * pt, height * ph, width * pw});
}

at::Tensor WanTransformer3DModel::token_ids(int64_t frames, int64_t height, int64_t width,
                                            const at::TensorOptions& options) {
  XF_CHECK(frames >= 1 && height >= 1 && width >= 1, "Wan token_ids: empty grid ", frames, " x ",
           height, " x ", width);
  auto opts = options.dtype(at::kFloat);
  const std::vector<int64_t> shape = {frames, height, width};
  auto f = at::arange(frames, opts).view({frames, 1, 1}).expand(shape);
  auto h = at::arange(height, opts).view({1, height, 1}).expand(shape);
  auto w = at::arange(width, opts).view({1, 1, width}).expand(shape);
  return at::stack({f.reshape({-1}), h.reshape({-1}), w.reshape({-1})}, 1);  // [N, 3]
}

dit::DiTInputs WanTransformer3DModel::parse_forward_inputs(const TensorMap& inputs) const {
  XF_CONTEXT("WanTransformer3DModel.forward inputs");
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "WanTransformer3DModel.forward: unknown input(s) ", join(unknown),
           "; accepted inputs: ", join(names));
  auto get = [&](const std::string& name) {
    auto it = inputs.find(name);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  const auto& c = config_;
  const auto& p = c.patch_size;
  auto hs = get("hidden_states");
  const std::string hs_shape = "[B, " + std::to_string(c.in_channels) + ", F, H, W]";
  XF_CHECK(hs.defined(), "missing required input 'hidden_states' (expected ", hs_shape, ")");
  XF_CHECK(hs.dim() == 5 && hs.size(1) == c.in_channels && hs.size(0) >= 1,
           "hidden_states must be ", hs_shape, ", got ", shape_string(hs.sizes()));
  XF_CHECK(at::isFloatingType(hs.scalar_type()), "hidden_states must be floating point, got ",
           hs.scalar_type());
  XF_CHECK(hs.size(2) >= p[0] && hs.size(3) >= p[1] && hs.size(4) >= p[2] &&
               hs.size(2) % p[0] == 0 && hs.size(3) % p[1] == 0 && hs.size(4) % p[2] == 0,
           "hidden_states frames, height and width (", hs.size(2), " x ", hs.size(3), " x ",
           hs.size(4), ") must be positive multiples of patch_size ", grid_string(p));
  const int64_t gf = hs.size(2) / p[0], gh = hs.size(3) / p[1], gw = hs.size(4) / p[2];
  const int64_t m = c.rope_max_seq_len;
  XF_CHECK(gf <= m && gh <= m && gw <= m, "hidden_states ", shape_string(hs.sizes()), " is a ", gf,
           " x ", gh, " x ", gw, " patch grid; every side must be at most rope_max_seq_len ", m);
  dit::DiTInputs in;
  in.tokens = patchify(hs, p);
  in.token_ids = token_ids(gf, gh, gw, hs.options());
  in.text = get("encoder_hidden_states");
  in.timestep = get("timestep");
  auto image = get("encoder_hidden_states_image");
  if (image.defined()) in.extra["encoder_hidden_states_image"] = image;
  check_inputs(in);
  return in;
}

void WanTransformer3DModel::check_inputs(const dit::DiTInputs& in) const {
  XF_CONTEXT("WanTransformer3DModel.forward inputs");
  const auto& c = config_;
  const std::string tok_shape = "[B, N, " + std::to_string(c.token_channels()) + "]";
  const std::string enc_shape = "[B, L, " + std::to_string(c.text_dim) + "]";
  auto require = [](const at::Tensor& t, const char* name, const std::string& shape) {
    XF_CHECK(t.defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  require(in.tokens, "hidden_states", tok_shape + " patchified tokens");
  require(in.token_ids, "token_ids", "[N, 3]");
  require(in.text, "encoder_hidden_states", enc_shape);
  require(in.timestep, "timestep", "[B]");

  const auto& tok = in.tokens;
  XF_CHECK(
      tok.dim() == 3 && tok.size(2) == c.token_channels() && tok.size(0) >= 1 && tok.size(1) >= 1,
      "hidden_states tokens must be ", tok_shape, " (", grid_string(c.patch_size), " patches of ",
      c.in_channels, " channels), got ", shape_string(tok.sizes()));
  const int64_t b = tok.size(0), n = tok.size(1);
  const auto& ids = in.token_ids;
  XF_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) == 3, "token_ids must be [", n,
           ", 3] ((f, h, w) of each token), got ", shape_string(ids.sizes()));
  XF_CHECK(at::isFloatingType(ids.scalar_type()) || at::isIntegralType(ids.scalar_type(), false),
           "token_ids must be a real tensor, got ", ids.scalar_type());
  // The ids index the rotary tables. Their values are read only where that is free (host
  // tensors): on a GPU it would synchronise every step, and the ids there are the ones
  // token_ids() made from a grid checked against rope_max_seq_len (the pipeline,
  // parse_forward_inputs).
  if (ids.device().is_cpu()) {
    auto f = ids.to(at::kDouble);
    const double lo = f.min().item<double>(), hi = f.max().item<double>();
    const bool integral = at::equal(f, f.round());
    XF_CHECK(integral && lo >= 0 && hi <= c.rope_max_seq_len - 1,
             "token_ids must be whole grid positions in [0, rope_max_seq_len ", c.rope_max_seq_len,
             "), got values in [", lo, ", ", hi, "]");
  }
  const auto& enc = in.text;
  XF_CHECK(enc.dim() == 3 && enc.size(0) == b && enc.size(2) == c.text_dim && enc.size(1) >= 1,
           "encoder_hidden_states must be [", b, ", L, ", c.text_dim, "], got ",
           shape_string(enc.sizes()));
  XF_CHECK(in.timestep.dim() == 1 && (in.timestep.size(0) == b || in.timestep.size(0) == 1),
           "timestep must be [", b, "] (or [1]), got ", shape_string(in.timestep.sizes()));
  XF_CHECK(at::isFloatingType(in.timestep.scalar_type()) ||
               at::isIntegralType(in.timestep.scalar_type(), false),
           "timestep must be an integer or floating tensor, got ", in.timestep.scalar_type());
  XF_CHECK(at::isFloatingType(tok.scalar_type()) && at::isFloatingType(enc.scalar_type()),
           "hidden_states and encoder_hidden_states must be floating point, got ",
           tok.scalar_type(), ", ", enc.scalar_type());
  for (const auto& [name, t] : in.extra) {
    XF_CHECK(name == "encoder_hidden_states_image", "WanTransformer3DModel: unknown extra input '",
             name, "' (accepted: encoder_hidden_states_image)");
  }
  auto it = in.extra.find("encoder_hidden_states_image");
  const at::Tensor image = it == in.extra.end() ? at::Tensor() : it->second;
  if (!c.image_dim) {
    XF_CHECK(!image.defined(),
             "encoder_hidden_states_image is given but this model has no "
             "image embedder (image_dim is null in config.json: a text-to-video model)");
    return;
  }
  const std::string img_shape =
      "[" + std::to_string(b) + ", L_img, " + std::to_string(*c.image_dim) + "]";
  if (c.added_kv_proj_dim) {
    XF_CHECK(image.defined(), "missing required input 'encoder_hidden_states_image' (expected ",
             img_shape, ": the CLIP image embeddings of an image-to-video model)");
  }
  if (!image.defined()) return;
  XF_CHECK(
      image.dim() == 3 && image.size(0) == b && image.size(2) == *c.image_dim && image.size(1) >= 1,
      "encoder_hidden_states_image must be ", img_shape, ", got ", shape_string(image.sizes()));
  XF_CHECK(at::isFloatingType(image.scalar_type()),
           "encoder_hidden_states_image must be floating point, got ", image.scalar_type());
}

dit::DiTActivations WanTransformer3DModel::embed(const dit::DiTInputs& in) const {
  XF_CONTEXT("WanTransformer3DModel.embed");
  const auto dtype = this->dtype();
  dit::DiTActivations a;
  if (patch_embedding_) a.hidden = patch_embedding_->forward(in.tokens.to(dtype));  // [B, n, D]
  at::Tensor image;
  if (auto it = in.extra.find("encoder_hidden_states_image"); it != in.extra.end()) {
    image = it->second;
  }
  // Every part computes the conditioning and the text stream (PipeFusion sends only the image).
  auto cond = condition_embedder_->forward(in.timestep, in.text, image);
  a.temb = cond.temb;
  a.extra["timestep_proj"] = cond.timestep_proj.unflatten(1, {6, -1});  // [B|1, 6, D]
  a.context = cond.image.defined() ? at::cat({cond.image, cond.text}, 1) : cond.text;
  // How many of the context's tokens are the image's: however many the image encoder gave (257
  // for Wan 2.1's CLIP image, 514 for two pictures), as diffusers >= 0.42 splits them.
  if (cond.image.defined()) a.extra["context_image"] = cond.image;
  a.text_tokens = a.context.size(1);
  a.rope = multi_axis_rope(in.token_ids, config_.rope_axes_dims());
  return a;
}

void WanTransformer3DModel::run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const {
  const int64_t layers = config_.num_layers;
  XF_CHECK(0 <= begin && begin <= end && end <= layers, "run_blocks: range [", begin, ", ", end,
           ") is outside the ", layers, " blocks");
  if (begin == end) return;
  XF_CHECK(a.hidden.defined(), "run_blocks: the image stream is undefined (a part without the ",
           "embedders needs the previous stage's activations)");
  XF_CHECK(a.context.defined() && a.extra.count("timestep_proj") && a.rope.cos.defined(),
           "run_blocks: the activations lack the text stream, timestep_proj or the rotary tables "
           "(they come from embed())");
  XF_CHECK(a.rope.cos.size(0) == a.hidden.size(1), "run_blocks: ", a.rope.cos.size(0),
           " rotary rows for ", a.hidden.size(1), " image tokens");
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  const auto& timestep_proj = a.extra.at("timestep_proj");
  const auto image = a.extra.find("context_image");
  const int64_t image_tokens = image == a.extra.end() ? 0 : image->second.size(1);
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(blocks_[i], "blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    blocks_[i]->forward(a.hidden, a.context, image_tokens, timestep_proj, a.rope, attend, i, layers,
                        tp_ops());
  }
}

at::Tensor WanTransformer3DModel::finalize(const dit::DiTActivations& a) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  XF_CHECK(a.hidden.defined(), "finalize: the image stream is undefined");
  // shift, scale = (scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
  auto mod = (scale_shift_table_->value() + a.temb.unsqueeze(1)).chunk(2, 1);
  auto x = modulated_norm(a.hidden, mod[0].to(at::kFloat), mod[1].to(at::kFloat), config_.eps);
  return proj_out_->forward(x);  // [B, n, pt*ph*pw*out_C]
}

TensorMap WanTransformer3DModel::forward_outputs(const at::Tensor& tokens,
                                                 const TensorMap& inputs) const {
  auto it = inputs.find("hidden_states");
  XF_CHECK(it != inputs.end() && it->second.dim() == 5,
           "WanTransformer3DModel: the outputs need the 5-D hidden_states input");
  const auto& p = config_.patch_size;
  const auto& hs = it->second;
  return {{"sample", unpatchify(tokens, hs.size(2) / p[0], hs.size(3) / p[1], hs.size(4) / p[2], p,
                                config_.resolved_out_channels())}};
}

std::shared_ptr<dit::DiTTransformer> make_wan_transformer(const nlohmann::json& config,
                                                          const std::string& config_path,
                                                          dit::DiTPart part, TensorParallel tp) {
  return std::make_shared<WanTransformer3DModel>(WanConfig::from_json(config, config_path), part,
                                                 tp);
}

}  // namespace xfuser::models::wan
