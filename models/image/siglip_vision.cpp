#include "models/image/siglip_vision.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/encoder_memory.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::image {

using text_encoders::ClipEncoderLayer;

SiglipVisionConfig SiglipVisionConfig::from_json(const nlohmann::json& config,
                                                 const std::string& path) {
  XF_CHECK(config.is_object(), "config ", path, " is not a JSON object");
  // A full SiglipConfig keeps the vision tower's settings under vision_config.
  const nlohmann::json& j =
      (config.contains("vision_config") && config["vision_config"].is_object())
          ? config["vision_config"]
          : config;
  SiglipVisionConfig c;
  c.hidden_size = cfg<int64_t>(j, "hidden_size", c.hidden_size, path);
  c.intermediate_size = cfg<int64_t>(j, "intermediate_size", c.intermediate_size, path);
  c.num_hidden_layers = cfg<int64_t>(j, "num_hidden_layers", c.num_hidden_layers, path);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, path);
  c.num_channels = cfg<int64_t>(j, "num_channels", c.num_channels, path);
  c.image_size = cfg<int64_t>(j, "image_size", c.image_size, path);
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, path);
  c.layer_norm_eps = cfg<double>(j, "layer_norm_eps", c.layer_norm_eps, path);
  c.hidden_act = text_encoders::hidden_act_from_name(
      cfg<std::string>(j, "hidden_act", "gelu_pytorch_tanh", path), path + " \"hidden_act\"");
  c.vision_use_head = cfg<bool>(j, "vision_use_head", c.vision_use_head, path);
  XF_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_channels > 0 && c.image_size > 0 &&
               c.patch_size > 0,
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

// SiglipMultiheadAttentionPoolingHead: a learned probe attends to every token
// (nn.MultiheadAttention, batch_first), then a pre-norm MLP residual; the probe's row is the
// pooled output.
class SiglipPoolingHead : public Module {
 public:
  explicit SiglipPoolingHead(const SiglipVisionConfig& c)
      : dim_(c.hidden_size), heads_(c.num_attention_heads), act_(c.hidden_act) {
    probe_ = &param("probe", {1, 1, dim_});
    in_proj_weight_ = &param("attention.in_proj_weight", {3 * dim_, dim_});
    in_proj_bias_ = &param("attention.in_proj_bias", {3 * dim_});
    out_proj_ = child("attention.out_proj", std::make_shared<Linear>(dim_, dim_));
    layernorm_ = child("layernorm", std::make_shared<LayerNorm>(dim_, c.layer_norm_eps));
    fc1_ = child("mlp.fc1", std::make_shared<Linear>(dim_, c.intermediate_size));
    fc2_ = child("mlp.fc2", std::make_shared<Linear>(c.intermediate_size, dim_));
  }

  // h [B, N, d] -> [B, d]
  at::Tensor forward(const at::Tensor& h) const {
    const int64_t b = h.size(0), hd = dim_ / heads_;
    const at::Tensor& w = in_proj_weight_->value();
    const at::Tensor& bias = in_proj_bias_->value();
    const at::Tensor probe = probe_->value().to(h.scalar_type()).expand({b, 1, dim_});
    auto proj = [&](const at::Tensor& x, int64_t i) {
      return at::linear(x, w.narrow(0, i * dim_, dim_), bias.narrow(0, i * dim_, dim_));
    };
    // [B, S, d] -> [B, H, S, hd]
    auto heads = [&](const at::Tensor& x) {
      return x.view({b, x.size(1), heads_, hd}).transpose(1, 2);
    };
    const at::Tensor q = heads(proj(probe, 0));
    const at::Tensor k = heads(proj(h, 1));
    const at::Tensor v = heads(proj(h, 2));
    // nn.MultiheadAttention scales q by 1 / sqrt(head_dim); the softmax in fp32.
    const at::Tensor scores = at::matmul(q.to(at::kFloat) / std::sqrt(static_cast<double>(hd)),
                                         k.to(at::kFloat).transpose(-2, -1));  // [B, H, 1, N]
    const at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
    at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({b, 1, dim_});
    out = out_proj_->forward(out);
    const at::Tensor mlp = fc2_->forward(
        text_encoders::apply_hidden_act(fc1_->forward(layernorm_->forward(out)), act_));
    return (out + mlp).select(1, 0);
  }

 private:
  int64_t dim_, heads_;
  text_encoders::HiddenAct act_;
  ParamSlot* probe_;
  ParamSlot* in_proj_weight_;
  ParamSlot* in_proj_bias_;
  std::shared_ptr<Linear> out_proj_, fc1_, fc2_;
  std::shared_ptr<LayerNorm> layernorm_;
};

SiglipVisionTransformer::SiglipVisionTransformer(const SiglipVisionConfig& config)
    : config_(config) {
  const int64_t d = config.hidden_size;
  patch_weight_ = &param("embeddings.patch_embedding.weight",
                         {d, config.num_channels, config.patch_size, config.patch_size});
  patch_bias_ = &param("embeddings.patch_embedding.bias", {d});
  position_embedding_ = &param("embeddings.position_embedding.weight", {config.num_patches(), d});
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back(child(
        "encoder.layers." + std::to_string(i),
        std::make_shared<ClipEncoderLayer>(d, config.intermediate_size, config.num_attention_heads,
                                           config.layer_norm_eps, config.hidden_act)));
  }
  post_layernorm_ = child("post_layernorm", std::make_shared<LayerNorm>(d, config.layer_norm_eps));
  if (config.vision_use_head) head_ = child("head", std::make_shared<SiglipPoolingHead>(config));
}

SiglipVisionTransformer::Output SiglipVisionTransformer::forward(
    const at::Tensor& pixel_values) const {
  XF_CHECK(patch_weight_->loaded(), "SigLIP vision model used before load()");
  const at::Tensor& w = patch_weight_->value();  // [d, C, p, p]
  const at::Tensor& bias = patch_bias_->value();
  at::Tensor x = pixel_values.to(w.scalar_type());
  at::Tensor patches;
  if (x.is_cpu() && x.scalar_type() == at::kHalf) {
    // libtorch's CPU conv has no float16 kernel: compute in float32 and round back.
    patches =
        at::conv2d(x.to(at::kFloat), w.to(at::kFloat), bias.to(at::kFloat), config_.patch_size)
            .to(at::kHalf);
  } else {
    patches = at::conv2d(x, w, bias, config_.patch_size);  // [B, d, g, g]
  }
  at::Tensor h = patches.flatten(2).transpose(1, 2) + position_embedding_->value();  // [B, N, d]
  at::Tensor penultimate = h;
  const at::Tensor no_mask;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i + 1 == layers_.size()) penultimate = h;  // hidden_states[-2]
    h = layers_[i]->forward(h, no_mask);
  }
  Output out;
  out.last_hidden_state = post_layernorm_->forward(h);
  out.penultimate = penultimate;
  if (head_) out.pooled = head_->forward(out.last_hidden_state);
  return out;
}

SiglipVisionModel::SiglipVisionModel(const SiglipVisionConfig& config) : config_(config) {
  vision_model_ = child("vision_model", std::make_shared<SiglipVisionTransformer>(config));
}

void SiglipVisionModel::load(const TensorSource& source, c10::ScalarType dtype,
                             const std::string& prefix, const LoadOptions& options) {
  LoadOptions opts = options;
  opts.ignore_unexpected_prefixes.push_back("vision_model.embeddings.position_ids");
  Module::load(source, dtype, prefix, opts);
}

SiglipVisionTransformer::Output SiglipVisionModel::forward(const at::Tensor& px) const {
  XF_CHECK(px.defined() && px.dim() == 4 && px.size(0) >= 1 && px.size(1) == config_.num_channels &&
               px.size(2) == config_.image_size && px.size(3) == config_.image_size,
           "SiglipVisionModel: pixel_values must be [B, ", config_.num_channels, ", ",
           config_.image_size, ", ", config_.image_size, "] (config image_size ",
           config_.image_size, "), got ", px.defined() ? px.sizes() : at::IntArrayRef{});
  XF_CHECK(at::isFloatingType(px.scalar_type()),
           "SiglipVisionModel: pixel_values must be a floating-point tensor, got ",
           px.scalar_type());
  const auto& weights = named_parameters().front().second->value();
  XF_CHECK(!weights.defined() || weights.device() == px.device(),
           "SiglipVisionModel: pixel_values are on ", px.device(), " but the weights on ",
           weights.device());
  return vision_model_->forward(px);
}

uint64_t SiglipVisionModel::activation_bytes(const ActivationQuery& q) const {
  // One picture's patch tokens; the blocked kernel holds ~one head's fp32 scores.
  return encoder_layer_peak_bytes(q.batch, q.tokens > 0 ? q.tokens : config_.num_patches(), 4 * 3,
                                  config_.intermediate_size, config_.hidden_size, q.bytes);
}

TensorMap SiglipVisionModel::call(const std::string& method, const TensorMap& inputs) {
  text_encoders::check_call(class_name(), method, inputs, {"pixel_values"}, {});
  XF_CONTEXT(class_name(), ".forward");
  c10::InferenceMode guard;
  auto out = forward(inputs.at("pixel_values"));
  TensorMap result{{"last_hidden_state", out.last_hidden_state},
                   {"hidden_states_penultimate", out.penultimate}};
  if (out.pooled.defined()) result["pooler_output"] = out.pooled;
  return result;
}

}  // namespace xfuser::models::image
