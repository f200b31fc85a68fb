#include "models/hunyuan_video15/hunyuan_video15_transformer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/dit_pipefusion.h"
#include "models/hunyuan_video/hunyuan_video_blocks.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "profiling/trace.h"

namespace xfuser::models::hunyuan_video15 {
namespace {

using hunyuan_video::HunyuanVideoTransformer3DModel;

constexpr double kNormEps = 1e-6;     // the blocks' and norm_out's
constexpr double kTorchLnEps = 1e-5;  // nn.LayerNorm's default (the projectors)
constexpr int64_t kTimestepChannels = 256;
constexpr int64_t kCondTypes = 3;  // cond_type_embed rows: 0 Qwen text, 1 ByT5 glyphs, 2 image

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

const at::Tensor* find_extra(const dit::DiTInputs& in, const char* name) {
  auto it = in.extra.find(name);
  return it == in.extra.end() ? nullptr : &it->second;
}

// A 0/1 mask of any real or bool dtype as bool; other values are an error naming `name`.
at::Tensor binary_mask(const at::Tensor& mask, const std::string& name) {
  XF_CHECK(at::isFloatingType(mask.scalar_type()) || at::isIntegralType(mask.scalar_type(), true),
           name, " must be a real or bool tensor, got ", mask.scalar_type());
  if (mask.numel() > 0 && mask.scalar_type() != at::kBool) {
    const bool binary = at::logical_or(mask == 0, mask == 1).all().item<bool>();
    XF_CHECK(binary, name, " must hold only 0 and 1, got other values");
  }
  return mask.to(at::kBool);
}

// The valid tokens of the three text streams [B, N3 + L2 + L1] bool in the streams' order
// (image, glyphs, Qwen); `t2v`: the image embeddings are all zeros over the whole batch
// (diffusers' is_t2v), their tokens then all padding.
at::Tensor stream_keys(const dit::DiTInputs& in, bool* t2v) {
  using M = HunyuanVideo15Transformer3DModel;
  const at::Tensor* mask2 = find_extra(in, M::kTextMask2);
  const at::Tensor* image = find_extra(in, M::kImageEmbeds);
  XF_CHECK(in.text_mask.defined() && mask2 && image && in.text.defined(),
           "HunyuanVideo15Transformer3DModel: the text stream needs encoder_hidden_states, "
           "encoder_attention_mask, ",
           M::kTextMask2, " and ", M::kImageEmbeds);
  *t2v = (*image == 0).all().item<bool>();
  auto mask3 = at::full({image->size(0), image->size(1)}, !*t2v, in.text_mask.options());
  return at::cat({mask3, *mask2, in.text_mask}, 1);
}

}  // namespace

// HunyuanVideo15ByT5TextProjection: norm (LayerNorm, eps 1e-5), linear_1 (in -> hidden), GELU,
// linear_2 (hidden -> hidden), GELU, linear_3 (hidden -> D). diffusers' hidden is 2048.
class HunyuanVideo15ByT5TextProjection : public Module {
 public:
  HunyuanVideo15ByT5TextProjection(int64_t in, int64_t hidden, int64_t out) {
    norm_ = child("norm", std::make_shared<LayerNorm>(in, kTorchLnEps));
    linear_1_ = child("linear_1", std::make_shared<Linear>(in, hidden));
    linear_2_ = child("linear_2", std::make_shared<Linear>(hidden, hidden));
    linear_3_ = child("linear_3", std::make_shared<Linear>(hidden, out));
  }
  at::Tensor forward(const at::Tensor& x) const {
    auto h = activate(linear_1_->forward(norm_->forward(x)), Activation::kGelu);
    h = activate(linear_2_->forward(h), Activation::kGelu);
    return linear_3_->forward(h);
  }

 private:
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> linear_1_, linear_2_, linear_3_;
};

// HunyuanVideo15ImageProjection: norm_in (LayerNorm), linear_1 (in -> in), GELU, linear_2
// (in -> D), norm_out (LayerNorm), eps 1e-5.
class HunyuanVideo15ImageProjection : public Module {
 public:
  HunyuanVideo15ImageProjection(int64_t in, int64_t out) {
    norm_in_ = child("norm_in", std::make_shared<LayerNorm>(in, kTorchLnEps));
    linear_1_ = child("linear_1", std::make_shared<Linear>(in, in));
    linear_2_ = child("linear_2", std::make_shared<Linear>(in, out));
    norm_out_ = child("norm_out", std::make_shared<LayerNorm>(out, kTorchLnEps));
  }
  at::Tensor forward(const at::Tensor& x) const {
    auto h = activate(linear_1_->forward(norm_in_->forward(x)), Activation::kGelu);
    return norm_out_->forward(linear_2_->forward(h));
  }

 private:
  std::shared_ptr<LayerNorm> norm_in_, norm_out_;
  std::shared_ptr<Linear> linear_1_, linear_2_;
};

HunyuanVideo15Transformer3DModel::HunyuanVideo15Transformer3DModel(HunyuanVideo15Config config,
                                                                   dit::DiTPart part,
                                                                   TensorParallel tp)
    : DiTTransformer(part, tp), config_(std::move(config)) {
  const auto& c = config_;
  c.validate("HunyuanVideo15Transformer3DModel config");
  resolve_part();
  const int64_t dim = c.inner_dim();
  // Declaration order follows diffusers' __init__ (rope has no parameters).
  if (part_.embedders) {
    x_embedder_ = child("x_embedder", std::make_shared<hunyuan_video::HunyuanVideoPatchEmbed>(
                                          c.in_channels, c.patch(), dim));
    image_embedder_ = child(
        "image_embedder", std::make_shared<HunyuanVideo15ImageProjection>(c.image_embed_dim, dim));
    context_embedder_ =
        child("context_embedder", std::make_shared<hunyuan_video::HunyuanVideoTokenRefiner>(
                                      c.text_embed_dim, c.num_attention_heads, c.attention_head_dim,
                                      c.num_refiner_layers, /*key_zero_visible=*/false));
    context_embedder_2_ =
        child("context_embedder_2", std::make_shared<HunyuanVideo15ByT5TextProjection>(
                                        c.text_embed_2_dim, c.byt5_hidden_size, dim));
  }
  timestep_embedder_ = child("time_embed.timestep_embedder",
                             std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
  if (c.use_meanflow) {
    timestep_embedder_r_ = child("time_embed.timestep_embedder_r",
                                 std::make_shared<TimestepEmbedding>(kTimestepChannels, dim));
  }
  if (part_.embedders) {
    cond_type_embed_ = &param("cond_type_embed.weight", {kCondTypes, dim});
    cond_type_embed_->layer = LayerKind::kEmbedding;  // diffusers' nn.Embedding
  }
  const auto block_config = c.block_config();
  blocks_.resize(c.num_layers);
  for (int64_t i = part_.block_begin; i < part_.block_end; ++i) {
    blocks_[i] =
        child("transformer_blocks." + std::to_string(i),
              std::make_shared<hunyuan_video::HunyuanVideoTransformerBlock>(block_config, tp_));
  }
  if (part_.head) {
    norm_out_ =
        child("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, false, kNormEps));
    proj_out_ = child("proj_out", std::make_shared<Linear>(dim, c.output_dim()));
  }
}

HunyuanVideo15Transformer3DModel::~HunyuanVideo15Transformer3DModel() = default;

c10::ScalarType HunyuanVideo15Transformer3DModel::dtype() const {
  const auto* w = timestep_embedder_->named_parameters().front().second;
  XF_CHECK(w->loaded(), "HunyuanVideo15Transformer3DModel used before its weights were loaded");
  return w->compute_dtype();
}

std::vector<int64_t> HunyuanVideo15Transformer3DModel::block_parameters() const {
  // A whole model of the same config declares every block (shapes only, nothing allocated).
  const HunyuanVideo15Transformer3DModel whole(config_);
  return dit::parameters_per_block(whole, {{"transformer_blocks.", config_.num_layers}});
}

std::vector<int64_t> HunyuanVideo15Transformer3DModel::other_parameters() const {
  const HunyuanVideo15Transformer3DModel whole(config_);
  return {dit::parameters_with_prefix(whole, {"x_embedder.", "image_embedder.", "context_embedder.",
                                              "context_embedder_2.", "cond_type_embed."}),
          dit::parameters_with_prefix(whole, {"time_embed."}),
          dit::parameters_with_prefix(whole, {"norm_out.", "proj_out."})};
}

const std::vector<std::string>& HunyuanVideo15Transformer3DModel::input_names() {
  static const std::vector<std::string> kNames = {"hidden_states",
                                                  "timestep",
                                                  "encoder_hidden_states",
                                                  "encoder_attention_mask",
                                                  "timestep_r",
                                                  "encoder_hidden_states_2",
                                                  "encoder_attention_mask_2",
                                                  "image_embeds"};
  return kNames;
}

dit::DiTInputs HunyuanVideo15Transformer3DModel::parse_forward_inputs(
    const TensorMap& inputs) const {
  XF_CONTEXT("HunyuanVideo15Transformer3DModel.forward inputs");
  const auto& names = input_names();
  std::vector<std::string> unknown;
  for (const auto& [name, t] : inputs) {
    if (std::find(names.begin(), names.end(), name) == names.end()) unknown.push_back(name);
  }
  XF_CHECK(unknown.empty(), "HunyuanVideo15Transformer3DModel.forward: unknown input(s) ",
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
           "hidden_states must be ", hs_shape, " (latents, image-condition latents and mask ",
           "concatenated on the channels), got ", shape_string(hs.sizes()));
  XF_CHECK(at::isFloatingType(hs.scalar_type()), "hidden_states must be floating point, got ",
           hs.scalar_type());
  const int64_t pt = c.patch_size_t, p = c.patch_size;
  XF_CHECK(hs.size(2) >= pt && hs.size(3) >= p && hs.size(4) >= p && hs.size(2) % pt == 0 &&
               hs.size(3) % p == 0 && hs.size(4) % p == 0,
           "hidden_states frames, height and width (", hs.size(2), " x ", hs.size(3), " x ",
           hs.size(4), ") must be positive multiples of (patch_size_t, patch_size, patch_size) (",
           pt, ", ", p, ", ", p, ")");
  dit::DiTInputs in;
  in.tokens = HunyuanVideoTransformer3DModel::patchify(hs, pt, p);
  in.token_ids = HunyuanVideoTransformer3DModel::token_ids(hs.size(2) / pt, hs.size(3) / p,
                                                           hs.size(4) / p, hs.options());
  in.text = get("encoder_hidden_states");
  in.timestep = get("timestep");
  for (const std::string name : {"encoder_attention_mask", "encoder_attention_mask_2"}) {
    XF_CHECK(get(name).defined(), "missing required input '", name,
             "' (expected [B, L]: 1 for the tokens, 0 for the padding)");
  }
  in.text_mask = binary_mask(get("encoder_attention_mask"), "encoder_attention_mask");
  in.extra[kTextMask2] = binary_mask(get("encoder_attention_mask_2"), "encoder_attention_mask_2");
  for (const char* name : {kTextEmbeds2, kImageEmbeds, kTimestepR}) {
    if (auto t = get(name); t.defined()) in.extra[name] = t;
  }
  // timestep_r [1] (the image-to-video pipeline's) as [B]: the drivers concatenate the extra
  // inputs of the CFG branches along the batch, which needs one row per sample.
  if (auto it = in.extra.find(kTimestepR);
      it != in.extra.end() && it->second.dim() == 1 && it->second.size(0) == 1 && hs.size(0) > 1) {
    it->second = it->second.expand({hs.size(0)}).contiguous();
  }
  check_inputs(in);
  return in;
}

void HunyuanVideo15Transformer3DModel::check_inputs(const dit::DiTInputs& in) const {
  XF_CONTEXT("HunyuanVideo15Transformer3DModel.forward inputs");
  const auto& c = config_;
  const std::string tok_shape = "[B, N, " + std::to_string(c.token_channels()) + "]";
  auto require = [](const at::Tensor* t, const char* name, const std::string& shape) {
    XF_CHECK(t && t->defined(), "missing required input '", name, "' (expected ", shape, ")");
  };
  const std::string enc_shape = "[B, L1, " + std::to_string(c.text_embed_dim) + "]";
  const std::string enc2_shape = "[B, L2, " + std::to_string(c.text_embed_2_dim) + "]";
  const std::string img_shape = "[B, N3, " + std::to_string(c.image_embed_dim) +
                                "] (SigLIP image embeddings; zeros for text-to-video)";
  require(&in.tokens, "hidden_states", tok_shape + " patchified tokens");
  require(&in.token_ids, "token_ids", "[N, 3]");
  require(&in.text, "encoder_hidden_states", enc_shape);
  require(&in.text_mask, "encoder_attention_mask", "[B, L1]");
  require(&in.timestep, "timestep", "[B]");
  const at::Tensor* enc2 = find_extra(in, kTextEmbeds2);
  const at::Tensor* mask2 = find_extra(in, kTextMask2);
  const at::Tensor* image = find_extra(in, kImageEmbeds);
  const at::Tensor* timestep_r = find_extra(in, kTimestepR);
  require(enc2, kTextEmbeds2, enc2_shape + " (ByT5 glyph embeddings)");
  require(mask2, kTextMask2, "[B, L2]");
  require(image, kImageEmbeds, img_shape);

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
  auto check_stream = [&](const at::Tensor& x, const at::Tensor& mask, const char* x_name,
                          const char* mask_name, int64_t width) {
    XF_CHECK(x.dim() == 3 && x.size(0) == b && x.size(2) == width, x_name, " must be [", b, ", L, ",
             width, "], got ", shape_string(x.sizes()));
    XF_CHECK(at::isFloatingType(x.scalar_type()), x_name, " must be floating point, got ",
             x.scalar_type());
    XF_CHECK(mask.dim() == 2 && mask.size(0) == b && mask.size(1) == x.size(1), mask_name,
             " must be [", b, ", ", x.size(1), "] (batch x tokens of ", x_name, "), got ",
             shape_string(mask.sizes()));
    XF_CHECK(mask.scalar_type() == at::kBool, "the token-level ", mask_name,
             " must be bool (true: a token), got ", mask.scalar_type());
  };
  check_stream(in.text, in.text_mask, "encoder_hidden_states", "encoder_attention_mask",
               c.text_embed_dim);
  XF_CHECK(in.text.size(1) >= 1, "encoder_hidden_states must hold at least one token");
  // The token refiner's masked mean divides by the valid count (diffusers gives NaN for none).
  XF_CHECK(in.text_mask.any(1).all().item<bool>(),
           "encoder_attention_mask: every batch row needs at least one valid text token (the "
           "token refiner averages the valid tokens)");
  check_stream(*enc2, *mask2, kTextEmbeds2, kTextMask2, c.text_embed_2_dim);
  XF_CHECK(image->dim() == 3 && image->size(0) == b && image->size(2) == c.image_embed_dim &&
               image->size(1) >= 1,
           "image_embeds must be [", b, ", N3, ", c.image_embed_dim, "], got ",
           shape_string(image->sizes()));
  XF_CHECK(at::isFloatingType(image->scalar_type()), "image_embeds must be floating point, got ",
           image->scalar_type());
  auto check_time = [&](const at::Tensor& t, const char* name) {
    XF_CHECK(t.dim() == 1 && (t.size(0) == b || t.size(0) == 1), name, " must be [", b,
             "] (or [1]), got ", shape_string(t.sizes()));
    XF_CHECK(at::isFloatingType(t.scalar_type()) || at::isIntegralType(t.scalar_type(), false),
             name, " must be an integer or floating tensor, got ", t.scalar_type());
  };
  check_time(in.timestep, "timestep");
  if (timestep_r) {
    XF_CHECK(c.use_meanflow,
             "timestep_r is given but the model has no timestep_embedder_r (use_meanflow is false "
             "in its config)");
    check_time(*timestep_r, "timestep_r");
  }
  for (const auto& [name, t] : in.extra) {
    XF_CHECK(
        name == kTextEmbeds2 || name == kTextMask2 || name == kImageEmbeds || name == kTimestepR,
        "HunyuanVideo15Transformer3DModel: unknown extra input '", name,
        "' (accepted: ", kTextEmbeds2, ", ", kTextMask2, ", ", kImageEmbeds, ", ", kTimestepR, ")");
  }
}

dit::DiTActivations HunyuanVideo15Transformer3DModel::embed(const dit::DiTInputs& in) const {
  XF_CONTEXT("HunyuanVideo15Transformer3DModel.embed");
  const auto dtype = this->dtype();
  dit::DiTActivations a;
  auto proj = [&](const at::Tensor& t) {
    return timestep_embedding(t, kTimestepChannels, true, 0.0).to(dtype);
  };
  a.temb = timestep_embedder_->forward(proj(in.timestep));
  if (const at::Tensor* r = find_extra(in, kTimestepR)) {
    XF_CHECK(timestep_embedder_r_, "timestep_r is given but the model has no timestep_embedder_r");
    a.temb = a.temb + timestep_embedder_r_->forward(proj(*r));
  }
  const at::Tensor& mask2 = in.extra.at(kTextMask2);
  const at::Tensor& image_embeds = in.extra.at(kImageEmbeds);
  bool t2v = false;
  const at::Tensor keys = stream_keys(in, &t2v);  // [B, L] in the streams' order
  a.text_tokens = keys.size(1);
  if (x_embedder_) {
    a.hidden = x_embedder_->forward(in.tokens.to(dtype));  // [B, n, D]
    const at::Tensor cond = cond_type_embed_->value();     // [3, D]
    auto text = context_embedder_->forward(in.text.to(dtype), in.timestep, in.text_mask) + cond[0];
    auto glyphs = context_embedder_2_->forward(in.extra.at(kTextEmbeds2).to(dtype)) + cond[1];
    auto image = image_embedder_->forward(image_embeds.to(dtype));
    if (t2v) image = image * 0.0;
    image = image + cond[2];
    // The padded glyph and Qwen tokens become zeros (the padded image tokens keep their values).
    auto zero = at::zeros({}, text.options());
    text = at::where(in.text_mask.unsqueeze(-1), text, zero);
    glyphs = at::where(mask2.unsqueeze(-1), glyphs, zero);
    auto joint = at::cat({image, glyphs, text}, 1);  // [B, L, D]
    // diffusers' order: the valid tokens of (image, glyphs, text), then the padded ones, each
    // group in stream order: a stable sort on "padded".
    auto order = std::get<1>(
        at::sort(at::logical_not(keys).to(at::kInt), c10::optional<bool>(true), 1, false));
    a.context = at::gather(joint, 1, order.unsqueeze(-1).expand({-1, -1, joint.size(2)}));
  }
  // After the reordering a row's valid text tokens are its first count_b. The columns from
  // max_b count_b on are padding in every row: no image or valid text query attends them and
  // they reach nothing else, so they are dropped (exact for the output; t2v's image tokens,
  // unused glyph slots and the prompts' padding cost nothing in the blocks).
  auto counts = keys.sum(1, /*keepdim=*/true);  // [B, 1] int64
  const int64_t kept = counts.max().item<int64_t>();
  if (a.context.defined() && kept < a.text_tokens) a.context = a.context.narrow(1, 0, kept);
  a.text_tokens = kept;
  auto text_keys = at::arange(kept, counts.options()).unsqueeze(0) < counts;  // [B, L]
  if (!text_keys.all().item<bool>()) a.extra[kTextKeyMask] = text_keys;
  a.rope =
      HunyuanVideoTransformer3DModel::rope(in.token_ids, config_.rope_axes_dim, config_.rope_theta);
  return a;
}

void HunyuanVideo15Transformer3DModel::run_blocks(dit::DiTActivations& a, int64_t begin,
                                                  int64_t end) const {
  XF_CHECK(0 <= begin && begin <= end && end <= num_blocks(), "run_blocks: range [", begin, ", ",
           end, ") is outside the ", num_blocks(), " blocks");
  if (begin == end) return;
  XF_CHECK(a.hidden.defined(), "run_blocks: the image stream is undefined (a part without the ",
           "embedders needs the previous stage's activations)");
  XF_CHECK(a.context.defined() && !a.joined, "run_blocks: the activations lack the text stream");
  XF_CHECK(a.context.size(1) == a.text_tokens, "run_blocks: the text stream has ",
           a.context.size(1), " tokens, the activations say ", a.text_tokens);
  XF_CHECK(a.rope.cos.defined(),
           "run_blocks: the activations lack the rotary tables (they come from embed())");
  const int64_t n = a.hidden.size(1);
  XF_CHECK(a.rope.cos.size(0) == n, "run_blocks: ", a.rope.cos.size(0), " rotary rows for ", n,
           " image tokens");
  at::Tensor text_keys;
  if (auto it = a.extra.find(kTextKeyMask); it != a.extra.end()) text_keys = it->second;
  const at::Tensor mask = hunyuan_video::joint_key_mask(text_keys, n);
  hunyuan_video::AttendFn attend = [this](const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const AttentionCall& call) {
    return this->attend(q, k, v, call);
  };
  for (int64_t i = begin; i < end; ++i) {
    XF_CONTEXT("transformer_blocks.", i);
    profiling::Span span("block", "transformer_block");
    span.arg("index", i);
    XF_CHECK(blocks_[i], "transformer_blocks.", i, " is not held by this model part (blocks [",
             part_.block_begin, ", ", part_.block_end, "))");
    blocks_[i]->forward(a.hidden, a.context, a.temb, a.rope, mask, text_keys, attend, i, tp_ops());
  }
}

at::Tensor HunyuanVideo15Transformer3DModel::finalize(const dit::DiTActivations& a) const {
  XF_CHECK(proj_out_, "finalize: norm_out/proj_out are not held by this model part");
  XF_CHECK(a.hidden.defined() && !a.joined, "finalize: the image stream is undefined");
  return proj_out_->forward(norm_out_->forward(a.hidden, a.temb));  // [B, n, out_C*pt*p*p]
}

int64_t HunyuanVideo15Transformer3DModel::text_tokens(const dit::DiTInputs& in) const {
  bool t2v = false;
  return stream_keys(in, &t2v).sum(1).max().item<int64_t>();  // as embed() keeps them
}

TensorMap HunyuanVideo15Transformer3DModel::forward_outputs(const at::Tensor& tokens,
                                                            const TensorMap& inputs) const {
  auto it = inputs.find("hidden_states");
  XF_CHECK(it != inputs.end() && it->second.dim() == 5,
           "HunyuanVideo15Transformer3DModel: the outputs need the 5-D hidden_states input");
  const auto& hs = it->second;
  const int64_t pt = config_.patch_size_t, p = config_.patch_size;
  return {{"sample", HunyuanVideoTransformer3DModel::unpatchify(
                         tokens, hs.size(2) / pt, hs.size(3) / p, hs.size(4) / p, pt, p,
                         config_.resolved_out_channels())}};
}

std::shared_ptr<dit::DiTTransformer> make_hunyuan_video15_transformer(
    const nlohmann::json& config, const std::string& config_path, dit::DiTPart part,
    TensorParallel tp) {
  return std::make_shared<HunyuanVideo15Transformer3DModel>(
      HunyuanVideo15Config::from_json(config, config_path), part, tp);
}

}  // namespace xfuser::models::hunyuan_video15
