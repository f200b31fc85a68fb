#include "models/image/clip_vision.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/encoder_memory.h"
#include "models/weights/component_folder.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models::image {

using text_encoders::ClipEncoderLayer;

ClipVisionConfig ClipVisionConfig::from_json(const nlohmann::json& config,
                                             const std::string& path) {
  XF_CHECK(config.is_object(), "config ", path, " is not a JSON object");
  // A full CLIPConfig keeps the vision tower's settings under vision_config.
  const nlohmann::json& j =
      (config.contains("vision_config") && config["vision_config"].is_object())
          ? config["vision_config"]
          : config;
  ClipVisionConfig c;
  c.hidden_size = cfg<int64_t>(j, "hidden_size", c.hidden_size, path);
  c.intermediate_size = cfg<int64_t>(j, "intermediate_size", c.intermediate_size, path);
  c.projection_dim = cfg<int64_t>(j, "projection_dim", c.projection_dim, path);
  c.num_hidden_layers = cfg<int64_t>(j, "num_hidden_layers", c.num_hidden_layers, path);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, path);
  c.num_channels = cfg<int64_t>(j, "num_channels", c.num_channels, path);
  c.image_size = cfg<int64_t>(j, "image_size", c.image_size, path);
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, path);
  c.layer_norm_eps = cfg<double>(j, "layer_norm_eps", c.layer_norm_eps, path);
  c.hidden_act = text_encoders::hidden_act_from_name(
      cfg<std::string>(j, "hidden_act", "quick_gelu", path), path + " \"hidden_act\"");
  XF_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.projection_dim > 0 &&
               c.num_channels > 0 && c.image_size > 0 && c.patch_size > 0,
           "config ", path, ": sizes must be positive");
  XF_CHECK(c.patch_size <= c.image_size, "config ", path, ": patch_size ", c.patch_size,
           " exceeds image_size ", c.image_size);
  XF_CHECK(c.num_hidden_layers >= 1, "config ", path, ": num_hidden_layers must be >= 1, got ",
           c.num_hidden_layers);
  XF_CHECK(c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0, "config ", path,
           ": hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
           c.num_attention_heads);
  return c;
}

ClipVisionTransformer::ClipVisionTransformer(const ClipVisionConfig& config) : config_(config) {
  const int64_t d = config.hidden_size;
  class_embedding_ = &param("embeddings.class_embedding", {d});
  patch_embedding_ = &param("embeddings.patch_embedding.weight",
                            {d, config.num_channels, config.patch_size, config.patch_size});
  position_embedding_ =
      &param("embeddings.position_embedding.weight", {config.num_patches() + 1, d});
  pre_layrnorm_ = child("pre_layrnorm", std::make_shared<LayerNorm>(d, config.layer_norm_eps));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back(child(
        "encoder.layers." + std::to_string(i),
        std::make_shared<ClipEncoderLayer>(d, config.intermediate_size, config.num_attention_heads,
                                           config.layer_norm_eps, config.hidden_act)));
  }
  post_layernorm_ = child("post_layernorm", std::make_shared<LayerNorm>(d, config.layer_norm_eps));
}

ClipVisionTransformer::Output ClipVisionTransformer::forward(const at::Tensor& pixel_values) const {
  XF_CHECK(patch_embedding_->loaded(), "CLIP vision model used before load()");
  const at::Tensor& w = patch_embedding_->value();  // [d, C, p, p]
  const int64_t b = pixel_values.size(0), d = config_.hidden_size;
  at::Tensor x = pixel_values.to(w.scalar_type());
  at::Tensor patches;
  if (x.is_cpu() && x.scalar_type() == at::kHalf) {
    // libtorch's CPU conv has no float16 kernel: compute in float32 and round back.
    patches = at::conv2d(x.to(at::kFloat), w.to(at::kFloat), {}, config_.patch_size).to(at::kHalf);
  } else {
    patches = at::conv2d(x, w, {}, config_.patch_size);  // [B, d, g, g]
  }
  patches = patches.flatten(2).transpose(1, 2);  // [B, N, d]
  auto cls = class_embedding_->value().view({1, 1, d}).expand({b, 1, d}).to(patches.scalar_type());
  auto h = at::cat({cls, patches}, 1) + position_embedding_->value();  // [B, 1 + N, d]
  h = pre_layrnorm_->forward(h);

  at::Tensor penultimate = h;
  const at::Tensor no_mask;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i + 1 == layers_.size()) penultimate = h;  // hidden_states[-2]
    h = layers_[i]->forward(h, no_mask);
  }
  auto pooled = post_layernorm_->forward(h.select(1, 0));  // [B, d]
  return {h, pooled, penultimate};
}

ClipVisionModel::ClipVisionModel(const ClipVisionConfig& config, bool with_projection)
    : config_(config), with_projection_(with_projection) {
  vision_model_ = child("vision_model", std::make_shared<ClipVisionTransformer>(config));
  if (with_projection) {
    visual_projection_ =
        child("visual_projection",
              std::make_shared<Linear>(config.hidden_size, config.projection_dim, false));
  }
}

std::string ClipVisionModel::class_name() const {
  return with_projection_ ? "CLIPVisionModelWithProjection" : "CLIPVisionModel";
}

void ClipVisionModel::load(const TensorSource& source, c10::ScalarType dtype,
                           const std::string& prefix, const LoadOptions& options) {
  LoadOptions opts = options;
  opts.ignore_unexpected_prefixes.push_back("vision_model.embeddings.position_ids");
  // transformers 5 saves CLIPVisionModel without its "vision_model." prefix (the projection
  // model keeps it): read such a file as if it had the prefix.
  if (!with_projection_ && !has_prefix(source, prefix + "vision_model.") &&
      source.contains(prefix + "embeddings.patch_embedding.weight")) {
    Module::load(InsertedPrefixSource(source, prefix, "vision_model."), dtype, prefix, opts);
    return;
  }
  Module::load(source, dtype, prefix, opts);
}

uint64_t ClipVisionModel::activation_bytes(const ActivationQuery& q) const {
  // One picture's patch + class tokens; the blocked kernel holds ~one head's fp32 scores.
  return encoder_layer_peak_bytes(q.batch, q.tokens > 0 ? q.tokens : config_.num_patches() + 1,
                                  4 * 3, config_.intermediate_size, config_.hidden_size, q.bytes);
}

TensorMap ClipVisionModel::call(const std::string& method, const TensorMap& inputs) {
  const std::string name = class_name();
  text_encoders::check_call(name, method, inputs, {"pixel_values"}, {});
  XF_CONTEXT(name, ".forward");
  c10::InferenceMode guard;
  const at::Tensor& px = inputs.at("pixel_values");
  XF_CHECK(px.defined() && px.dim() == 4 && px.size(0) >= 1 && px.size(1) == config_.num_channels &&
               px.size(2) == config_.image_size && px.size(3) == config_.image_size,
           name, ": pixel_values must be [B, ", config_.num_channels, ", ", config_.image_size,
           ", ", config_.image_size, "] (config image_size ", config_.image_size, "), got ",
           px.defined() ? px.sizes() : at::IntArrayRef{});
  XF_CHECK(at::isFloatingType(px.scalar_type()), name,
           ": pixel_values must be a floating-point tensor, got ", px.scalar_type());
  const auto& weights = named_parameters().front().second->value();
  XF_CHECK(!weights.defined() || weights.device() == px.device(), name, ": pixel_values are on ",
           px.device(), " but the weights on ", weights.device());
  auto out = vision_model_->forward(px);
  TensorMap result{{"last_hidden_state", out.last_hidden_state},
                   {"hidden_states_penultimate", out.penultimate}};
  if (with_projection_) {
    result["image_embeds"] = visual_projection_->forward(out.pooled);  // [B, proj]
  } else {
    result["pooler_output"] = out.pooled;
  }
  return result;
}

}  // namespace xfuser::models::image
