#include "models/flux2/flux2_transformer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/kernels.h"
#include "models/dit/dit_pipefusion.h"
#include "profiling/trace.h"

namespace xfuser::models::flux2 {
namespace {

constexpr double kFp16Max = 65504.0;

at::Tensor clip_fp16(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  // libtorch's CPU clamp has no float16 kernel; the float32 round trip is exact.
  if (!x.is_cuda()) return x.to(at::kFloat).clamp(-kFp16Max, kFp16Max).to(at::kHalf);
  return x.clamp(-kFp16Max, kFp16Max);
}

// [B, S, H*hd] -> [B, S, H, hd]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads});
}

// Flux2SwiGLU: silu(first half) * second half of the last dim (the FIRST half is gated, unlike
// diffusers' generic "swiglu" FeedForward).
at::Tensor swiglu(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return activate(x.narrow(-1, 0, half), Activation::kSilu) * x.narrow(-1, half, half);
}

// One modulation set (shift, scale, gate), each [B|1, D], out of a [B|1, k*3D] output.
struct Mod {
  at::Tensor shift, scale, gate;
};
Mod mod_set(const at::Tensor& mod, int64_t set, int64_t dim) {
  return {mod.narrow(1, (3 * set) * dim, dim), mod.narrow(1, (3 * set + 1) * dim, dim),
          mod.narrow(1, (3 * set + 2) * dim, dim)};
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

using AttendFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const AttentionCall&)>;

}  // namespace

// ---- timestep / guidance embedding --------------------------------------------------------------

// diffusers TimestepEmbedding with sample_proj_bias=False: linear_1 (in -> D), SiLU, linear_2.
class Flux2TimestepEmbedding : public Module {
 public:
  Flux2TimestepEmbedding(int64_t in_channels, int64_t dim) {
    linear_1_ = child("linear_1", std::make_shared<Linear>(in_channels, dim, false));
    linear_2_ = child("linear_2", std::make_shared<Linear>(dim, dim, false));
  }
  at::Tensor forward(const at::Tensor& x) const {
    return linear_2_->forward(activate(linear_1_->forward(x), Activation::kSilu));
  }
  const Linear& linear_1() const { return *linear_1_; }

 private:
  std::shared_ptr<Linear> linear_1_, linear_2_;
};

// ---- double-stream block ------------------------------------------------------------------------

// Flux2TransformerBlock: Flux2Attention (to_q/k/v, add_q/k/v_proj, RMS QK norms, to_out.0,
// to_add_out) between parameter-free LayerNorms modulated by the shared parameters, and SwiGLU
// feed-forwards ff / ff_context (linear_in -> 2M, linear_out M -> D).
class Flux2TransformerBlock : public Module {
 public:
  Flux2TransformerBlock(const Flux2Config& c, const TensorParallel& tp)
      : heads_(c.num_attention_heads / tp.size),
        inner_(heads_ * c.attention_head_dim),
        eps_(c.eps) {
    const int64_t dim = c.inner_dim(), hd = c.attention_head_dim, m = c.mlp_hidden_dim();
    auto column = [&](int64_t in, int64_t out, std::vector<int64_t> segments = {}) {
      return std::make_shared<ColumnParallelLinear>(in, out, tp, false, std::move(segments));
    };
    auto row = [&](int64_t in, int64_t out) {
      return std::make_shared<RowParallelLinear>(in, out, tp, false);
    };
    auto rms = [&] { return std::make_shared<RMSNorm>(hd, c.eps); };
    // Declaration order follows diffusers' __init__.
    to_q_ = child("attn.to_q", column(dim, dim));
    to_k_ = child("attn.to_k", column(dim, dim));
    to_v_ = child("attn.to_v", column(dim, dim));
    norm_q_ = child("attn.norm_q", rms());
    norm_k_ = child("attn.norm_k", rms());
    to_out_ = child("attn.to_out.0", row(dim, dim));
    norm_added_q_ = child("attn.norm_added_q", rms());
    norm_added_k_ = child("attn.norm_added_k", rms());
    add_q_proj_ = child("attn.add_q_proj", column(dim, dim));
    add_k_proj_ = child("attn.add_k_proj", column(dim, dim));
    add_v_proj_ = child("attn.add_v_proj", column(dim, dim));
    to_add_out_ = child("attn.to_add_out", row(dim, dim));
    ff_in_ = child("ff.linear_in", column(dim, 2 * m, {m, m}));
    ff_out_ = child("ff.linear_out", row(m, dim));
    ff_context_in_ = child("ff_context.linear_in", column(dim, 2 * m, {m, m}));
    ff_context_out_ = child("ff_context.linear_out", row(m, dim));
  }

  // x [B, N, D], c [B, L, D]; mod_img / mod_txt [B|1, 6D]; rope [L + N, hd]; updates x and c.
  void forward(at::Tensor& x, at::Tensor& c, const at::Tensor& mod_img, const at::Tensor& mod_txt,
               const RotaryTables& rope, const AttendFn& attend, int64_t layer,
               const TensorParallelOps& ops) const {
    const int64_t b = x.size(0), n = x.size(1), l = c.size(1), dim = x.size(2);
    const Mod msa = mod_set(mod_img, 0, dim), mlp = mod_set(mod_img, 1, dim);
    const Mod c_msa = mod_set(mod_txt, 0, dim), c_mlp = mod_set(mod_txt, 1, dim);
    auto nx = kernels().norm_modulate(x, msa.shift, msa.scale, eps_);      // [B, N, D]
    auto nc = kernels().norm_modulate(c, c_msa.shift, c_msa.scale, eps_);  // [B, L, D]

    // [B, L + N, H_r, hd] each, text first
    auto q = at::cat({norm_added_q_->forward(split_heads(add_q_proj_->forward(nc), heads_)),
                      norm_q_->forward(split_heads(to_q_->forward(nx), heads_))},
                     1);
    auto k = at::cat({norm_added_k_->forward(split_heads(add_k_proj_->forward(nc), heads_)),
                      norm_k_->forward(split_heads(to_k_->forward(nx), heads_))},
                     1);
    auto v = at::cat(
        {split_heads(add_v_proj_->forward(nc), heads_), split_heads(to_v_->forward(nx), heads_)},
        1);
    std::tie(q, k) = apply_rotary_emb_qk(q, k, rope);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = l;
    call.text_first = true;
    // [B, L + N, H_r * hd]: this rank's heads
    auto o = attend(q, k, v, call).reshape({b, l + n, inner_}).to(q.scalar_type());
    auto img_out = to_out_->forward(o.narrow(1, l, n), ops);      // [B, N, D]
    auto txt_out = to_add_out_->forward(o.narrow(1, 0, l), ops);  // [B, L, D]

    x = gated_residual(x, msa.gate, img_out);
    auto hx = kernels().norm_modulate(x, mlp.shift, mlp.scale, eps_);
    x = gated_residual(x, mlp.gate, ff_out_->forward(swiglu(ff_in_->forward(hx)), ops));

    c = gated_residual(c, c_msa.gate, txt_out);
    auto hc = kernels().norm_modulate(c, c_mlp.shift, c_mlp.scale, eps_);
    c = clip_fp16(gated_residual(
        c, c_mlp.gate, ff_context_out_->forward(swiglu(ff_context_in_->forward(hc)), ops)));
  }

 private:
  int64_t heads_, inner_;
  double eps_;
  std::shared_ptr<ColumnParallelLinear> to_q_, to_k_, to_v_, add_q_proj_, add_k_proj_, add_v_proj_,
      ff_in_, ff_context_in_;
  std::shared_ptr<RowParallelLinear> to_out_, to_add_out_, ff_out_, ff_context_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

// ---- single-stream block ------------------------------------------------------------------------

// Flux2SingleTransformerBlock: a parameter-free LayerNorm modulated by the shared parameters, then
// Flux2ParallelSelfAttention: to_qkv_mlp_proj [3 * inner + 2M] -> attention on q/k/v (RMS QK
// norms) and SwiGLU on the MLP part, to_out over [attention inner | mlp M].
class Flux2SingleTransformerBlock : public Module {
 public:
  Flux2SingleTransformerBlock(const Flux2Config& c, const TensorParallel& tp)
      : heads_(c.num_attention_heads / tp.size),
        inner_(heads_ * c.attention_head_dim),
        mlp_(c.mlp_hidden_dim() / tp.size),
        eps_(c.eps) {
    const int64_t dim = c.inner_dim(), m = c.mlp_hidden_dim();
    // Every segment sharded on its own: this rank's output is [q_r | k_r | v_r | gate_r | up_r]
    // and its to_out input [attention heads_r | mlp_r], exactly cat({o, mlp}) below.
    to_qkv_mlp_proj_ =
        child("attn.to_qkv_mlp_proj",
              std::make_shared<ColumnParallelLinear>(dim, 3 * dim + 2 * m, tp, false,
                                                     std::vector<int64_t>{dim, dim, dim, m, m}));
    norm_q_ = child("attn.norm_q", std::make_shared<RMSNorm>(c.attention_head_dim, c.eps));
    norm_k_ = child("attn.norm_k", std::make_shared<RMSNorm>(c.attention_head_dim, c.eps));
    to_out_ = child("attn.to_out", std::make_shared<RowParallelLinear>(
                                       dim + m, dim, tp, false, std::vector<int64_t>{dim, m}));
  }

  // h [B, L + N, D] joint sequence, text first; mod [B|1, 3D].
  at::Tensor forward(const at::Tensor& h, const at::Tensor& mod, const RotaryTables& rope,
                     const AttendFn& attend, int64_t layer, int64_t text_tokens,
                     const TensorParallelOps& ops) const {
    const int64_t b = h.size(0), s = h.size(1);
    const Mod m = mod_set(mod, 0, h.size(2));
    auto nh = kernels().norm_modulate(h, m.shift, m.scale, eps_);
    auto p = to_qkv_mlp_proj_->forward(nh);  // [B, S, 3 inner_r + 2 mlp_r]
    auto q = norm_q_->forward(split_heads(p.narrow(2, 0, inner_), heads_));
    auto k = norm_k_->forward(split_heads(p.narrow(2, inner_, inner_), heads_));
    auto v = split_heads(p.narrow(2, 2 * inner_, inner_).contiguous(), heads_);
    auto mlp = swiglu(p.narrow(2, 3 * inner_, 2 * mlp_));  // [B, S, mlp_r]
    std::tie(q, k) = apply_rotary_emb_qk(q, k, rope);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = text_tokens;
    call.text_first = true;
    // [B, S, H_r * hd]: this rank's heads
    auto o = attend(q, k, v, call).reshape({b, s, inner_}).to(q.scalar_type());
    return clip_fp16(gated_residual(h, m.gate, to_out_->forward(at::cat({o, mlp}, 2), ops)));
  }

 private:
  int64_t heads_, inner_, mlp_;
  double eps_;
  std::shared_ptr<ColumnParallelLinear> to_qkv_mlp_proj_;
  std::shared_ptr<RowParallelLinear> to_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_;
};

// ---- the model ----------------------------------------------------------------------------------

Flux2Transformer2DModel::Flux2Transformer2DModel(Flux2Config config, dit::DiTPart part,
                                                 TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  config_.validate("Flux2Transformer2DModel config");
  resolve_part();
  const int64_t dim = config_.inner_dim(), m = config_.mlp_hidden_dim();
  XF_CHECK(m % tp.size == 0, "Flux2Transformer2DModel: the feed-forward width ", m, " (inner_dim ",
           dim, " x mlp_ratio ", config_.mlp_ratio,
           ") is not divisible by the tensor parallel degree ", tp.size,
           " (--tensor_parallel_degree)");
  auto held = [&](int64_t block) { return part_.block_begin <= block && block < part_.block_end; };
  // Declaration order follows diffusers' __init__.
  const int64_t channels = config_.timestep_guidance_channels;
  timestep_embedder_ = child("time_guidance_embed.timestep_embedder",
                             std::make_shared<Flux2TimestepEmbedding>(channels, dim));
  guidance_embedder_ = child("time_guidance_embed.guidance_embedder",
                             std::make_shared<Flux2TimestepEmbedding>(channels, dim));
  auto modulation = [&](const std::string& name, int64_t sets) {
    return child(name + ".linear",
                 std::make_shared<ColumnParallelLinear>(dim, 3 * sets * dim, tp, false));
  };
  mod_img_ = modulation("double_stream_modulation_img", 2);
  mod_txt_ = modulation("double_stream_modulation_txt", 2);
  mod_single_ = modulation("single_stream_modulation", 1);
  if (part_.embedders) {
    x_embedder_ = child("x_embedder", std::make_shared<Linear>(config_.in_channels, dim, false));
    context_embedder_ = child("context_embedder",
                              std::make_shared<Linear>(config_.joint_attention_dim, dim, false));
  }
  // Blocks outside the part stay null (their slots keep the global indices).
  blocks_.resize(config_.num_layers);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    if (!held(i)) continue;
    blocks_[i] = child("transformer_blocks." + std::to_string(i),
                       std::make_shared<Flux2TransformerBlock>(config_, tp));
  }
  single_blocks_.resize(config_.num_single_layers);
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    if (!held(config_.num_layers + i)) continue;
    single_blocks_[i] = child("single_transformer_blocks." + std::to_string(i),
                              std::make_shared<Flux2SingleTransformerBlock>(config_, tp));
  }
  if (part_.head) {
    norm_out_ = child(
        "norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, config_.eps, false));
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, config_.output_dim(), false));
  }
}

Flux2Transformer2DModel::~Flux2Transformer2DModel() = default;

c10::ScalarType Flux2Transformer2DModel::dtype() const {
  // time_guidance_embed is held by every part; its weights have the compute dtype.
  const auto* w = timestep_embedder_->linear_1().named_parameters().front().second;
  XF_CHECK(w->loaded(), "Flux2Transformer2DModel used before its weights were loaded");
  return w->compute_dtype();
}

const std::vector<std::string>& Flux2Transformer2DModel::input_names() {
  static const std::vector<std::string> kNames = {
      "hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids", "guidance"};
  return kNames;
}

Flux2Inputs Flux2Transformer2DModel::parse_inputs(const TensorMap& inputs) const {
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "Flux2Transformer2DModel.forward: unknown input(s) ", join(unknown),
           "; accepted inputs: ", join(names));
  auto get = [&](const std::string& name) {
    auto it = inputs.find(name);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  Flux2Inputs in;
  in.hidden_states = get("hidden_states");
  in.encoder_hidden_states = get("encoder_hidden_states");
  in.timestep = get("timestep");
  in.img_ids = get("img_ids");
  in.txt_ids = get("txt_ids");
  in.guidance = get("guidance");
  check_inputs(in);
  return in;
}

void Flux2Transformer2DModel::check_inputs(const Flux2Inputs& in) const {
  XF_CONTEXT("Flux2Transformer2DModel.forward inputs");
  const auto& c = config_;
  const int64_t axes = c.rope_axes();
  auto require = [](const at::Tensor& t, const char* name, const std::string& shape) {
    XF_CHECK(t.defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  const std::string hs_shape = "[B, N, " + std::to_string(c.in_channels) + "]";
  const std::string enc_shape = "[B, L, " + std::to_string(c.joint_attention_dim) + "]";
  require(in.hidden_states, "hidden_states", hs_shape);
  require(in.encoder_hidden_states, "encoder_hidden_states", enc_shape);
  require(in.timestep, "timestep", "[B]");
  require(in.img_ids, "img_ids", "[N, " + std::to_string(axes) + "]");
  require(in.txt_ids, "txt_ids", "[L, " + std::to_string(axes) + "]");
  require(in.guidance, "guidance", "[B] (FLUX.2 always embeds the guidance scale)");

  const auto& hs = in.hidden_states;
  XF_CHECK(hs.dim() == 3 && hs.size(2) == c.in_channels, "hidden_states must be ", hs_shape,
           ", got ", shape_string(hs.sizes()));
  const int64_t b = hs.size(0), n = hs.size(1);
  XF_CHECK(b >= 1 && n >= 1, "hidden_states must have a batch and tokens, got ",
           shape_string(hs.sizes()));
  const auto& enc = in.encoder_hidden_states;
  XF_CHECK(enc.dim() == 3 && enc.size(0) == b && enc.size(2) == c.joint_attention_dim,
           "encoder_hidden_states must be [", b, ", L, ", c.joint_attention_dim, "], got ",
           shape_string(enc.sizes()));
  const int64_t l = enc.size(1);
  for (const auto* t : {&in.timestep, &in.guidance}) {
    const char* name = t == &in.timestep ? "timestep" : "guidance";
    XF_CHECK(t->dim() == 1 && (t->size(0) == b || t->size(0) == 1), name, " must be [", b,
             "] (or [1]), got ", shape_string(t->sizes()));
  }
  auto check_ids = [&](const at::Tensor& ids, const char* name, int64_t tokens, const char* what) {
    const bool ok = (ids.dim() == 2 || (ids.dim() == 3 && ids.size(0) >= 1)) &&
                    ids.size(-2) == tokens && ids.size(-1) == axes;
    XF_CHECK(ok, name, " must be [", tokens, ", ", axes, "] (", what,
             " x rope axes (t, h, w, l)), or [B, ", tokens, ", ", axes, "], got ",
             shape_string(ids.sizes()));
    XF_CHECK(at::isFloatingType(ids.scalar_type()) || at::isIntegralType(ids.scalar_type(), false),
             name, " must be a real tensor, got ", ids.scalar_type());
  };
  check_ids(in.img_ids, "img_ids", n, "image tokens of hidden_states");
  check_ids(in.txt_ids, "txt_ids", l, "text tokens of encoder_hidden_states");
  for (const auto* t : {&hs, &enc}) {
    XF_CHECK(at::isFloatingType(t->scalar_type()),
             "hidden_states and encoder_hidden_states must be floating point, got ",
             t->scalar_type());
  }
}

dit::DiTActivations Flux2Transformer2DModel::embed(const Flux2Inputs& in) const {
  XF_CONTEXT("Flux2Transformer2DModel.embed");
  const auto dtype = this->dtype();
  const int64_t channels = config_.timestep_guidance_channels;
  dit::DiTActivations a;
  if (x_embedder_) a.hidden = x_embedder_->forward(in.hidden_states.to(dtype));  // [B, N, D]
  if (context_embedder_) {
    a.context = context_embedder_->forward(in.encoder_hidden_states.to(dtype));  // [B, L, D]
  }
  // diffusers: t.to(dtype) * 1000, the float32 sinusoid (flip_sin_to_cos, shift 0) cast back.
  auto embed_scalar = [&](const at::Tensor& t, const Flux2TimestepEmbedding& e) {
    auto scaled = t.to(dtype) * 1000;
    return e.forward(timestep_embedding(scaled, channels, true, 0.0).to(dtype));  // [B|1, D]
  };
  a.temb = embed_scalar(in.timestep, *timestep_embedder_) +
           embed_scalar(in.guidance, *guidance_embedder_);  // [B|1, D]
  // The modulation, once for every block: silu(temb) -> linear, all-gathered under TP.
  const auto act = activate(a.temb, Activation::kSilu);
  a.extra[kModImg] = mod_img_->forward_gathered(act, tp_ops());        // [B|1, 6D]
  a.extra[kModTxt] = mod_txt_->forward_gathered(act, tp_ops());        // [B|1, 6D]
  a.extra[kModSingle] = mod_single_->forward_gathered(act, tp_ops());  // [B|1, 3D]
  a.text_tokens = in.txt_ids.size(-2);

  auto txt_ids = in.txt_ids.dim() == 3 ? in.txt_ids[0] : in.txt_ids;        // [L, 4]
  auto img_ids = in.img_ids.dim() == 3 ? in.img_ids[0] : in.img_ids;        // [N, 4]
  auto ids = at::cat({txt_ids.to(at::kFloat), img_ids.to(at::kFloat)}, 0);  // [L + N, 4]
  a.rope = multi_axis_rope(ids.to(a.temb.device()), config_.axes_dims_rope, config_.rope_theta);
  return a;
}

void Flux2Transformer2DModel::run_double_blocks(dit::DiTActivations& a, int64_t begin,
                                                int64_t end) const {
  const int64_t count = static_cast<int64_t>(blocks_.size());
  XF_CHECK(0 <= begin && begin <= end && end <= count, "run_double_blocks: range [", begin, ", ",
           end, ") is outside the ", count, " double blocks");
  if (begin == end) return;
  XF_CHECK(!a.joined,
           "run_double_blocks: the activations are already joined for the single "
           "blocks");
  XF_CHECK(a.hidden.defined() && a.context.defined(),
           "run_double_blocks: the image and text streams are not set");
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  const auto& mod_img = a.extra.at(kModImg);
  const auto& mod_txt = a.extra.at(kModTxt);
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("transformer_blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(blocks_[i], "transformer_blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    blocks_[i]->forward(a.hidden, a.context, mod_img, mod_txt, a.rope, attend, i, tp_ops());
  }
}

void Flux2Transformer2DModel::run_single_blocks(dit::DiTActivations& a, int64_t begin,
                                                int64_t end) const {
  const int64_t count = static_cast<int64_t>(single_blocks_.size());
  XF_CHECK(0 <= begin && begin <= end && end <= count, "run_single_blocks: range [", begin, ", ",
           end, ") is outside the ", count, " single blocks");
  if (begin == end) return;
  if (!a.joined) {
    a.hidden = at::cat({a.context, a.hidden}, 1);  // [B, L + N, D]
    a.context = at::Tensor();
    a.joined = true;
  }
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  const auto& mod = a.extra.at(kModSingle);
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("single_transformer_blocks.", i);
    profiling::Span span("block", "single_transformer_block");
    span.arg("index", i);
    XF_CHECK(single_blocks_[i], "single_transformer_blocks.", i,
             " is not held by this model part (blocks [", part_.block_begin, ", ", part_.block_end,
             "))");
    a.hidden = single_blocks_[i]->forward(a.hidden, mod, a.rope, attend, config_.num_layers + i,
                                          a.text_tokens, tp_ops());
  }
}

void Flux2Transformer2DModel::run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const {
  const int64_t doubles = config_.num_layers;
  XF_CHECK(0 <= begin && begin <= end && end <= num_blocks(), "run_blocks: range [", begin, ", ",
           end, ") is outside the ", num_blocks(), " blocks (", doubles, " double + ",
           config_.num_single_layers, " single)");
  run_double_blocks(a, std::min(begin, doubles), std::min(end, doubles));
  run_single_blocks(a, std::max(begin, doubles) - doubles, std::max(end, doubles) - doubles);
}

at::Tensor Flux2Transformer2DModel::finalize(const dit::DiTActivations& a) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  auto x = a.joined ? a.hidden.narrow(1, a.text_tokens, a.hidden.size(1) - a.text_tokens)
                    : a.hidden;                              // [B, N, D]
  return proj_out_->forward(norm_out_->forward(x, a.temb));  // [B, N, patch^2 * out]
}

at::Tensor Flux2Transformer2DModel::forward(const Flux2Inputs& in) const {
  check_inputs(in);
  auto a = embed(in);
  run_blocks(a, part_.block_begin, part_.block_end);
  return finalize(a);
}

std::vector<int64_t> Flux2Transformer2DModel::block_parameters() const {
  // A whole model of the same config declares every block (shapes only, nothing allocated).
  const Flux2Transformer2DModel whole(config_);
  return dit::parameters_per_block(whole,
                                   {{"transformer_blocks.", config_.num_layers},
                                    {"single_transformer_blocks.", config_.num_single_layers}});
}

std::vector<int64_t> Flux2Transformer2DModel::other_parameters() const {
  const Flux2Transformer2DModel whole(config_);
  return {dit::parameters_with_prefix(whole, {"x_embedder.", "context_embedder."}),
          dit::parameters_with_prefix(
              whole, {"time_guidance_embed.", "double_stream_modulation_img.",
                      "double_stream_modulation_txt.", "single_stream_modulation."}),
          dit::parameters_with_prefix(whole, {"norm_out.", "proj_out."})};
}

dit::DiTInputs Flux2Transformer2DModel::to_dit(const Flux2Inputs& in) {
  auto first = [](const at::Tensor& ids) {
    return ids.defined() && ids.dim() == 3 ? ids[0] : ids;  // [B', S, axes]: row 0
  };
  dit::DiTInputs out;
  out.tokens = in.hidden_states;
  out.token_ids = first(in.img_ids);
  out.text = in.encoder_hidden_states;
  out.text_ids = first(in.txt_ids);
  out.timestep = in.timestep;
  out.guidance = in.guidance;
  return out;
}

Flux2Inputs Flux2Transformer2DModel::from_dit(const dit::DiTInputs& in) {
  Flux2Inputs out;
  out.hidden_states = in.tokens;
  out.img_ids = in.token_ids;
  out.encoder_hidden_states = in.text;
  out.txt_ids = in.text_ids;
  out.timestep = in.timestep;
  out.guidance = in.guidance;
  return out;
}

std::shared_ptr<dit::DiTTransformer> make_flux2_dit(const nlohmann::json& config,
                                                    const std::string& config_path,
                                                    dit::DiTPart part, TensorParallel tp) {
  return std::make_shared<Flux2Transformer2DModel>(Flux2Config::from_json(config, config_path),
                                                   part, tp);
}

}  // namespace xfuser::models::flux2
