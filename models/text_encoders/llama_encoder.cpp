#include "models/text_encoders/llama_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::text_encoders {
namespace {

constexpr double kPi = 3.141592653589793;  // math.pi

// torch.finfo(dtype).min: the additive mask value transformers uses.
double dtype_lowest(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return -65504.0;
    case at::kBFloat16:
      return -3.3895313892515355e38;
    case at::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return std::numeric_limits<float>::lowest();
  }
}

// [..., hd] -> cat(-x2, x1)
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

// ---- config -------------------------------------------------------------------------------------

namespace {

// The rotary settings of a language-model config, in either layout: transformers < 5 writes
// `rope_theta` and `rope_scaling` (null, or an object with "rope_type" / "type" and the scaling's
// fields) at the top level; transformers 5 writes one `rope_parameters` object that holds
// rope_theta, rope_type and the same fields. Both at once must agree on theta and hold no
// second scaling; a rope_parameters that is not an object is an error naming the key.
struct RopeSettings {
  double theta = 0.0;
  nlohmann::json scaling;  // null, or the object carrying rope_type and its fields
  std::string where;       // the key it came from, for errors
};

RopeSettings read_rope(const nlohmann::json& j, double default_theta, const std::string& path) {
  RopeSettings r;
  const auto params = j.find("rope_parameters");
  if (params == j.end() || params->is_null()) {
    r.theta = cfg<double>(j, "rope_theta", default_theta, path);
    if (const auto it = j.find("rope_scaling"); it != j.end()) r.scaling = *it;
    r.where = path + " \"rope_scaling\"";
    return r;
  }
  r.where = path + " \"rope_parameters\"";
  XF_CHECK(params->is_object(), "config ", r.where, " must be an object or null, got ",
           params->dump());
  r.theta = cfg<double>(*params, "rope_theta", default_theta, r.where);
  if (const auto top = j.find("rope_theta"); top != j.end() && !top->is_null()) {
    const double t = cfg<double>(j, "rope_theta", r.theta, path);
    XF_CHECK(t == r.theta, "config ", path, ": rope_theta ", t, " and rope_parameters.rope_theta ",
             r.theta, " differ");
  }
  if (const auto top = j.find("rope_scaling"); top != j.end() && !top->is_null()) {
    XF_CHECK(*top == *params, "config ", path,
             ": both rope_scaling and rope_parameters are given and they differ; keep one");
  }
  r.scaling = *params;
  return r;
}

// Qwen2_5_VLTextConfig (transformers 4.57.1) of a Qwen2_5_VLTextModel folder, or the text part of
// a Qwen2_5_VLForConditionalGeneration one: its "text_config", or (the original Qwen2.5-VL
// checkpoints' config.json) the top-level keys.
LlamaEncoderConfig qwen2_5_vl_from_json(const nlohmann::json& top, const std::string& top_path,
                                        const std::string& architecture) {
  using C = LlamaEncoderConfig;
  const bool full = architecture == "Qwen2_5_VLForConditionalGeneration";
  const auto tc = top.find("text_config");
  const bool nested = full && tc != top.end() && tc->is_object();
  const nlohmann::json& j = nested ? *tc : top;
  const std::string path = nested ? top_path + " text_config" : top_path;
  const std::string model_type =
      cfg<std::string>(j, "model_type", full && !nested ? "qwen2_5_vl" : "qwen2_5_vl_text", path);
  XF_CHECK(model_type == "qwen2_5_vl_text" || model_type == "qwen2_5_vl", "config ", path,
           ": model_type '", model_type, "' is not a Qwen2.5-VL language model (", architecture,
           ")");
  C c;
  c.architecture = architecture;
  c.family = C::Family::kQwen2;
  c.multimodal = full;
  // Q/K/V carry biases, o_proj and the MLP none (Qwen2_5_VLAttention, Qwen2MLP).
  c.qkv_bias = true;
  // transformers 4.57's SDPA path (the default) on torch >= 2.5: fully masked query rows (the
  // leading pads of a left-padded row) get a zero attention output.
  c.fully_masked_rows = C::FullyMaskedRows::kZero;
  c.vocab_size = cfg<int64_t>(j, "vocab_size", 152064, path);
  c.hidden_size = cfg<int64_t>(j, "hidden_size", 8192, path);
  c.intermediate_size = cfg<int64_t>(j, "intermediate_size", 29568, path);
  c.num_hidden_layers = cfg<int64_t>(j, "num_hidden_layers", 80, path);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", 64, path);
  const bool kv_given = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null();
  c.num_key_value_heads =
      kv_given ? cfg<int64_t>(j, "num_key_value_heads", 8, path)
               : (j.contains("num_key_value_heads") ? c.num_attention_heads : int64_t{8});
  c.hidden_act = hidden_act_from_name(cfg<std::string>(j, "hidden_act", "silu", path),
                                      path + " \"hidden_act\"");
  c.rms_norm_eps = cfg<double>(j, "rms_norm_eps", 1e-5, path);
  const RopeSettings rope = read_rope(j, 1000000.0, path);
  c.rope_theta = rope.theta;
  c.max_position_embeddings = cfg<int64_t>(j, "max_position_embeddings", 32768, path);
  XF_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
               c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_hidden_layers >= 1,
           "config ", path,
           ": vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads "
           "and num_key_value_heads must be positive");
  XF_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "config ", path,
           ": num_attention_heads ", c.num_attention_heads,
           " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  XF_CHECK(c.hidden_size % c.num_attention_heads == 0, "config ", path, ": hidden_size ",
           c.hidden_size, " is not divisible by num_attention_heads ", c.num_attention_heads);
  c.head_dim = c.hidden_size / c.num_attention_heads;  // Qwen2_5_VLAttention ignores head_dim
  XF_CHECK(c.head_dim % 2 == 0, "config ", path, ": head_dim ", c.head_dim,
           " (hidden_size / num_attention_heads) must be even for RoPE");
  XF_CHECK(c.rms_norm_eps >= 0 && c.rope_theta > 0, "config ", path,
           ": rms_norm_eps must be >= 0 and rope_theta > 0");
  // Sliding-window layers (use_sliding_window with layers from max_window_layers on, or an
  // explicit layer_types) are not supported; Qwen2.5-VL ships with use_sliding_window false.
  const bool sliding = cfg<bool>(j, "use_sliding_window", false, path);
  const int64_t max_window_layers = cfg<int64_t>(j, "max_window_layers", 80, path);
  XF_CHECK(!sliding || max_window_layers >= c.num_hidden_layers, "config ", path,
           ": use_sliding_window with sliding layers from max_window_layers ", max_window_layers,
           " on is not supported (only full attention)");
  if (const auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    XF_CHECK(lt->is_array(), "config ", path, ": layer_types must be a list");
    for (const auto& t : *lt) {
      XF_CHECK(t == "full_attention", "config ", path, ": layer_types holds ", t.dump(),
               "; only \"full_attention\" layers are supported");
    }
  }
  // rope_scaling / rope_parameters: null, or {"type" / "rope_type": "mrope" | "default",
  // "mrope_section": [...]}. For text the three position rows of the multimodal RoPE are equal
  // (Qwen2_5_VLTextModel expands cache_position to 3 rows), so every section takes the same
  // angles: Qwen2's 1-D RoPE.
  if (const nlohmann::json* it = &rope.scaling; !it->is_null()) {
    const std::string& where = rope.where;
    XF_CHECK(it->is_object(), "config ", where, " must be an object or null, got ", it->dump());
    std::string type = cfg<std::string>(*it, "type", "default", where);
    type = cfg<std::string>(*it, "rope_type", type, where);
    XF_CHECK(type == "default" || type == "mrope", "config ", where, ": rope_type '", type,
             "' is not supported for ", architecture, " (supported: \"default\", \"mrope\")");
    if (const auto ms = it->find("mrope_section"); ms != it->end() && !ms->is_null()) {
      int64_t sum = 0;
      XF_CHECK(ms->is_array(), "config ", where, ": mrope_section must be a list");
      for (const auto& v : *ms) {
        XF_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, "config ", where,
                 ": mrope_section entries must be non-negative integers, got ", ms->dump());
        sum += v.get<int64_t>();
      }
      XF_CHECK(2 * sum == c.head_dim, "config ", where, ": mrope_section ", ms->dump(), " sums to ",
               sum, ", not head_dim / 2 = ", c.head_dim / 2);
    }
  }
  return c;
}

}  // namespace

LlamaEncoderConfig LlamaEncoderConfig::from_json(const nlohmann::json& j, const std::string& path,
                                                 const std::string& architecture) {
  XF_CHECK(j.is_object(), "config ", path, " is not a JSON object");
  if (architecture == "Mistral3ForConditionalGeneration") {
    // FLUX.2's text encoder: the language model (a MistralModel) of a Mistral 3 vision-language
    // checkpoint, configured by "text_config"; the vision tower and projector are not used.
    const auto tc = j.find("text_config");
    XF_CHECK(tc != j.end() && tc->is_object(), "config ", path,
             ": a Mistral3ForConditionalGeneration config needs a \"text_config\" object (the "
             "language model's MistralConfig)");
    const std::string model_type = tc->value("model_type", std::string("mistral"));
    XF_CHECK(model_type == "mistral", "config ", path, ": text_config.model_type is '", model_type,
             "'; only a Mistral language model is supported");
    LlamaEncoderConfig c = from_json(*tc, path + " text_config", "MistralModel");
    c.architecture = architecture;
    c.multimodal = true;
    // Mistral 3 exists from transformers 4.50, whose SDPA path (the default) on torch >= 2.5
    // gives fully masked query rows a zero attention output.
    c.fully_masked_rows = FullyMaskedRows::kZero;
    return c;
  }
  if (architecture == "Qwen2_5_VLTextModel" ||
      architecture == "Qwen2_5_VLForConditionalGeneration") {
    return qwen2_5_vl_from_json(j, path, architecture);
  }
  LlamaEncoderConfig c;
  c.architecture = architecture;
  if (architecture == "LlamaModel" || architecture == "LlamaForCausalLM") {
    c.family = Family::kLlama;
  } else if (architecture == "MistralModel" || architecture == "MistralForCausalLM") {
    c.family = Family::kMistral;
  } else {
    XF_THROW("config ", path, ": architecture '", architecture,
             "' is not a Llama / Mistral language model (LlamaModel, LlamaForCausalLM, "
             "MistralModel, MistralForCausalLM, Mistral3ForConditionalGeneration)");
  }
  c.causal_lm = architecture.size() > 11 &&
                architecture.compare(architecture.size() - 11, 11, "ForCausalLM") == 0;
  const bool mistral = c.family == Family::kMistral;

  // transformers 4.44.2 LlamaConfig / MistralConfig defaults.
  c.vocab_size = cfg<int64_t>(j, "vocab_size", 32000, path);
  c.hidden_size = cfg<int64_t>(j, "hidden_size", 4096, path);
  c.intermediate_size = cfg<int64_t>(j, "intermediate_size", mistral ? 14336 : 11008, path);
  c.num_hidden_layers = cfg<int64_t>(j, "num_hidden_layers", 32, path);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", 32, path);
  // Llama: null -> num_attention_heads; Mistral: default 8, null -> num_attention_heads.
  const bool kv_given = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null();
  c.num_key_value_heads = kv_given ? cfg<int64_t>(j, "num_key_value_heads", 0, path)
                          : (mistral && !j.contains("num_key_value_heads")) ? 8
                                                                            : c.num_attention_heads;
  c.hidden_act = hidden_act_from_name(cfg<std::string>(j, "hidden_act", "silu", path),
                                      path + " \"hidden_act\"");
  c.rms_norm_eps = cfg<double>(j, "rms_norm_eps", 1e-6, path);
  const RopeSettings rope = read_rope(j, 10000.0, path);
  c.rope_theta = rope.theta;
  c.max_position_embeddings =
      cfg<int64_t>(j, "max_position_embeddings", mistral ? 4096 * 32 : 2048, path);

  XF_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
               c.num_attention_heads > 0 && c.num_key_value_heads > 0,
           "config ", path,
           ": vocab_size, hidden_size, intermediate_size, num_attention_heads and "
           "num_key_value_heads must be positive");
  XF_CHECK(c.num_hidden_layers >= 1, "config ", path, ": num_hidden_layers must be >= 1, got ",
           c.num_hidden_layers);
  XF_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "config ", path,
           ": num_attention_heads ", c.num_attention_heads,
           " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  XF_CHECK(c.rms_norm_eps >= 0 && c.rope_theta > 0, "config ", path,
           ": rms_norm_eps must be >= 0 and rope_theta > 0");

  const int64_t even_split = c.hidden_size / c.num_attention_heads;
  if (mistral) {
    c.head_dim = cfg<int64_t>(j, "head_dim", 0, path);  // null / 0: hidden / heads
    if (c.head_dim == 0) {
      XF_CHECK(c.hidden_size % c.num_attention_heads == 0, "config ", path, ": hidden_size ",
               c.hidden_size, " is not divisible by num_attention_heads ", c.num_attention_heads,
               " and no head_dim is given");
      c.head_dim = even_split;
    }
    // MistralConfig: absent -> 4096, null -> no window.
    if (!j.contains("sliding_window")) {
      c.sliding_window = 4096;
    } else if (!j["sliding_window"].is_null()) {
      c.sliding_window = cfg<int64_t>(j, "sliding_window", 0, path);
      XF_CHECK(*c.sliding_window >= 1, "config ", path,
               ": sliding_window must be >= 1 or null, got ", *c.sliding_window);
    }
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      XF_CHECK(!cfg<bool>(j, key, false, path), "config ", path, ": ", key,
               " is true, but transformers 4.44.2's Mistral has no biases");
    }
  } else {
    XF_CHECK(c.hidden_size % c.num_attention_heads == 0, "config ", path, ": hidden_size ",
             c.hidden_size, " is not divisible by num_attention_heads ", c.num_attention_heads);
    c.head_dim = even_split;
    const int64_t given = cfg<int64_t>(j, "head_dim", even_split, path);
    XF_CHECK(given == even_split, "config ", path, ": head_dim ", given,
             " differs from hidden_size / num_attention_heads = ", even_split,
             ", which transformers 4.44.2's Llama attention uses");
    c.attention_bias = cfg<bool>(j, "attention_bias", false, path);
    c.mlp_bias = cfg<bool>(j, "mlp_bias", false, path);
  }
  XF_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "config ", path,
           ": head_dim must be positive and even for RoPE, got ", c.head_dim);

  // rope_scaling / rope_parameters: null, default, or llama3.
  if (!rope.scaling.is_null()) {
    const auto& rs = rope.scaling;
    const std::string& where = rope.where;
    XF_CHECK(rs.is_object(), "config ", where, " must be an object or null, got ", rs.dump());
    std::string type = cfg<std::string>(rs, "type", "", where);  // legacy key
    type = cfg<std::string>(rs, "rope_type", type, where);
    if (type == "default") {
      c.rope_type = RopeType::kDefault;
    } else if (type == "llama3" && !mistral) {
      c.rope_type = RopeType::kLlama3;
      c.rope_factor = cfg_required<double>(rs, "factor", where);
      c.rope_low_freq_factor = cfg_required<double>(rs, "low_freq_factor", where);
      c.rope_high_freq_factor = cfg_required<double>(rs, "high_freq_factor", where);
      c.rope_original_max_position_embeddings =
          cfg_required<int64_t>(rs, "original_max_position_embeddings", where);
      XF_CHECK(c.rope_factor > 0 && c.rope_low_freq_factor > 0 &&
                   c.rope_high_freq_factor != c.rope_low_freq_factor &&
                   c.rope_original_max_position_embeddings > 0,
               "config ", where,
               ": llama3 needs factor > 0, low_freq_factor > 0, high_freq_factor != "
               "low_freq_factor and original_max_position_embeddings > 0, got ",
               rs.dump());
    } else {
      XF_THROW("config ", where, ": rope_type '", type, "' is not supported for ", architecture,
               mistral ? " (transformers 4.44.2's Mistral has no rope scaling; supported: null)"
                       : " (supported: null, \"default\", \"llama3\")");
    }
  }
  return c;
}

at::Tensor llama_rope_inv_freq(const LlamaEncoderConfig& c) {
  // Host float32, as transformers builds the buffer at __init__ (then moves it to the device).
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t dim = c.head_dim;
  // 1.0 / (base ** (arange(0, dim, 2, int64).float() / dim)); `1.0 / t` is t.reciprocal() * 1.0.
  auto exponent = at::arange(0, dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / dim;
  auto inv_freq = at::pow(c.rope_theta, exponent).reciprocal() * 1.0;  // [dim / 2]
  switch (c.rope_type) {
    case LlamaEncoderConfig::RopeType::kDefault:
      return inv_freq;
    case LlamaEncoderConfig::RopeType::kLlama3: {
      // _compute_llama3_parameters, op for op (Python scalars meet float32 tensors in float32).
      const double factor = c.rope_factor;
      const double low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
      const double old_context = static_cast<double>(c.rope_original_max_position_embeddings);
      const double low_freq_wavelen = old_context / low;
      const double high_freq_wavelen = old_context / high;
      auto wavelen = inv_freq.reciprocal() * (2 * kPi);
      auto llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
      auto smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
      auto smoothed = (1 - smooth) * llama / factor + smooth * llama;
      auto medium = at::logical_not(wavelen < high_freq_wavelen) *
                    at::logical_not(wavelen > low_freq_wavelen);
      return at::where(medium, smoothed, llama);
    }
  }
  XF_THROW("unknown rope type ", static_cast<int>(c.rope_type));
}

// ---- layers -------------------------------------------------------------------------------------

// LlamaRMSNorm: x.float() * rsqrt(mean(x^2) + eps), cast back to x's dtype, times weight.
class LlamaRmsNorm : public Module {
 public:
  LlamaRmsNorm(int64_t dim, double eps) : eps_(eps) { weight_ = &param("weight", {dim}); }
  at::Tensor forward(const at::Tensor& x) const {
    auto h = x.to(at::kFloat);
    auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
    return weight_->value() * (h * at::rsqrt(variance + eps_)).to(x.scalar_type());
  }

 private:
  double eps_;
  ParamSlot* weight_;
};

class LlamaAttention : public Module {
 public:
  explicit LlamaAttention(const LlamaEncoderConfig& c)
      : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
    const bool bias = c.attention_bias;
    const bool qkv_bias = bias || c.qkv_bias;
    q_proj_ =
        child("q_proj", std::make_shared<Linear>(c.hidden_size, heads_ * head_dim_, qkv_bias));
    k_proj_ =
        child("k_proj", std::make_shared<Linear>(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    v_proj_ =
        child("v_proj", std::make_shared<Linear>(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    o_proj_ = child("o_proj", std::make_shared<Linear>(heads_ * head_dim_, c.hidden_size, bias));
  }

  // x [B, S, d]; cos / sin [1, 1, S, hd] in x's dtype; mask additive [B or 1, 1, S, S];
  // row_keep [B, S, 1] (0 / 1 in x's dtype) or undefined: multiplies the attention output before
  // o_proj (the zero rule for query rows with no allowed key).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask, const at::Tensor& row_keep) const {
    const int64_t b = x.size(0), s = x.size(1);
    const int64_t groups = heads_ / kv_heads_;
    auto q = q_proj_->forward(x).view({b, s, heads_, head_dim_}).transpose(1, 2);  // [B, H, S, hd]
    auto k = k_proj_->forward(x).view({b, s, kv_heads_, head_dim_}).transpose(1, 2);  // [B, KV, ..]
    auto v = v_proj_->forward(x).view({b, s, kv_heads_, head_dim_}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    // repeat_kv: query head h uses kv head h / groups; group the query heads instead of copying
    // the keys: [B, KV, G, S, hd] against [B, KV, 1, S, hd].
    auto qg = q.reshape({b, kv_heads_, groups, s, head_dim_});
    auto kg = k.unsqueeze(2);
    auto vg = v.unsqueeze(2);
    auto scores = text_encoders::matmul(qg, kg.transpose(-1, -2)) /
                  std::sqrt(static_cast<double>(head_dim_));  // [B, KV, G, S, S]
    scores = scores + mask.unsqueeze(1);                      // [B|1, 1, 1, S, S]
    auto probs = at::softmax(scores, -1, at::kFloat).to(x.scalar_type());
    auto ctx = text_encoders::matmul(probs, vg);  // [B, KV, G, S, hd]
    ctx =
        ctx.reshape({b, heads_, s, head_dim_}).transpose(1, 2).reshape({b, s, heads_ * head_dim_});
    if (row_keep.defined()) ctx = ctx * row_keep;
    return o_proj_->forward(ctx);  // [B, S, d]
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

class LlamaMlp : public Module {
 public:
  explicit LlamaMlp(const LlamaEncoderConfig& c) : act_(c.hidden_act) {
    const bool bias = c.mlp_bias;
    gate_proj_ =
        child("gate_proj", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, bias));
    up_proj_ = child("up_proj", std::make_shared<Linear>(c.hidden_size, c.intermediate_size, bias));
    down_proj_ =
        child("down_proj", std::make_shared<Linear>(c.intermediate_size, c.hidden_size, bias));
  }
  at::Tensor forward(const at::Tensor& x) const {  // [B, S, d] -> [B, S, d]
    return down_proj_->forward(apply_hidden_act(gate_proj_->forward(x), act_) *
                               up_proj_->forward(x));
  }

 private:
  HiddenAct act_;
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

class LlamaDecoderLayer : public Module {
 public:
  explicit LlamaDecoderLayer(const LlamaEncoderConfig& c) {
    self_attn_ = child("self_attn", std::make_shared<LlamaAttention>(c));
    mlp_ = child("mlp", std::make_shared<LlamaMlp>(c));
    input_layernorm_ =
        child("input_layernorm", std::make_shared<LlamaRmsNorm>(c.hidden_size, c.rms_norm_eps));
    post_attention_layernorm_ = child(
        "post_attention_layernorm", std::make_shared<LlamaRmsNorm>(c.hidden_size, c.rms_norm_eps));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask, const at::Tensor& row_keep) const {
    auto h = x + self_attn_->forward(input_layernorm_->forward(x), cos, sin, mask, row_keep);
    return h + mlp_->forward(post_attention_layernorm_->forward(h));
  }

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMlp> mlp_;
  std::shared_ptr<LlamaRmsNorm> input_layernorm_, post_attention_layernorm_;
};

// ---- model --------------------------------------------------------------------------------------

LlamaEncoder::LlamaEncoder(const LlamaEncoderConfig& config)
    : config_(config), inv_freq_(llama_rope_inv_freq(config)) {
  const std::string base = config.causal_lm ? "model." : "";
  embed_tokens_ = &param(base + "embed_tokens.weight", {config.vocab_size, config.hidden_size});
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back(
        child(base + "layers." + std::to_string(i), std::make_shared<LlamaDecoderLayer>(config)));
  }
  norm_ =
      child(base + "norm", std::make_shared<LlamaRmsNorm>(config.hidden_size, config.rms_norm_eps));
}

void LlamaEncoder::load(const TensorSource& source, c10::ScalarType dtype,
                        const std::string& prefix, const LoadOptions& options) {
  LoadOptions opts = options;
  // The language-model head (tied or not) is not part of the encoder.
  if (config_.causal_lm) opts.ignore_unexpected_prefixes.push_back("lm_head.");
  if (config_.multimodal && config_.family == LlamaEncoderConfig::Family::kQwen2) {
    // Qwen2_5_VLForConditionalGeneration: transformers >= 4.52 saves the language model under
    // "model.language_model.", the original checkpoints under "model."; the vision tower
    // ("model.visual." / "visual.") and lm_head lie outside the prefix and are not read.
    for (const char* lm : {"model.language_model.", "model."}) {
      if (source.contains(prefix + lm + "embed_tokens.weight")) {
        Module::load(source, dtype, prefix + lm, opts);
        return;
      }
    }
    XF_THROW(source.describe(), ": no ", prefix, "model.language_model.embed_tokens.weight or ",
             prefix, "model.embed_tokens.weight: not a ", config_.architecture, " checkpoint");
  }
  if (config_.multimodal) {
    // Mistral3ForConditionalGeneration: transformers >= 4.52 saves the language model under
    // "model.language_model.", earlier releases (and the original checkpoints) under
    // "language_model.model."; the vision tower, projector and lm_head are outside it.
    for (const char* lm : {"model.language_model.", "language_model.model."}) {
      if (source.contains(prefix + lm + "embed_tokens.weight")) {
        Module::load(source, dtype, prefix + lm, opts);
        return;
      }
    }
    XF_THROW(source.describe(), ": no ", prefix, "model.language_model.embed_tokens.weight or ",
             prefix, "language_model.model.embed_tokens.weight: not a ", config_.architecture,
             " checkpoint");
  }
  Module::load(source, dtype, prefix, opts);
}

at::Tensor LlamaEncoder::checked_ids(const at::Tensor& input_ids,
                                     const at::Tensor& attention_mask) const {
  const std::string name = class_name();
  const auto& emb = embed_tokens_->value();
  XF_CHECK(emb.defined(), name, " used before load()");
  XF_CHECK(input_ids.defined(), name, ".forward: missing required input 'input_ids'");
  TensorMap inputs{{"input_ids", input_ids}};
  if (attention_mask.defined()) inputs["attention_mask"] = attention_mask;
  auto ids = checked_input_ids(name, inputs, config_.vocab_size);
  checked_attention_mask(name, inputs, ids);
  XF_CHECK(input_ids.device() == emb.device(), name, ".forward: input_ids is on ",
           input_ids.device(), " but the weights are on ", emb.device());
  XF_CHECK(!attention_mask.defined() || attention_mask.device() == emb.device(), name,
           ".forward: attention_mask is on ", attention_mask.device(), " but the weights are on ",
           emb.device());
  return ids;
}

void LlamaEncoder::run(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                       int64_t last_layer,
                       const std::function<void(int64_t, const at::Tensor&)>& visit) const {
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  XF_CHECK(last_layer >= 0 && last_layer <= num_layers, class_name(), ": hidden state ", last_layer,
           " out of range [0, ", num_layers, "]");
  auto ids = checked_ids(input_ids, attention_mask);
  const auto& emb = embed_tokens_->value();
  const int64_t b = ids.size(0), s = ids.size(1);
  const auto dtype = emb.scalar_type();
  auto x = emb.index_select(0, ids.reshape({-1})).view({b, s, config_.hidden_size});  // [B, S, d]
  visit(0, x);
  if (last_layer == 0) return;

  // RoPE: freqs = positions * inv_freq in float32 on the device (transformers' [hd/2, 1] @
  // [1, S] product), cat(freqs, freqs), cos / sin cast to the compute dtype. [1, 1, S, hd]
  auto f32 = x.options().dtype(at::kFloat);
  auto positions = at::arange(s, ids.options()).to(at::kFloat);
  auto freqs = positions.unsqueeze(-1) * inv_freq_.to(f32.device()).unsqueeze(0);  // [S, hd/2]
  auto angles = at::cat({freqs, freqs}, -1).view({1, 1, s, config_.head_dim});
  auto cos = angles.cos().to(dtype);
  auto sin = angles.sin().to(dtype);

  // Allowed keys: j <= i, within the sliding window, not padding. Rows with no allowed key (the
  // leading pads of a left-padded row) attend to every key (kAttendAll: _unmask_unattended), or
  // give a zero attention output (kZero: SDPA with torch >= 2.5). Additive finfo(dtype).min mask
  // [B|1, 1, S, S].
  auto pos = at::arange(s, ids.options());
  auto query = pos.view({s, 1}), key = pos.view({1, s});
  auto allowed = key.le(query);  // [S, S]
  at::Tensor row_keep;           // [B, S, 1] under kZero when some row has no allowed key
  if (config_.sliding_window) {
    allowed = allowed.logical_and(key.gt(query - *config_.sliding_window));
  }
  allowed = allowed.view({1, 1, s, s});
  if (attention_mask.defined()) {
    allowed = allowed.logical_and(attention_mask.ne(0).view({b, 1, 1, s}));   // [B, 1, S, S]
    const auto unattended = allowed.any(-1, /*keepdim=*/true).logical_not();  // [B, 1, S, 1]
    allowed = allowed.logical_or(unattended);
    if (config_.fully_masked_rows == LlamaEncoderConfig::FullyMaskedRows::kZero &&
        unattended.any().item<bool>()) {
      row_keep = unattended.logical_not().to(dtype).view({b, s, 1});
    }
  }
  auto mask = at::zeros(allowed.sizes(), x.options())
                  .masked_fill(allowed.logical_not(), dtype_lowest(dtype));

  for (int64_t i = 0; i < last_layer; ++i) {
    x = layers_[i]->forward(x, cos, sin, mask, row_keep);
    visit(i + 1, i + 1 == num_layers ? norm_->forward(x) : x);
  }
}

LlamaEncoder::Output LlamaEncoder::forward(const at::Tensor& input_ids,
                                           const at::Tensor& attention_mask) const {
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  std::vector<at::Tensor> states;
  run(input_ids, attention_mask, num_layers,
      [&](int64_t, const at::Tensor& h) { states.push_back(h); });
  return {states.back(), at::stack(states)};
}

std::vector<at::Tensor> LlamaEncoder::forward_hidden_states(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const std::vector<int64_t>& layers) const {
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  XF_CHECK(!layers.empty(), class_name(), ".forward_hidden_states: no hidden state asked for");
  std::vector<int64_t> index;
  for (int64_t l : layers) {
    XF_CHECK(l >= -(num_layers + 1) && l <= num_layers, class_name(),
             ".forward_hidden_states: hidden state ", l, " out of range [", -(num_layers + 1), ", ",
             num_layers, "] (", num_layers, " layers: hidden_states has ", num_layers + 1,
             " entries)");
    index.push_back(l < 0 ? l + num_layers + 1 : l);
  }
  const int64_t deepest = *std::max_element(index.begin(), index.end());
  std::vector<at::Tensor> out(index.size());
  run(input_ids, attention_mask, deepest, [&](int64_t i, const at::Tensor& h) {
    for (size_t k = 0; k < index.size(); ++k) {
      if (index[k] == i) out[k] = h;
    }
  });
  return out;
}

uint64_t LlamaEncoder::activation_bytes(const ActivationQuery& q) const {
  const auto s = static_cast<uint64_t>(q.tokens);
  const auto b = static_cast<uint64_t>(std::max<int64_t>(1, q.batch));
  const auto heads = static_cast<uint64_t>(config_.num_attention_heads);
  const auto bytes = static_cast<uint64_t>(q.bytes);
  // The additive mask [B, 1, S, S] and the boolean one it is made from.
  const uint64_t mask = b * s * s * (bytes + 2);
  // Eager attention, as transformers computes it: at the softmax the masked scores [B, H, S, S],
  // their fp32 copy and softmax (half types), or the scores and their division and sum (fp32).
  const uint64_t attention = b * heads * s * s * (bytes == 4 ? 8 : bytes + 8);
  // The MLP: gate, up, the activation and the product, [B, S, intermediate] each.
  const uint64_t mlp = 4 * b * s * static_cast<uint64_t>(config_.intermediate_size) * bytes;
  return mask + std::max(attention, mlp);
}

TensorMap LlamaEncoder::call(const std::string& method, const TensorMap& inputs) {
  const std::string name = class_name();
  check_call(name, method, inputs, {"input_ids"}, {"attention_mask"});
  XF_CONTEXT(name, ".forward");
  c10::InferenceMode guard;
  auto it = inputs.find("attention_mask");
  auto out = forward(inputs.at("input_ids"), it == inputs.end() ? at::Tensor() : it->second);
  return {{"last_hidden_state", out.last_hidden_state}, {"hidden_states", out.hidden_states}};
}

}  // namespace xfuser::models::text_encoders
