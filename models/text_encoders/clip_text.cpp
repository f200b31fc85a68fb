#include "models/text_encoders/clip_text.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/encoder_memory.h"
#include "models/text_encoders/clip_encoder.h"
#include "models/weights/component_folder.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models::text_encoders {

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& config, const std::string& path) {
  XF_CHECK(config.is_object(), "config ", path, " is not a JSON object");
  // A full CLIPConfig keeps the text tower's settings under text_config.
  const nlohmann::json& j = (config.contains("text_config") && config["text_config"].is_object())
                                ? config["text_config"]
                                : config;
  ClipTextConfig c;
  c.vocab_size = cfg<int64_t>(j, "vocab_size", c.vocab_size, path);
  c.hidden_size = cfg<int64_t>(j, "hidden_size", c.hidden_size, path);
  c.intermediate_size = cfg<int64_t>(j, "intermediate_size", c.intermediate_size, path);
  c.projection_dim = cfg<int64_t>(j, "projection_dim", c.projection_dim, path);
  c.num_hidden_layers = cfg<int64_t>(j, "num_hidden_layers", c.num_hidden_layers, path);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, path);
  c.max_position_embeddings =
      cfg<int64_t>(j, "max_position_embeddings", c.max_position_embeddings, path);
  c.layer_norm_eps = cfg<double>(j, "layer_norm_eps", c.layer_norm_eps, path);
  c.hidden_act = hidden_act_from_name(cfg<std::string>(j, "hidden_act", "quick_gelu", path),
                                      path + " \"hidden_act\"");
  c.eos_token_id = cfg<int64_t>(j, "eos_token_id", c.eos_token_id, path);
  XF_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
               c.projection_dim > 0 && c.max_position_embeddings > 0,
           "config ", path, ": sizes must be positive");
  XF_CHECK(c.num_hidden_layers >= 1, "config ", path, ": num_hidden_layers must be >= 1, got ",
           c.num_hidden_layers);
  XF_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, "config ", path,
           ": hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
           c.num_attention_heads);
  return c;
}

ClipTextTransformer::ClipTextTransformer(const ClipTextConfig& config) : config_(config) {
  token_embedding_ =
      &param("embeddings.token_embedding.weight", {config.vocab_size, config.hidden_size});
  position_embedding_ = &param("embeddings.position_embedding.weight",
                               {config.max_position_embeddings, config.hidden_size});
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back(
        child("encoder.layers." + std::to_string(i),
              std::make_shared<ClipEncoderLayer>(config.hidden_size, config.intermediate_size,
                                                 config.num_attention_heads, config.layer_norm_eps,
                                                 config.hidden_act)));
  }
  final_layer_norm_ = child("final_layer_norm",
                            std::make_shared<LayerNorm>(config.hidden_size, config.layer_norm_eps));
}

ClipTextTransformer::Output ClipTextTransformer::forward(const at::Tensor& input_ids,
                                                         const at::Tensor& attention_mask) const {
  XF_CHECK(token_embedding_->loaded(), "CLIP text model used before load()");
  const int64_t b = input_ids.size(0), s = input_ids.size(1);
  XF_CHECK(s <= config_.max_position_embeddings, "CLIP text model: sequence length ", s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings);
  const auto& tok = token_embedding_->value();
  auto x = tok.index_select(0, input_ids.reshape({-1})).view({b, s, config_.hidden_size}) +
           position_embedding_->value().narrow(0, 0, s);  // [B, S, d]

  // Additive fp32 bias [B or 1, 1, S, S]: dtype-min above the diagonal, plus dtype-min at padded
  // keys (transformers adds both, so a key that is padded and in the future sums to -inf).
  const float lowest = std::numeric_limits<float>::lowest();
  auto opts = x.options().dtype(at::kFloat);  // on the run's device
  auto bias = at::full({s, s}, lowest, opts).triu(1).view({1, 1, s, s});
  if (attention_mask.defined()) {
    auto keep = attention_mask.to(at::kFloat).eq(1.0);  // [B, S]
    auto pad = at::where(keep, at::zeros({}, opts), at::full({}, lowest, opts));
    bias = bias + pad.view({b, 1, 1, s});
  }

  at::Tensor penultimate = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i + 1 == layers_.size()) penultimate = x;  // hidden_states[-2]
    x = layers_[i]->forward(x, bias);
  }
  auto last = final_layer_norm_->forward(x);  // [B, S, d]

  at::Tensor eos_pos;  // [B]
  if (config_.eos_token_id == 2) {
    // Legacy configs: the EOS token has the highest id in CLIP's vocabulary.
    eos_pos = input_ids.to(at::kInt).argmax(-1);
  } else {
    eos_pos = input_ids.eq(config_.eos_token_id).to(at::kInt).argmax(-1);
  }
  auto rows = at::arange(b, input_ids.options().dtype(at::kLong));
  auto flat = rows * s + eos_pos.to(at::kLong);
  auto pooled = last.reshape({b * s, config_.hidden_size}).index_select(0, flat);  // [B, d]
  return {last, pooled, penultimate};
}

ClipTextModel::ClipTextModel(const ClipTextConfig& config, bool with_projection)
    : config_(config), with_projection_(with_projection) {
  text_model_ = child("text_model", std::make_shared<ClipTextTransformer>(config));
  if (with_projection) {
    text_projection_ =
        child("text_projection",
              std::make_shared<Linear>(config.hidden_size, config.projection_dim, false));
  }
}

std::string ClipTextModel::class_name() const {
  return with_projection_ ? "CLIPTextModelWithProjection" : "CLIPTextModel";
}

void ClipTextModel::load(const TensorSource& source, c10::ScalarType dtype,
                         const std::string& prefix, const LoadOptions& options) {
  LoadOptions opts = options;
  // A non-persistent buffer that checkpoints saved before transformers 4.31 still hold.
  opts.ignore_unexpected_prefixes.push_back("text_model.embeddings.position_ids");
  // transformers 5 saves CLIPTextModel without its "text_model." prefix (the projection model
  // keeps it): read such a file as if it had the prefix.
  if (!with_projection_ && !has_prefix(source, prefix + "text_model.") &&
      source.contains(prefix + "embeddings.token_embedding.weight")) {
    Module::load(InsertedPrefixSource(source, prefix, "text_model."), dtype, prefix, opts);
    return;
  }
  Module::load(source, dtype, prefix, opts);
}

uint64_t ClipTextModel::activation_bytes(const ActivationQuery& q) const {
  // 77 tokens: the causal mask and fp32 scores of every head.
  return encoder_layer_peak_bytes(q.batch, q.tokens,
                                  static_cast<uint64_t>(config_.num_attention_heads) * 4 * 2,
                                  config_.intermediate_size, config_.hidden_size, q.bytes);
}

TensorMap ClipTextModel::call(const std::string& method, const TensorMap& inputs) {
  const std::string name = class_name();
  check_call(name, method, inputs, {"input_ids"}, {"attention_mask"});
  XF_CONTEXT(name, ".forward");
  c10::InferenceMode guard;
  auto ids = checked_input_ids(name, inputs, config_.vocab_size);
  auto mask = checked_attention_mask(name, inputs, ids);
  auto out = text_model_->forward(ids, mask);
  TensorMap result{{"last_hidden_state", out.last_hidden_state},
                   {"hidden_states_penultimate", out.penultimate}};
  if (with_projection_) {
    result["text_embeds"] = text_projection_->forward(out.pooled);  // [B, proj]
  } else {
    result["pooler_output"] = out.pooled;
  }
  return result;
}

}  // namespace xfuser::models::text_encoders
