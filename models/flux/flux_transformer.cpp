#include "models/flux/flux_transformer.h"

#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/kernels.h"
#include "models/dit/dit_pipefusion.h"
#include "models/dit/step_cache.h"
#include "profiling/trace.h"

namespace xfuser::models::flux {
namespace {

constexpr double kNormEps = 1e-6;
constexpr double kRopeTheta = 10000.0;
constexpr int64_t kTimestepChannels = 256;
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

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

// ---- attention projections ----------------------------------------------------------------------

// diffusers Attention as FLUX configures it: to_q/k/v with RMSNorm QK norms; the joint variant
// adds add_{q,k,v}_proj, norm_added_{q,k}, to_out.0 and to_add_out; the single variant
// (pre_only) has no output projection. Under tensor parallelism the q/k/v projections are
// column-parallel by whole heads (this rank holds heads [r*H/n, (r+1)*H/n)) and the output
// projections row-parallel.
class FluxAttention : public Module {
 public:
  FluxAttention(int64_t dim, int64_t heads, int64_t head_dim, bool joint, const TensorParallel& tp)
      : heads_(heads / tp.size), head_dim_(head_dim) {
    const int64_t inner = heads * head_dim;
    auto column = [&](int64_t in, int64_t out) {
      return std::make_shared<ColumnParallelLinear>(in, out, tp);
    };
    norm_q_ = child("norm_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
    norm_k_ = child("norm_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
    to_q_ = child("to_q", column(dim, inner));
    to_k_ = child("to_k", column(dim, inner));
    to_v_ = child("to_v", column(dim, inner));
    if (joint) {
      add_k_proj_ = child("add_k_proj", column(dim, inner));
      add_v_proj_ = child("add_v_proj", column(dim, inner));
      add_q_proj_ = child("add_q_proj", column(dim, inner));
      norm_added_q_ = child("norm_added_q", std::make_shared<RMSNorm>(head_dim, kNormEps));
      norm_added_k_ = child("norm_added_k", std::make_shared<RMSNorm>(head_dim, kNormEps));
      to_out_ = child("to_out.0", std::make_shared<RowParallelLinear>(inner, dim, tp));
      to_add_out_ = child("to_add_out", std::make_shared<RowParallelLinear>(inner, dim, tp));
    }
  }

  struct Qkv {
    at::Tensor q, k, v;  // [B, S, H, hd]
  };

  // Image / joint-sequence projections with QK norms.
  Qkv project(const at::Tensor& x) const {  // x [B, S, D]
    return {norm_q_->forward(split_heads(to_q_->forward(x), heads_)),
            norm_k_->forward(split_heads(to_k_->forward(x), heads_)),
            split_heads(to_v_->forward(x), heads_)};
  }
  // Context projections (joint variant).
  Qkv project_context(const at::Tensor& c) const {  // c [B, L, D]
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
  int64_t heads() const { return heads_; }  // this rank's heads
  int64_t inner() const { return heads_ * head_dim_; }

 private:
  int64_t heads_, head_dim_;
  std::shared_ptr<ColumnParallelLinear> to_q_, to_k_, to_v_, add_q_proj_, add_k_proj_, add_v_proj_;
  std::shared_ptr<RowParallelLinear> to_out_, to_add_out_;
  std::shared_ptr<RMSNorm> norm_q_, norm_k_, norm_added_q_, norm_added_k_;
};

using AttendFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const AttentionCall&)>;

// ---- double-stream block ------------------------------------------------------------------------

class FluxTransformerBlock : public Module {
 public:
  FluxTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim, const TensorParallel& tp) {
    norm1_ = child("norm1", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    norm1_context_ =
        child("norm1_context", std::make_shared<ParallelAdaLayerNormZero>(dim, tp, kNormEps));
    attn_ = child("attn", std::make_shared<FluxAttention>(dim, heads, head_dim, true, tp));
    ff_ = child("ff", std::make_shared<ParallelFeedForward>(dim, dim, 4.0,
                                                            FeedForwardKind::kGeluApproximate, tp));
    ff_context_ = child("ff_context", std::make_shared<ParallelFeedForward>(
                                          dim, dim, 4.0, FeedForwardKind::kGeluApproximate, tp));
  }

  // norm1's modulated image input x [B, N, D] (TeaCache's signal).
  at::Tensor modulated_input(const at::Tensor& x, const at::Tensor& temb,
                             const TensorParallelOps& ops) const {
    return norm1_->forward(x, temb, ops).x;
  }

  // x [B, N, D], c [B, L, D], temb [B, D], rope [L + N, hd]; updates x and c.
  void forward(at::Tensor& x, at::Tensor& c, const at::Tensor& temb, const RotaryTables& rope,
               const AttendFn& attend, int64_t layer, const TensorParallelOps& ops) const {
    const int64_t b = x.size(0), n = x.size(1), l = c.size(1), inner = attn_->inner();
    auto nx = norm1_->forward(x, temb, ops);
    auto nc = norm1_context_->forward(c, temb, ops);

    auto img = attn_->project(nx.x);          // [B, N, H, hd] each
    auto txt = attn_->project_context(nc.x);  // [B, L, H, hd] each
    auto [q, k] = apply_rotary_emb_qk(at::cat({txt.q, img.q}, 1), at::cat({txt.k, img.k}, 1),
                                      rope);  // [B, L+N, H, hd] each
    auto v = at::cat({txt.v, img.v}, 1);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = l;
    call.text_first = true;
    // [B, L+N, H_r*hd]: this rank's heads
    auto o = attend(q, k, v, call).reshape({b, l + n, inner}).to(q.scalar_type());
    auto img_out = attn_->out(o.narrow(1, l, n), ops);      // [B, N, D]
    auto txt_out = attn_->add_out(o.narrow(1, 0, l), ops);  // [B, L, D]

    x = gated_residual(x, nx.gate_msa, img_out);
    auto hx = kernels().norm_modulate(x, nx.shift_mlp, nx.scale_mlp, kNormEps);
    x = gated_residual(x, nx.gate_mlp, ff_->forward(hx, ops));

    c = gated_residual(c, nc.gate_msa, txt_out);
    auto hc = kernels().norm_modulate(c, nc.shift_mlp, nc.scale_mlp, kNormEps);
    c = clip_fp16(gated_residual(c, nc.gate_mlp, ff_context_->forward(hc, ops)));
  }

 private:
  std::shared_ptr<ParallelAdaLayerNormZero> norm1_, norm1_context_;
  std::shared_ptr<FluxAttention> attn_;
  std::shared_ptr<ParallelFeedForward> ff_, ff_context_;
};

// ---- single-stream block ------------------------------------------------------------------------

class FluxSingleTransformerBlock : public Module {
 public:
  FluxSingleTransformerBlock(int64_t dim, int64_t heads, int64_t head_dim,
                             const TensorParallel& tp) {
    const int64_t mlp_dim = dim * 4;
    norm_ = child("norm", std::make_shared<ParallelAdaLayerNormZeroSingle>(dim, tp, kNormEps));
    proj_mlp_ = child("proj_mlp", std::make_shared<ColumnParallelLinear>(dim, mlp_dim, tp));
    // Input features [attention D | MLP 4D]: each block split on its own, so this rank's part
    // [attention heads_r | MLP_r] is exactly cat({o, mlp}) below.
    proj_out_ =
        child("proj_out", std::make_shared<RowParallelLinear>(dim + mlp_dim, dim, tp, true,
                                                              std::vector<int64_t>{dim, mlp_dim}));
    attn_ = child("attn", std::make_shared<FluxAttention>(dim, heads, head_dim, false, tp));
  }

  // h [B, L + N, D] joint sequence, text first.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& temb, const RotaryTables& rope,
                     const AttendFn& attend, int64_t layer, int64_t text_tokens,
                     const TensorParallelOps& ops) const {
    const int64_t b = h.size(0), s = h.size(1), inner = attn_->inner();
    auto nh = norm_->forward(h, temb, ops);
    auto mlp = activate(proj_mlp_->forward(nh.x), Activation::kGeluTanh);  // [B, S, 4D/n]
    auto p = attn_->project(nh.x);
    auto [q, k] = apply_rotary_emb_qk(p.q, p.k, rope);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = text_tokens;
    call.text_first = true;
    // [B, S, H_r*hd]: this rank's heads
    auto o = attend(q, k, p.v, call).reshape({b, s, inner}).to(q.scalar_type());
    auto out = gated_residual(h, nh.gate, proj_out_->forward(at::cat({o, mlp}, 2), ops));
    return clip_fp16(out);
  }

 private:
  std::shared_ptr<ParallelAdaLayerNormZeroSingle> norm_;
  std::shared_ptr<ColumnParallelLinear> proj_mlp_;
  std::shared_ptr<RowParallelLinear> proj_out_;
  std::shared_ptr<FluxAttention> attn_;
};

// ---- the model ----------------------------------------------------------------------------------

FluxTransformer2DModel::FluxTransformer2DModel(FluxConfig config, FluxModelPart part,
                                               TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  config_.validate("FluxTransformer2DModel config");
  const int64_t total = config_.num_layers + config_.num_single_layers;
  if (part_.block_end < 0) part_.block_end = total;
  XF_CHECK(
      0 <= part_.block_begin && part_.block_begin <= part_.block_end && part_.block_end <= total,
      "FluxTransformer2DModel: block range [", part_.block_begin, ", ", part_.block_end,
      ") is outside the ", total, " blocks (", config_.num_layers, " double + ",
      config_.num_single_layers, " single)");
  auto held = [&](int64_t block) { return part_.block_begin <= block && block < part_.block_end; };
  const int64_t dim = config_.inner_dim();
  const int64_t heads = config_.num_attention_heads, hd = config_.attention_head_dim;
  XF_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "tensor-parallel rank ", tp.rank,
           " of ", tp.size, " is out of range");
  XF_CHECK(heads % tp.size == 0, "FluxTransformer2DModel: num_attention_heads ", heads,
           " is not divisible by the tensor parallel degree ", tp.size,
           " (--tensor_parallel_degree): every rank must hold whole attention heads");
  // Declaration order follows diffusers' __init__.
  timestep_embedder_ = child("time_text_embed.timestep_embedder",
                             std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
  if (config_.guidance_embeds) {
    guidance_embedder_ = child("time_text_embed.guidance_embedder",
                               std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
  }
  text_embedder_ = child("time_text_embed.text_embedder",
                         std::make_shared<PixArtAlphaTextProjection>(config_.pooled_projection_dim,
                                                                     dim, Activation::kSilu));
  if (part_.embedders) {
    context_embedder_ =
        child("context_embedder", std::make_shared<Linear>(config_.joint_attention_dim, dim));
    x_embedder_ = child("x_embedder", std::make_shared<Linear>(config_.in_channels, dim));
  }
  // Blocks outside the part stay null (their slots keep the global indices).
  blocks_.resize(config_.num_layers);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    if (!held(i)) continue;
    blocks_[i] = child("transformer_blocks." + std::to_string(i),
                       std::make_shared<FluxTransformerBlock>(dim, heads, hd, tp));
  }
  single_blocks_.resize(config_.num_single_layers);
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    if (!held(config_.num_layers + i)) continue;
    single_blocks_[i] = child("single_transformer_blocks." + std::to_string(i),
                              std::make_shared<FluxSingleTransformerBlock>(dim, heads, hd, tp));
  }
  if (part_.head) {
    norm_out_ =
        child("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, kNormEps));
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, config_.output_dim()));
  }
}

FluxTransformer2DModel::~FluxTransformer2DModel() = default;

c10::ScalarType FluxTransformer2DModel::dtype() const {
  // time_text_embed is held by every part; its first parameter has the compute dtype.
  const auto* w = timestep_embedder_->named_parameters().front().second;
  XF_CHECK(w->loaded(), "FluxTransformer2DModel used before its weights were loaded");
  return w->compute_dtype();
}

const std::vector<std::string>& FluxTransformer2DModel::input_names() {
  static const std::vector<std::string> kNames = {"hidden_states",
                                                  "encoder_hidden_states",
                                                  "pooled_projections",
                                                  "timestep",
                                                  "img_ids",
                                                  "txt_ids",
                                                  "guidance"};
  return kNames;
}

FluxInputs FluxTransformer2DModel::parse_inputs(const TensorMap& inputs) const {
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "FluxTransformer2DModel.forward: unknown input(s) ", join(unknown),
           "; accepted inputs: ", join(names));
  auto get = [&](const std::string& name) {
    auto it = inputs.find(name);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  FluxInputs in;
  in.hidden_states = get("hidden_states");
  in.encoder_hidden_states = get("encoder_hidden_states");
  in.pooled_projections = get("pooled_projections");
  in.timestep = get("timestep");
  in.img_ids = get("img_ids");
  in.txt_ids = get("txt_ids");
  in.guidance = get("guidance");
  check_inputs(in);
  return in;
}

void FluxTransformer2DModel::check_inputs(const FluxInputs& in) const {
  XF_CONTEXT("FluxTransformer2DModel.forward inputs");
  const auto& c = config_;
  const int64_t axes = static_cast<int64_t>(c.axes_dims_rope.size());
  auto require = [](const at::Tensor& t, const char* name, const std::string& shape) {
    XF_CHECK(t.defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  const std::string hs_shape = "[B, N, " + std::to_string(c.in_channels) + "]";
  const std::string enc_shape = "[B, L, " + std::to_string(c.joint_attention_dim) + "]";
  const std::string pooled_shape = "[B, " + std::to_string(c.pooled_projection_dim) + "]";
  const std::string img_shape = "[N, " + std::to_string(axes) + "]";
  const std::string txt_shape = "[L, " + std::to_string(axes) + "]";
  require(in.hidden_states, "hidden_states", hs_shape);
  require(in.encoder_hidden_states, "encoder_hidden_states", enc_shape);
  require(in.pooled_projections, "pooled_projections", pooled_shape);
  require(in.timestep, "timestep", "[B]");
  require(in.img_ids, "img_ids", img_shape);
  require(in.txt_ids, "txt_ids", txt_shape);
  if (c.guidance_embeds) require(in.guidance, "guidance", "[B] (the model has guidance_embeds)");

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
  const auto& pooled = in.pooled_projections;
  XF_CHECK(pooled.dim() == 2 && pooled.size(0) == b && pooled.size(1) == c.pooled_projection_dim,
           "pooled_projections must be [", b, ", ", c.pooled_projection_dim, "], got ",
           shape_string(pooled.sizes()));
  XF_CHECK(in.timestep.dim() == 1 && (in.timestep.size(0) == b || in.timestep.size(0) == 1),
           "timestep must be [", b, "] (or [1]), got ", shape_string(in.timestep.sizes()));
  if (c.guidance_embeds) {
    XF_CHECK(in.guidance.dim() == 1 && (in.guidance.size(0) == b || in.guidance.size(0) == 1),
             "guidance must be [", b, "] (or [1]), got ", shape_string(in.guidance.sizes()));
  }
  auto check_ids = [&](const at::Tensor& ids, const char* name, int64_t tokens, const char* what) {
    const bool ok = (ids.dim() == 2 || (ids.dim() == 3 && ids.size(0) >= 1)) &&
                    ids.size(-2) == tokens && ids.size(-1) == axes;
    XF_CHECK(ok, name, " must be [", tokens, ", ", axes, "] (", what, " x rope axes), got ",
             shape_string(ids.sizes()));
    XF_CHECK(at::isFloatingType(ids.scalar_type()) || at::isIntegralType(ids.scalar_type(), false),
             name, " must be a real tensor, got ", ids.scalar_type());
  };
  check_ids(in.img_ids, "img_ids", n, "image tokens of hidden_states");
  check_ids(in.txt_ids, "txt_ids", l, "text tokens of encoder_hidden_states");
  for (const auto* t : {&hs, &enc, &pooled}) {
    XF_CHECK(at::isFloatingType(t->scalar_type()),
             "hidden_states, encoder_hidden_states and pooled_projections must be floating point, "
             "got ",
             t->scalar_type());
  }
}

FluxState FluxTransformer2DModel::embed(const FluxInputs& in) const {
  XF_CONTEXT("FluxTransformer2DModel.embed");
  const auto dtype = this->dtype();
  FluxState st;
  if (x_embedder_) st.hidden = x_embedder_->forward(in.hidden_states.to(dtype));  // [B, N, D]
  // diffusers: timestep.to(x.dtype) * 1000, then the float32 sinusoid, cast to the model dtype.
  auto t = in.timestep.to(dtype) * 1000;
  auto temb = timestep_embedder_->forward(
      timestep_embedding(t, kTimestepChannels, true, 0.0).to(dtype));  // [B|1, D]
  if (guidance_embedder_) {
    auto g = in.guidance.to(dtype) * 1000;
    temb = temb + guidance_embedder_->forward(
                      timestep_embedding(g, kTimestepChannels, true, 0.0).to(dtype));
  }
  st.temb = temb + text_embedder_->forward(in.pooled_projections.to(dtype));  // [B, D]
  if (context_embedder_) {
    st.context = context_embedder_->forward(in.encoder_hidden_states.to(dtype));  // [B, L, D]
  }
  st.text_tokens = in.txt_ids.size(-2);

  auto txt_ids = in.txt_ids.dim() == 3 ? in.txt_ids[0] : in.txt_ids;  // deprecated 3-D ids
  auto img_ids = in.img_ids.dim() == 3 ? in.img_ids[0] : in.img_ids;
  auto ids = at::cat({txt_ids.to(at::kFloat), img_ids.to(at::kFloat)}, 0);  // [L + N, axes]
  st.rope = multi_axis_rope(ids.to(st.temb.device()), config_.axes_dims_rope, kRopeTheta);
  return st;
}

void FluxTransformer2DModel::run_double_blocks(FluxState& st, int64_t begin, int64_t end) const {
  const int64_t count = static_cast<int64_t>(blocks_.size());
  XF_CHECK(0 <= begin && begin <= end && end <= count, "run_double_blocks: range [", begin, ", ",
           end, ") is outside the ", count, " double blocks");
  if (begin == end) return;
  XF_CHECK(!st.joined, "run_double_blocks: the state is already joined for the single blocks");
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("transformer_blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(blocks_[i], "transformer_blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    blocks_[i]->forward(st.hidden, st.context, st.temb, st.rope, attend, i, tp_ops());
  }
}

void FluxTransformer2DModel::run_single_blocks(FluxState& st, int64_t begin, int64_t end) const {
  const int64_t count = static_cast<int64_t>(single_blocks_.size());
  XF_CHECK(0 <= begin && begin <= end && end <= count, "run_single_blocks: range [", begin, ", ",
           end, ") is outside the ", count, " single blocks");
  if (begin == end) return;
  if (!st.joined) {
    st.hidden = at::cat({st.context, st.hidden}, 1);  // [B, L + N, D]
    st.context = at::Tensor();
    st.joined = true;
  }
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("single_transformer_blocks.", i);
    profiling::Span span("block", "single_transformer_block");
    span.arg("index", i);
    XF_CHECK(single_blocks_[i], "single_transformer_blocks.", i,
             " is not held by this model part (blocks [", part_.block_begin, ", ", part_.block_end,
             "))");
    st.hidden = single_blocks_[i]->forward(st.hidden, st.temb, st.rope, attend,
                                           config_.num_layers + i, st.text_tokens, tp_ops());
  }
}

at::Tensor FluxTransformer2DModel::finalize(const FluxState& st) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  auto x = st.joined ? st.hidden.narrow(1, st.text_tokens, st.hidden.size(1) - st.text_tokens)
                     : st.hidden;                             // [B, N, D]
  return proj_out_->forward(norm_out_->forward(x, st.temb));  // [B, N, patch^2 * out]
}

at::Tensor FluxTransformer2DModel::forward(const FluxInputs& in) const {
  check_inputs(in);
  auto st = embed(in);
  run_double_blocks(st, 0, static_cast<int64_t>(blocks_.size()));
  run_single_blocks(st, 0, static_cast<int64_t>(single_blocks_.size()));
  return finalize(st);
}

void FluxTransformer2DModel::run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const {
  const int64_t doubles = config_.num_layers;
  XF_CHECK(0 <= begin && begin <= end && end <= num_blocks(), "run_blocks: range [", begin, ", ",
           end, ") is outside the ", num_blocks(), " blocks (", doubles, " double + ",
           config_.num_single_layers, " single)");
  run_double_blocks(a, std::min(begin, doubles), std::min(end, doubles));
  run_single_blocks(a, std::max(begin, doubles) - doubles, std::max(end, doubles) - doubles);
}

std::vector<int64_t> FluxTransformer2DModel::block_parameters() const {
  // A whole model of the same config declares every block (shapes only, nothing allocated).
  const FluxTransformer2DModel whole(config_);
  return dit::parameters_per_block(whole,
                                   {{"transformer_blocks.", config_.num_layers},
                                    {"single_transformer_blocks.", config_.num_single_layers}});
}

std::vector<int64_t> FluxTransformer2DModel::other_parameters() const {
  const FluxTransformer2DModel whole(config_);
  return {dit::parameters_with_prefix(whole, {"x_embedder.", "context_embedder."}),
          dit::parameters_with_prefix(whole, {"time_text_embed."}),
          dit::parameters_with_prefix(whole, {"norm_out.", "proj_out."})};
}

dit::DiTInputs FluxTransformer2DModel::to_dit(const FluxInputs& in) {
  auto first = [](const at::Tensor& ids) {
    return ids.defined() && ids.dim() == 3 ? ids[0] : ids;  // deprecated [B', S, axes]
  };
  dit::DiTInputs out;
  out.tokens = in.hidden_states;
  out.token_ids = first(in.img_ids);
  out.text = in.encoder_hidden_states;
  out.text_ids = first(in.txt_ids);
  out.pooled = in.pooled_projections;
  out.timestep = in.timestep;
  out.guidance = in.guidance;
  return out;
}

FluxInputs FluxTransformer2DModel::from_dit(const dit::DiTInputs& in) {
  FluxInputs out;
  out.hidden_states = in.tokens;
  out.img_ids = in.token_ids;
  out.encoder_hidden_states = in.text;
  out.txt_ids = in.text_ids;
  out.pooled_projections = in.pooled;
  out.timestep = in.timestep;
  out.guidance = in.guidance;
  return out;
}

std::shared_ptr<Component> make_flux_transformer(const nlohmann::json& config,
                                                 const std::string& config_path) {
  return std::make_shared<FluxTransformer2DModel>(FluxConfig::from_json(config, config_path));
}

std::shared_ptr<dit::DiTTransformer> make_flux_dit(const nlohmann::json& config,
                                                   const std::string& config_path,
                                                   dit::DiTPart part, TensorParallel tp) {
  return std::make_shared<FluxTransformer2DModel>(FluxConfig::from_json(config, config_path), part,
                                                  tp);
}

std::vector<double> FluxTransformer2DModel::published_mag_ratios() const {
  return dit::flux_mag_ratios();
}

at::Tensor FluxTransformer2DModel::teacache_input(const dit::DiTActivations& a) const {
  XF_CHECK(!blocks_.empty() && blocks_[0] && !a.joined, class_name(),
           ": TeaCache reads the first double block's norm1, which this model (part) lacks");
  return blocks_[0]->modulated_input(a.hidden, a.temb, tp_ops());
}

}  // namespace xfuser::models::flux
