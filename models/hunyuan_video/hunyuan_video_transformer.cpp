#include "models/hunyuan_video/hunyuan_video_transformer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/kernels.h"
#include "models/dit/dit_pipefusion.h"
#include "models/hunyuan_video/hunyuan_video_blocks.h"
#include "profiling/trace.h"

namespace xfuser::models::hunyuan_video {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// DiTInputs.extra["text_tokens"] ([1] or [B] int64, set by parse_forward_inputs): the whole
// text's length. The sequence-parallel drivers split the text over the ranks when its length
// divides by the degree; the token refiner (a masked mean and a self-attention over the text)
// cannot embed a slice, so a split text is an error instead of a silently different result.
void check_whole_text(const dit::DiTInputs& in) {
  auto it = in.extra.find("text_tokens");
  if (it == in.extra.end() || !in.text.defined()) return;
  const auto& t = it->second;
  XF_CHECK(t.dim() == 1 && t.numel() >= 1 && !at::isFloatingType(t.scalar_type()),
           "extra input 'text_tokens' must be an integer [1] or [B] tensor (the whole text's "
           "length), got ",
           shape_string(t.sizes()), " ", t.scalar_type());
  const int64_t whole = t.max().item<int64_t>(), l = in.text.size(1);
  XF_CHECK(t.min().item<int64_t>() == whole && l == whole, "encoder_hidden_states holds ", l,
           " of the prompt's ", whole,
           " text tokens: the text was split over sequence-parallel ranks, but HunyuanVideo's "
           "token refiner (a masked mean and a self-attention over the text) needs the whole "
           "text on every rank (the drivers keep it whole: text_whole())");
}

}  // namespace

at::Tensor text_tokens_tensor(const at::Tensor& text) {
  // Host memory on purpose: metadata the checks read, never an operand of device work.
  return at::full({1}, text.size(1), at::TensorOptions().dtype(at::kLong));
}

// ---- single-stream block ------------------------------------------------------------------------

// HunyuanVideoSingleTransformerBlock on the joined [image, text] sequence: norm
// (AdaLayerNormZeroSingle), proj_mlp + tanh GELU, attention (RoPE on the image rows), proj_out
// over [attention | MLP], gated residual.
class HunyuanVideoSingleTransformerBlock : public Module {
 public:
  HunyuanVideoSingleTransformerBlock(const HunyuanVideoConfig& c, const TensorParallel& tp) {
    const int64_t dim = c.inner_dim(), mlp_dim = c.mlp_dim();
    attn_ = child("attn", std::make_shared<HunyuanVideoAttention>(dim, c.num_attention_heads,
                                                                  c.attention_head_dim, false, tp));
    norm_ = child("norm", std::make_shared<ParallelAdaLayerNormZeroSingle>(dim, tp, kNormEps));
    proj_mlp_ = child("proj_mlp", std::make_shared<ColumnParallelLinear>(dim, mlp_dim, tp));
    // Input features [attention D | MLP]: each split on its own, so this rank's part is
    // [attention heads_r | MLP_r], exactly cat({o, mlp}) below.
    proj_out_ =
        child("proj_out", std::make_shared<RowParallelLinear>(dim + mlp_dim, dim, tp, true,
                                                              std::vector<int64_t>{dim, mlp_dim}));
  }

  // h [B, n + L, D] (image first), rope [n, hd], mask [B, n + L] and text_keys [B, L] (its text
  // part) or both undefined.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& temb, const RotaryTables& rope,
                     const at::Tensor& mask, const at::Tensor& text_keys, const AttendFn& attend,
                     int64_t layer, int64_t text_tokens, const TensorParallelOps& ops) const {
    const int64_t b = h.size(0), s = h.size(1), inner = attn_->inner();
    auto nh = norm_->forward(h, temb, ops);
    auto mlp = activate(proj_mlp_->forward(nh.x), Activation::kGeluTanh);
    auto p = attn_->project(nh.x);
    auto [q, k] = rotate_image_rows(p.q, p.k, s - text_tokens, rope);
    AttentionCall call;
    call.layer = layer;
    call.text_tokens = text_tokens;
    call.text_first = false;
    call.mask = mask;
    call.text_key_mask = text_keys;
    auto o = attend(q, k, p.v, call).reshape({b, s, inner}).to(h.scalar_type());
    return gated_residual(h, nh.gate, proj_out_->forward(at::cat({o, mlp}, 2), ops));
  }

 private:
  std::shared_ptr<HunyuanVideoAttention> attn_;
  std::shared_ptr<ParallelAdaLayerNormZeroSingle> norm_;
  std::shared_ptr<ColumnParallelLinear> proj_mlp_;
  std::shared_ptr<RowParallelLinear> proj_out_;
};

// ---- HunyuanVideoTransformer3DModel -------------------------------------------------------------

HunyuanVideoTransformer3DModel::HunyuanVideoTransformer3DModel(HunyuanVideoConfig config,
                                                               dit::DiTPart part, TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  const auto& c = config_;
  c.validate("HunyuanVideoTransformer3DModel config");
  resolve_part();
  const int64_t dim = c.inner_dim();
  auto held = [&](int64_t block) { return part_.block_begin <= block && block < part_.block_end; };
  // Declaration order follows diffusers' __init__ (rope has no parameters).
  if (part_.embedders) {
    x_embedder_ = child("x_embedder",
                        std::make_shared<HunyuanVideoPatchEmbed>(c.in_channels, c.patch(), dim));
    context_embedder_ = child("context_embedder", std::make_shared<HunyuanVideoTokenRefiner>(
                                                      c.text_embed_dim, c.num_attention_heads,
                                                      c.attention_head_dim, c.num_refiner_layers));
  }
  time_text_embed_ = child("time_text_embed", std::make_shared<HunyuanVideoConditionEmbedding>(
                                                  dim, c.pooled_projection_dim, c.guidance_embeds));
  blocks_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (!held(i)) continue;
    blocks_[i] = child("transformer_blocks." + std::to_string(i),
                       std::make_shared<HunyuanVideoTransformerBlock>(c, tp_));
  }
  single_blocks_.resize(c.num_single_layers);
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    if (!held(c.num_layers + i)) continue;
    single_blocks_[i] = child("single_transformer_blocks." + std::to_string(i),
                              std::make_shared<HunyuanVideoSingleTransformerBlock>(c, tp_));
  }
  if (part_.head) {
    norm_out_ =
        child("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, kNormEps));
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, c.output_dim()));
  }
}

HunyuanVideoTransformer3DModel::~HunyuanVideoTransformer3DModel() = default;

c10::ScalarType HunyuanVideoTransformer3DModel::dtype() const { return time_text_embed_->dtype(); }

std::vector<int64_t> HunyuanVideoTransformer3DModel::block_parameters() const {
  // A whole model of the same config declares every block (shapes only, nothing allocated).
  const HunyuanVideoTransformer3DModel whole(config_);
  return dit::parameters_per_block(whole,
                                   {{"transformer_blocks.", config_.num_layers},
                                    {"single_transformer_blocks.", config_.num_single_layers}});
}

std::vector<int64_t> HunyuanVideoTransformer3DModel::other_parameters() const {
  const HunyuanVideoTransformer3DModel whole(config_);
  return {dit::parameters_with_prefix(whole, {"x_embedder.", "context_embedder."}),
          dit::parameters_with_prefix(whole, {"time_text_embed."}),
          dit::parameters_with_prefix(whole, {"norm_out.", "proj_out."})};
}

const std::vector<std::string>& HunyuanVideoTransformer3DModel::input_names() {
  static const std::vector<std::string> kNames = {"hidden_states",         "timestep",
                                                  "encoder_hidden_states", "encoder_attention_mask",
                                                  "pooled_projections",    "guidance"};
  return kNames;
}

at::Tensor HunyuanVideoTransformer3DModel::patchify(const at::Tensor& latents, int64_t patch_t,
                                                    int64_t patch) {
  XF_CHECK(latents.dim() == 5, "HunyuanVideo patchify: latents must be [B, C, F, H, W], got ",
           shape_string(latents.sizes()));
  XF_CHECK(patch_t >= 1 && patch >= 1, "HunyuanVideo patchify: patch sizes (", patch_t, ", ", patch,
           ") must be >= 1");
  XF_CHECK(latents.size(2) % patch_t == 0 && latents.size(3) % patch == 0 &&
               latents.size(4) % patch == 0,
           "HunyuanVideo patchify: frames, height and width of ", shape_string(latents.sizes()),
           " must be multiples of the patch size (", patch_t, ", ", patch, ", ", patch, ")");
  const int64_t b = latents.size(0), ch = latents.size(1);
  const int64_t f = latents.size(2) / patch_t, h = latents.size(3) / patch,
                w = latents.size(4) / patch;
  return latents.reshape({b, ch, f, patch_t, h, patch, w, patch})
      .permute({0, 2, 4, 6, 1, 3, 5, 7})  // [B, F', H', W', C, pt, p, p]
      .reshape({b, f * h * w, ch * patch_t * patch * patch});
}

at::Tensor HunyuanVideoTransformer3DModel::unpatchify(const at::Tensor& tokens, int64_t frames,
                                                      int64_t height, int64_t width,
                                                      int64_t patch_t, int64_t patch,
                                                      int64_t channels) {
  const int64_t vol = patch_t * patch * patch;
  XF_CHECK(tokens.dim() == 3 && tokens.size(1) == frames * height * width &&
               tokens.size(2) == vol * channels,
           "HunyuanVideo unpatchify: tokens must be [B, ", frames * height * width, ", ",
           vol * channels, "] for a ", frames, " x ", height, " x ", width, " grid of (", patch_t,
           ", ", patch, ", ", patch, ") patches of ", channels, " channels, got ",
           shape_string(tokens.sizes()));
  const int64_t b = tokens.size(0);
  return tokens.reshape({b, frames, height, width, channels, patch_t, patch, patch})
      .permute({0, 4, 1, 5, 2, 6, 3, 7})
      .reshape({b, channels, frames * patch_t, height * patch, width * patch});
}

at::Tensor HunyuanVideoTransformer3DModel::token_ids(int64_t frames, int64_t height, int64_t width,
                                                     const at::TensorOptions& options) {
  XF_CHECK(frames >= 1 && height >= 1 && width >= 1, "HunyuanVideo token_ids: empty grid ", frames,
           " x ", height, " x ", width);
  auto opts = options.dtype(at::kFloat);
  const std::vector<int64_t> shape = {frames, height, width};
  auto f = at::arange(frames, opts).view({frames, 1, 1}).expand(shape);
  auto h = at::arange(height, opts).view({1, height, 1}).expand(shape);
  auto w = at::arange(width, opts).view({1, 1, width}).expand(shape);
  return at::stack({f.reshape({-1}), h.reshape({-1}), w.reshape({-1})}, 1);  // [N, 3]
}

RotaryTables HunyuanVideoTransformer3DModel::rope(const at::Tensor& ids,
                                                  const std::vector<int64_t>& axes_dim,
                                                  double theta) {
  XF_CHECK(ids.dim() == 2 && ids.size(1) == static_cast<int64_t>(axes_dim.size()),
           "HunyuanVideo rope: ids must be [N, ", axes_dim.size(), "], got ",
           shape_string(ids.sizes()));
  const auto opts = ids.options().dtype(at::kFloat);
  const auto pos_all = ids.to(at::kFloat);
  std::vector<at::Tensor> cos, sin;
  for (size_t i = 0; i < axes_dim.size(); ++i) {
    const int64_t d = axes_dim[i];
    // get_1d_rotary_pos_embed(freqs_dtype=float32): 1 / theta^(arange(0, d, 2) / d), the outer
    // product with the positions, cos and sin repeat_interleave(2), all in float32.
    auto exponents = at::arange(0, d, 2, opts).narrow(0, 0, d / 2) / static_cast<double>(d);
    auto freqs = at::reciprocal(at::pow(theta, exponents));  // [d/2]
    auto angles = at::outer(pos_all.select(1, static_cast<int64_t>(i)).contiguous(), freqs);
    cos.push_back(angles.cos().repeat_interleave(2, 1));
    sin.push_back(angles.sin().repeat_interleave(2, 1));
  }
  return {at::cat(cos, 1), at::cat(sin, 1)};  // [N, sum(axes_dim)]
}

dit::DiTInputs HunyuanVideoTransformer3DModel::parse_forward_inputs(const TensorMap& inputs) const {
  XF_CONTEXT("HunyuanVideoTransformer3DModel.forward inputs");
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "HunyuanVideoTransformer3DModel.forward: unknown input(s) ",
           join(unknown), "; accepted inputs: ", join(names));
  auto get = [&](const std::string& name) {
    auto it = inputs.find(name);
    return it == inputs.end() ? at::Tensor() : it->second;
  };
  const auto& c = config_;
  auto hs = get("hidden_states");
  const std::string hs_shape = "[B, " + std::to_string(c.in_channels) + ", F, H, W]";
  XF_CHECK(hs.defined(), "missing required input 'hidden_states' (expected ", hs_shape, ")");
  XF_CHECK(hs.dim() == 5 && hs.size(1) == c.in_channels && hs.size(0) >= 1,
           "hidden_states must be ", hs_shape, ", got ", shape_string(hs.sizes()));
  XF_CHECK(at::isFloatingType(hs.scalar_type()), "hidden_states must be floating point, got ",
           hs.scalar_type());
  const int64_t pt = c.patch_size_t, p = c.patch_size;
  XF_CHECK(hs.size(2) >= pt && hs.size(3) >= p && hs.size(4) >= p && hs.size(2) % pt == 0 &&
               hs.size(3) % p == 0 && hs.size(4) % p == 0,
           "hidden_states frames, height and width (", hs.size(2), " x ", hs.size(3), " x ",
           hs.size(4), ") must be positive multiples of (patch_size_t, patch_size, patch_size) (",
           pt, ", ", p, ", ", p, ")");
  dit::DiTInputs in;
  in.tokens = patchify(hs, pt, p);
  in.token_ids = token_ids(hs.size(2) / pt, hs.size(3) / p, hs.size(4) / p, hs.options());
  in.text = get("encoder_hidden_states");
  in.timestep = get("timestep");
  in.pooled = get("pooled_projections");
  in.guidance = get("guidance");
  auto mask = get("encoder_attention_mask");
  XF_CHECK(mask.defined(),
           "missing required input 'encoder_attention_mask' (expected [B, L]: 1 "
           "for the text tokens, 0 for the padding)");
  XF_CHECK(at::isFloatingType(mask.scalar_type()) || at::isIntegralType(mask.scalar_type(), true),
           "encoder_attention_mask must be a real or bool tensor, got ", mask.scalar_type());
  if (mask.numel() > 0 && mask.scalar_type() != at::kBool) {
    const bool binary = at::logical_or(mask == 0, mask == 1).all().item<bool>();
    XF_CHECK(binary,
             "encoder_attention_mask must hold only 0 and 1 (diffusers counts its ones), "
             "got other values");
  }
  in.text_mask = mask.to(at::kBool);
  if (in.text.defined() && in.text.dim() == 3)
    in.extra["text_tokens"] = text_tokens_tensor(in.text);
  check_inputs(in);
  // A mask of all ones attends what no mask attends (the pipeline drops it the same way), and
  // embed() then needs no key mask.
  if (in.text_mask.numel() > 0 && in.text_mask.all().item<bool>()) in.text_mask = at::Tensor();
  return in;
}

void HunyuanVideoTransformer3DModel::check_inputs(const dit::DiTInputs& in) const {
  XF_CONTEXT("HunyuanVideoTransformer3DModel.forward inputs");
  const auto& c = config_;
  const std::string tok_shape = "[B, N, " + std::to_string(c.token_channels()) + "]";
  const std::string enc_shape = "[B, L, " + std::to_string(c.text_embed_dim) + "]";
  const std::string pooled_shape = "[B, " + std::to_string(c.pooled_projection_dim) + "]";
  auto require = [](const at::Tensor& t, const char* name, const std::string& shape) {
    XF_CHECK(t.defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  require(in.tokens, "hidden_states", tok_shape + " patchified tokens");
  require(in.token_ids, "token_ids", "[N, 3]");
  require(in.text, "encoder_hidden_states", enc_shape);
  require(in.pooled, "pooled_projections", pooled_shape);
  require(in.timestep, "timestep", "[B]");
  if (c.guidance_embeds) require(in.guidance, "guidance", "[B] (the model has guidance_embeds)");

  const auto& tok = in.tokens;
  XF_CHECK(
      tok.dim() == 3 && tok.size(2) == c.token_channels() && tok.size(0) >= 1 && tok.size(1) >= 1,
      "hidden_states tokens must be ", tok_shape, " ((", c.patch_size_t, ", ", c.patch_size, ", ",
      c.patch_size, ") patches of ", c.in_channels, " channels), got ", shape_string(tok.sizes()));
  const int64_t b = tok.size(0), n = tok.size(1);
  const auto& ids = in.token_ids;
  XF_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.size(1) == 3, "token_ids must be [", n,
           ", 3] ((f, h, w) of each token), got ", shape_string(ids.sizes()));
  XF_CHECK(at::isFloatingType(ids.scalar_type()) || at::isIntegralType(ids.scalar_type(), false),
           "token_ids must be a real tensor, got ", ids.scalar_type());
  const auto& enc = in.text;
  XF_CHECK(
      enc.dim() == 3 && enc.size(0) == b && enc.size(2) == c.text_embed_dim && enc.size(1) >= 1,
      "encoder_hidden_states must be [", b, ", L, ", c.text_embed_dim, "], got ",
      shape_string(enc.sizes()));
  const int64_t l = enc.size(1);
  if (in.text_mask.defined()) {
    XF_CHECK(in.text_mask.dim() == 2 && in.text_mask.size(0) == b && in.text_mask.size(1) == l,
             "encoder_attention_mask must be [", b, ", ", l,
             "] (batch x text tokens of encoder_hidden_states), got ",
             shape_string(in.text_mask.sizes()));
    XF_CHECK(in.text_mask.scalar_type() == at::kBool,
             "the token-level text_mask must be bool (true: a text token), got ",
             in.text_mask.scalar_type());
  }
  const auto& pooled = in.pooled;
  XF_CHECK(pooled.dim() == 2 && pooled.size(0) == b && pooled.size(1) == c.pooled_projection_dim,
           "pooled_projections must be [", b, ", ", c.pooled_projection_dim, "], got ",
           shape_string(pooled.sizes()));
  XF_CHECK(in.timestep.dim() == 1 && (in.timestep.size(0) == b || in.timestep.size(0) == 1),
           "timestep must be [", b, "] (or [1]), got ", shape_string(in.timestep.sizes()));
  XF_CHECK(at::isFloatingType(in.timestep.scalar_type()) ||
               at::isIntegralType(in.timestep.scalar_type(), false),
           "timestep must be an integer or floating tensor, got ", in.timestep.scalar_type());
  if (c.guidance_embeds) {
    XF_CHECK(in.guidance.dim() == 1 && (in.guidance.size(0) == b || in.guidance.size(0) == 1),
             "guidance must be [", b, "] (or [1]), got ", shape_string(in.guidance.sizes()));
  }
  for (const auto* t : {&tok, &enc, &pooled}) {
    XF_CHECK(at::isFloatingType(t->scalar_type()),
             "hidden_states, encoder_hidden_states and pooled_projections must be floating point, "
             "got ",
             t->scalar_type());
  }
  for (const auto& [name, t] : in.extra) {
    XF_CHECK(name == "text_tokens", "HunyuanVideoTransformer3DModel: unknown extra input '", name,
             "' (accepted: text_tokens)");
  }
  check_whole_text(in);
}

dit::DiTActivations HunyuanVideoTransformer3DModel::embed(const dit::DiTInputs& in) const {
  XF_CONTEXT("HunyuanVideoTransformer3DModel.embed");
  const auto dtype = this->dtype();
  dit::DiTActivations a;
  a.temb = time_text_embed_->forward(in.timestep, in.pooled.to(dtype),
                                     config_.guidance_embeds ? in.guidance : at::Tensor());
  if (x_embedder_) a.hidden = x_embedder_->forward(in.tokens.to(dtype));  // [B, n, D]
  check_whole_text(in);
  if (context_embedder_) {
    a.context = context_embedder_->forward(in.text.to(dtype), in.timestep, in.text_mask);
  }
  a.text_tokens = in.text.size(1);
  if (in.text_mask.defined()) {
    // diffusers attends the first N + sum(mask[b]) keys of [image, text].
    const int64_t l = in.text.size(1);
    auto counts = in.text_mask.sum(1, /*keepdim=*/true);  // [B, 1] int64
    a.extra["text_key_mask"] = at::arange(l, counts.options()).unsqueeze(0) < counts;  // [B, L]
  }
  a.rope = rope(in.token_ids, config_.rope_axes_dim, config_.rope_theta);
  return a;
}

void HunyuanVideoTransformer3DModel::run_blocks(dit::DiTActivations& a, int64_t begin,
                                                int64_t end) const {
  const int64_t doubles = config_.num_layers;
  XF_CHECK(0 <= begin && begin <= end && end <= num_blocks(), "run_blocks: range [", begin, ", ",
           end, ") is outside the ", num_blocks(), " blocks (", doubles, " double + ",
           config_.num_single_layers, " single)");
  if (begin == end) return;
  XF_CHECK(a.hidden.defined(), "run_blocks: the image stream is undefined (a part without the ",
           "embedders needs the previous stage's activations)");
  XF_CHECK(a.joined || a.context.defined(), "run_blocks: the activations lack the text stream");
  XF_CHECK(a.rope.cos.defined(),
           "run_blocks: the activations lack the rotary tables (they come "
           "from embed())");
  const int64_t l = a.text_tokens;
  const int64_t n = a.joined ? a.hidden.size(1) - l : a.hidden.size(1);
  XF_CHECK(a.rope.cos.size(0) == n, "run_blocks: ", a.rope.cos.size(0), " rotary rows for ", n,
           " image tokens");
  at::Tensor text_keys;
  if (auto it = a.extra.find("text_key_mask"); it != a.extra.end()) text_keys = it->second;
  const at::Tensor mask = joint_key_mask(text_keys, n);
  AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) { return this->attend(q, k, v, call); };
  for (int64_t i = begin; i < std::min(end, doubles); ++i) {
    XF_CONTEXT("transformer_blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(!a.joined, "run_blocks: the activations are already joined for the single blocks");
    XF_CHECK(blocks_[i], "transformer_blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    blocks_[i]->forward(a.hidden, a.context, a.temb, a.rope, mask, text_keys, attend, i, tp_ops());
  }
  for (int64_t i = std::max(begin, doubles); i < end; ++i) {
    const int64_t j = i - doubles;
    XF_CONTEXT("single_transformer_blocks.", j);
    profiling::Span span("block", "single_transformer_block");
    span.arg("index", j);
    XF_CHECK(single_blocks_[j], "single_transformer_blocks.", j,
             " is not held by this model part (blocks [", part_.block_begin, ", ", part_.block_end,
             "))");
    if (!a.joined) {
      a.hidden = at::cat({a.hidden, a.context}, 1);  // [B, n + L, D]
      a.context = at::Tensor();
      a.joined = true;
    }
    a.hidden = single_blocks_[j]->forward(a.hidden, a.temb, a.rope, mask, text_keys, attend, i, l,
                                          tp_ops());
  }
}

at::Tensor HunyuanVideoTransformer3DModel::finalize(const dit::DiTActivations& a) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  XF_CHECK(a.hidden.defined(), "finalize: the image stream is undefined");
  auto x = a.joined ? a.hidden.narrow(1, 0, a.hidden.size(1) - a.text_tokens) : a.hidden;
  return proj_out_->forward(norm_out_->forward(x, a.temb));  // [B, n, out_C*pt*p*p]
}

TensorMap HunyuanVideoTransformer3DModel::forward_outputs(const at::Tensor& tokens,
                                                          const TensorMap& inputs) const {
  auto it = inputs.find("hidden_states");
  XF_CHECK(it != inputs.end() && it->second.dim() == 5,
           "HunyuanVideoTransformer3DModel: the outputs need the 5-D hidden_states input");
  const auto& hs = it->second;
  const int64_t pt = config_.patch_size_t, p = config_.patch_size;
  return {{"sample", unpatchify(tokens, hs.size(2) / pt, hs.size(3) / p, hs.size(4) / p, pt, p,
                                config_.resolved_out_channels())}};
}

std::shared_ptr<dit::DiTTransformer> make_hunyuan_video_transformer(const nlohmann::json& config,
                                                                    const std::string& config_path,
                                                                    dit::DiTPart part,
                                                                    TensorParallel tp) {
  return std::make_shared<HunyuanVideoTransformer3DModel>(
      HunyuanVideoConfig::from_json(config, config_path), part, tp);
}

at::Tensor HunyuanVideoTransformer3DModel::teacache_input(const dit::DiTActivations& a) const {
  XF_CHECK(!blocks_.empty() && blocks_[0] && !a.joined, class_name(),
           ": TeaCache reads the first double block's norm1, which this model (part) lacks");
  return blocks_[0]->modulated_input(a.hidden, a.temb, tp_ops());
}

}  // namespace xfuser::models::hunyuan_video
