// CLIPVisionModel and CLIPVisionModelWithProjection (transformers v4.44.2 modeling_clip.py): the
// CLIP image tower Wan2.1 image-to-video encodes its conditioning image with (open-clip ViT-H/14,
// hidden_act "gelu") and IP-adapters use. Parameters under transformers' names:
//   vision_model.embeddings.class_embedding [d]
//   vision_model.embeddings.patch_embedding.weight [d, C, p, p] (a stride-p conv, no bias)
//   vision_model.embeddings.position_embedding.weight [(image_size / p)^2 + 1, d]
//   vision_model.pre_layrnorm.{weight, bias}                   (sic: transformers' spelling)
//   vision_model.encoder.layers.N.*                            the CLIP encoder layer shared with
//                                                              the text tower (clip_encoder.h)
//   vision_model.post_layernorm.{weight, bias}
//   visual_projection.weight [proj, d] (no bias; the projection variant only)
// forward: tokens = [class_embedding, patches (row-major)] + position_embedding, pre_layrnorm,
// the encoder layers (no attention mask), pooled = post_layernorm(last_hidden_state[:, 0]).
//
// call("forward", {pixel_values [B, C, image_size, image_size]}) returns
//   last_hidden_state [B, 1 + N, d]          the last layer's output (no final norm)
//   hidden_states_penultimate [B, 1 + N, d]  hidden_states[-2]: the second-to-last layer's output
//                                            (pre_layrnorm's output for a 1-layer model); what
//                                            WanImageToVideoPipeline.encode_image uses
//   pooler_output [B, d]                     (CLIPVisionModel) post_layernorm of the class token
//   image_embeds [B, proj]                   (projection variant) visual_projection(pooled)
// pixel_values are cast to the weights' dtype, as transformers does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/text_encoders/clip_encoder.h"
#include "models/text_encoders/text_encoder_util.h"

namespace xfuser::models::image {

struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t projection_dim = 512;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  double layer_norm_eps = 1e-5;
  text_encoders::HiddenAct hidden_act = text_encoders::HiddenAct::kQuickGelu;

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }

  // Reads a CLIPVisionConfig (or the vision_config of a full CLIPConfig); absent keys take
  // transformers' CLIPVisionConfig defaults.
  static ClipVisionConfig from_json(const nlohmann::json& config, const std::string& path);
};

class ClipVisionTransformer : public Module {
 public:
  explicit ClipVisionTransformer(const ClipVisionConfig& config);

  struct Output {
    at::Tensor last_hidden_state;  // [B, 1 + N, d]
    at::Tensor pooled;             // [B, d]
    at::Tensor penultimate;        // [B, 1 + N, d]
  };
  // pixel_values [B, C, image_size, image_size] (validated by the caller).
  Output forward(const at::Tensor& pixel_values) const;

 private:
  ClipVisionConfig config_;
  ParamSlot* class_embedding_;
  ParamSlot* patch_embedding_;
  ParamSlot* position_embedding_;
  std::shared_ptr<LayerNorm> pre_layrnorm_;
  std::vector<std::shared_ptr<text_encoders::ClipEncoderLayer>> layers_;
  std::shared_ptr<LayerNorm> post_layernorm_;
};

class ClipVisionModel : public Component {
 public:
  ClipVisionModel(const ClipVisionConfig& config, bool with_projection);

  std::string class_name() const override;
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  // Strict load that also accepts the `vision_model.embeddings.position_ids` buffer older
  // checkpoints hold.
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  const ClipVisionConfig& config() const { return config_; }

 private:
  ClipVisionConfig config_;
  bool with_projection_;
  std::shared_ptr<ClipVisionTransformer> vision_model_;
  std::shared_ptr<Linear> visual_projection_;
};

}  // namespace xfuser::models::image
