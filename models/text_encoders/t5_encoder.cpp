#include "models/text_encoders/t5_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include "backends/attention.h"
#include "backends/error.h"
#include "models/weights/component_folder.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models::text_encoders {
namespace {

constexpr const char* kSharedName = "shared.weight";
constexpr const char* kEmbedTokensName = "encoder.embed_tokens.weight";

// Presents a checkpoint's tied input embedding under one name, shared.weight, whichever of
// shared.weight / encoder.embed_tokens.weight it holds (encoder.embed_tokens.weight when both:
// transformers loads it last into the one tied parameter).
class TiedEmbeddingSource : public TensorSource {
 public:
  TiedEmbeddingSource(const TensorSource& base, std::string prefix)
      : base_(base),
        shared_(prefix + kSharedName),
        embed_(prefix + kEmbedTokensName),
        resolved_(base.contains(embed_) ? embed_ : shared_) {}

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (auto& n : base_.names()) {
      if (n != embed_ && n != shared_) out.push_back(n);
    }
    if (base_.contains(resolved_)) out.push_back(shared_);
    std::sort(out.begin(), out.end());
    return out;
  }
  bool contains(const std::string& name) const override {
    if (name == embed_) return false;
    return base_.contains(map(name));
  }
  TensorInfo info(const std::string& name) const override { return base_.info(checked(name)); }
  at::Tensor get(const std::string& name) const override { return base_.get(checked(name)); }
  at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                       int64_t length) const override {
    return base_.get_slice(checked(name), dim, start, length);
  }
  std::string describe() const override { return base_.describe(); }

 private:
  std::string map(const std::string& name) const { return name == shared_ ? resolved_ : name; }
  std::string checked(const std::string& name) const {
    XF_CHECK(name != embed_, "tensor ", name, " is read as ", shared_, " (tied embedding)");
    return map(name);
  }

  const TensorSource& base_;
  std::string shared_, embed_, resolved_;
};

}  // namespace

T5EncoderConfig T5EncoderConfig::from_json(const nlohmann::json& j, const std::string& path,
                                           bool umt5) {
  XF_CHECK(j.is_object(), "config ", path, " is not a JSON object");
  T5EncoderConfig c;
  c.umt5 = umt5;
  c.vocab_size = cfg<int64_t>(j, "vocab_size", umt5 ? 250112 : c.vocab_size, path);
  c.d_model = cfg<int64_t>(j, "d_model", c.d_model, path);
  c.d_kv = cfg<int64_t>(j, "d_kv", c.d_kv, path);
  c.d_ff = cfg<int64_t>(j, "d_ff", umt5 ? 1024 : c.d_ff, path);
  c.num_layers = cfg<int64_t>(j, "num_layers", umt5 ? 8 : c.num_layers, path);
  c.num_heads = cfg<int64_t>(j, "num_heads", umt5 ? 6 : c.num_heads, path);
  c.relative_attention_num_buckets =
      cfg<int64_t>(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, path);
  c.relative_attention_max_distance =
      cfg<int64_t>(j, "relative_attention_max_distance", c.relative_attention_max_distance, path);
  c.layer_norm_epsilon = cfg<double>(j, "layer_norm_epsilon", c.layer_norm_epsilon, path);
  // A decoder's layers (causal self-attention, one-directional buckets, cross-attention) are not
  // an encoder's: transformers' encoder classes would build them from this key.
  XF_CHECK(!cfg<bool>(j, "is_decoder", false, path), "config ", path,
           ": is_decoder = true is not supported (a T5 / UMT5 encoder has is_decoder false)");

  const std::string proj =
      cfg<std::string>(j, "feed_forward_proj", umt5 ? "gated-gelu" : "relu", path);
  std::string act = proj;
  bool gated = false;
  if (proj.rfind("gated-", 0) == 0) {
    gated = true;
    act = proj.substr(6);
  }
  XF_CHECK(!act.empty() && act.find('-') == std::string::npos, "config ", path,
           ": feed_forward_proj '", proj, "' is not of the form ACT or gated-ACT");
  if (proj == "gated-gelu") act = "gelu_new";
  act = cfg<std::string>(j, "dense_act_fn", act, path);
  gated = cfg<bool>(j, "is_gated_act", gated, path);
  c.is_gated_act = gated;
  c.dense_act_fn = hidden_act_from_name(act, path + " \"dense_act_fn\"/\"feed_forward_proj\"");

  XF_CHECK(c.vocab_size > 0 && c.d_model > 0 && c.d_kv > 0 && c.d_ff > 0 && c.num_heads > 0,
           "config ", path, ": sizes must be positive");
  XF_CHECK(c.num_layers >= 1, "config ", path, ": num_layers must be >= 1, got ", c.num_layers);
  XF_CHECK(c.relative_attention_num_buckets >= 4 && c.relative_attention_max_distance > 0,
           "config ", path, ": relative_attention_num_buckets must be >= 4 and ",
           "relative_attention_max_distance positive");
  return c;
}

at::Tensor t5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                        int64_t num_buckets, int64_t max_distance) {
  auto opts = at::TensorOptions().dtype(at::kLong);
  auto context = at::arange(query_length, opts).view({-1, 1});
  auto memory = at::arange(key_length, opts).view({1, -1});
  auto relative = memory - context;  // [Q, K]: key - query

  // Bidirectional: half the buckets for keys after the query.
  const int64_t half = num_buckets / 2;
  auto buckets = relative.gt(0).to(at::kLong) * half;
  relative = relative.abs();
  // Half of those exact, the rest logarithmic up to max_distance; the float ops follow
  // transformers (fp32 log, then truncation) so bucket edges agree.
  const int64_t max_exact = half / 2;
  auto is_small = relative.lt(max_exact);
  auto large = at::log(relative.to(at::kFloat) / static_cast<double>(max_exact)) /
               std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
               static_cast<double>(half - max_exact);
  auto if_large = at::clamp_max(large.to(at::kLong) + max_exact, half - 1);
  return buckets + at::where(is_small, relative, if_large);  // [Q, K]
}

// T5LayerNorm: weight * x / sqrt(mean(x^2) + eps), variance in fp32, no mean, no bias.
class T5RmsNorm : public Module {
 public:
  T5RmsNorm(int64_t dim, double eps) : eps_(eps) { weight_ = &param("weight", {dim}); }
  at::Tensor forward(const at::Tensor& x) const {
    const auto& w = weight_->value();
    auto variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
    auto y = x * at::rsqrt(variance + eps_);  // promotes half inputs to fp32
    if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) {
      y = y.to(w.scalar_type());
    }
    return w * y;
  }

 private:
  double eps_;
  ParamSlot* weight_;
};

class T5Attention : public Module {
 public:
  T5Attention(const T5EncoderConfig& c, bool has_relative_bias)
      : heads_(c.num_heads), d_kv_(c.d_kv), config_(c) {
    const int64_t inner = c.num_heads * c.d_kv;
    q_ = child("q", std::make_shared<Linear>(c.d_model, inner, false));
    k_ = child("k", std::make_shared<Linear>(c.d_model, inner, false));
    v_ = child("v", std::make_shared<Linear>(c.d_model, inner, false));
    o_ = child("o", std::make_shared<Linear>(inner, c.d_model, false));
    if (has_relative_bias) {
      relative_attention_bias_ =
          &param("relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads});
    }
  }

  bool has_relative_bias() const { return relative_attention_bias_ != nullptr; }

  // [1, H, S, S] in the bias table's dtype.
  at::Tensor compute_bias(int64_t s) const {
    auto buckets = t5_relative_position_buckets(s, s, config_.relative_attention_num_buckets,
                                                config_.relative_attention_max_distance);
    // The buckets are computed on the host (a small integer table), then moved to the weights.
    const auto& table = relative_attention_bias_->value();
    auto values = table.index_select(0, buckets.reshape({-1}).to(table.device()));
    return values.view({s, s, heads_}).permute({2, 0, 1}).unsqueeze(0);
  }

  // x [B, S, d]; position_bias broadcastable to [B, H, S, S] (relative bias + mask).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias) const {
    const int64_t b = x.size(0), s = x.size(1);
    auto heads = [&](const at::Tensor& t) {  // [B, S, H*dk] -> [B, S, H, dk]
      return t.view({b, s, heads_, d_kv_});
    };
    // The one attention op (backends/attention.h). No 1/sqrt(dk) scaling (folded into the
    // initialisation); the bias and softmax in fp32 on the CPU.
    backends::AttentionOptions opts;
    opts.scale = 1.0;
    opts.bias = position_bias;
    auto ctx = backends::attention(heads(q_->forward(x)), heads(k_->forward(x)),
                                   heads(v_->forward(x)), opts)
                   .out;                                      // [B, S, H, dk]
    return o_->forward(ctx.reshape({b, s, heads_ * d_kv_}));  // [B, S, d]
  }

 private:
  int64_t heads_, d_kv_;
  T5EncoderConfig config_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
  ParamSlot* relative_attention_bias_ = nullptr;
};

class T5DenseReluDense : public Module {
 public:
  explicit T5DenseReluDense(const T5EncoderConfig& c)
      : gated_(c.is_gated_act), act_(c.dense_act_fn) {
    if (gated_) {
      wi_0_ = child("wi_0", std::make_shared<Linear>(c.d_model, c.d_ff, false));
      wi_1_ = child("wi_1", std::make_shared<Linear>(c.d_model, c.d_ff, false));
    } else {
      wi_ = child("wi", std::make_shared<Linear>(c.d_model, c.d_ff, false));
    }
    wo_ = child("wo", std::make_shared<Linear>(c.d_ff, c.d_model, false));
  }

  ParamSlot& wo_weight() { return *wo_->named_parameters().at(0).second; }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = gated_ ? apply_hidden_act(wi_0_->forward(x), act_) * wi_1_->forward(x)
                          : apply_hidden_act(wi_->forward(x), act_);  // [B, S, d_ff]
    // wo runs in its own dtype (fp32 when kept so for an fp16 model); an fp16 wo from a plain
    // load is computed in fp32 as transformers' fp16 model would.
    at::Tensor w = wo_->weight();
    if (w.scalar_type() == at::kHalf) w = w.to(at::kFloat);
    if (h.scalar_type() != w.scalar_type()) h = h.to(w.scalar_type());
    return at::linear(h, w);  // [B, S, d]
  }

 private:
  bool gated_;
  HiddenAct act_;
  std::shared_ptr<Linear> wi_0_, wi_1_, wi_, wo_;
};

// transformers' fp16 guard: clamp to the finite fp16 range (1000 below it when an inf appeared).
at::Tensor clamp_fp16(const at::Tensor& h) {
  if (h.scalar_type() != at::kHalf) return h;
  const double max = static_cast<double>(std::numeric_limits<c10::Half>::max());
  const double clamp_value = at::isinf(h).any().item<bool>() ? max - 1000.0 : max;
  if (h.device().is_cpu()) {  // no float16 clamp kernel on the CPU; exact through float32
    return at::clamp(h.to(at::kFloat), -clamp_value, clamp_value).to(at::kHalf);
  }
  return at::clamp(h, -clamp_value, clamp_value);
}

class T5Block : public Module {
 public:
  T5Block(const T5EncoderConfig& c, bool has_relative_bias) {
    attention_ =
        child("layer.0.SelfAttention", std::make_shared<T5Attention>(c, has_relative_bias));
    norm0_ =
        child("layer.0.layer_norm", std::make_shared<T5RmsNorm>(c.d_model, c.layer_norm_epsilon));
    ff_ = child("layer.1.DenseReluDense", std::make_shared<T5DenseReluDense>(c));
    norm1_ =
        child("layer.1.layer_norm", std::make_shared<T5RmsNorm>(c.d_model, c.layer_norm_epsilon));
  }

  const T5Attention& attention() const { return *attention_; }
  T5DenseReluDense& ff() { return *ff_; }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias) const {
    auto h = clamp_fp16(x + attention_->forward(norm0_->forward(x), position_bias));
    return clamp_fp16(h + ff_->forward(norm1_->forward(h)));
  }

 private:
  std::shared_ptr<T5Attention> attention_;
  std::shared_ptr<T5RmsNorm> norm0_, norm1_;
  std::shared_ptr<T5DenseReluDense> ff_;
};

T5Encoder::T5Encoder(const T5EncoderConfig& config) : config_(config) {
  shared_ = &param(kSharedName, {config.vocab_size, config.d_model});
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const bool has_bias = config.umt5 || i == 0;
    blocks_.push_back(
        child("encoder.block." + std::to_string(i), std::make_shared<T5Block>(config, has_bias)));
  }
  final_layer_norm_ = child("encoder.final_layer_norm",
                            std::make_shared<T5RmsNorm>(config.d_model, config.layer_norm_epsilon));
}

std::string T5Encoder::class_name() const {
  return config_.umt5 ? "UMT5EncoderModel" : "T5EncoderModel";
}

void T5Encoder::load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix,
                     const LoadOptions& options) {
  for (auto& block : blocks_) {
    auto& wo = block->ff().wo_weight();
    wo.dtype = dtype == at::kHalf ? std::optional<c10::ScalarType>(at::kFloat) : std::nullopt;
  }
  LoadOptions opts = options;
  opts.ignore_unexpected_prefixes.push_back("decoder.");
  opts.ignore_unexpected_prefixes.push_back("lm_head.");
  TiedEmbeddingSource tied(source, prefix);
  Module::load(tied, dtype, prefix, opts);
}

at::Tensor T5Encoder::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) const {
  const auto& emb = shared_->value();
  XF_CHECK(emb.defined(), class_name(), " used before load()");
  const int64_t b = input_ids.size(0), s = input_ids.size(1);
  const auto dtype = emb.scalar_type();
  auto x = emb.index_select(0, input_ids.reshape({-1})).view({b, s, config_.d_model});

  // Extended mask (1 - m) * finfo(model dtype).min, [B, 1, 1, S]; zeros without a mask.
  at::Tensor mask;
  if (attention_mask.defined()) {
    const double lowest = dtype == at::kHalf       ? -65504.0
                          : dtype == at::kBFloat16 ? -3.3895313892515355e38
                          : dtype == at::kDouble   ? std::numeric_limits<double>::lowest()
                                                   : std::numeric_limits<float>::lowest();
    mask = ((1.0 - attention_mask.to(dtype)) * lowest).view({b, 1, 1, s});
  }

  at::Tensor position_bias;  // T5: computed by block 0, reused by every block
  for (auto& block : blocks_) {
    const auto& attn = block->attention();
    if (attn.has_relative_bias()) {
      position_bias = attn.compute_bias(s);  // [1, H, S, S]
      if (mask.defined()) position_bias = position_bias + mask;
    }
    x = block->forward(x, position_bias);
  }
  return final_layer_norm_->forward(x);  // [B, S, d]
}

uint64_t T5Encoder::activation_bytes(const ActivationQuery& q) const {
  const auto s2 = static_cast<uint64_t>(q.tokens) * static_cast<uint64_t>(q.tokens);
  const auto b = static_cast<uint64_t>(std::max<int64_t>(1, q.batch));
  const auto heads = static_cast<uint64_t>(config_.num_heads);
  const auto bytes = static_cast<uint64_t>(q.bytes);
  // The bucket table: [S, S] int64 tensors made on the host (~45 bytes per pair at the peak of
  // t5_relative_position_buckets); on a GPU only the finished table is copied there.
  const uint64_t buckets = (q.cpu ? 45 : 8) * s2;
  // The bias [1, H, S, S] in the weights' dtype (with a mask: [B, H, S, S]); UMT5 holds the
  // previous block's bias while the next block makes its buckets.
  const uint64_t bias = heads * s2 * bytes * b;
  // Attention with a bias (the chunked kernel on the CPU): fp32 scores of up to 2^24 elements,
  // and k / v in fp32.
  const uint64_t scores =
      q.cpu ? std::min<uint64_t>(uint64_t{1} << 24, b * heads * s2) * 4 +
                  2 * b * heads * static_cast<uint64_t>(q.tokens * config_.d_kv) * 4
            : 0;
  // The feed-forward's [B, S, d_ff] activations (two with a gated activation, and their product).
  const uint64_t ffn =
      b * static_cast<uint64_t>(q.tokens * config_.d_ff) * bytes * (config_.is_gated_act ? 3 : 1);
  return std::max({config_.umt5 ? buckets + bias : buckets, bias + scores, bias + ffn});
}

TensorMap T5Encoder::call(const std::string& method, const TensorMap& inputs) {
  const std::string name = class_name();
  check_call(name, method, inputs, {"input_ids"}, {"attention_mask"});
  XF_CONTEXT(name, ".forward");
  c10::InferenceMode guard;
  auto ids = checked_input_ids(name, inputs, config_.vocab_size);
  auto mask = checked_attention_mask(name, inputs, ids);
  return {{"last_hidden_state", forward(ids, mask)}};
}

}  // namespace xfuser::models::text_encoders
