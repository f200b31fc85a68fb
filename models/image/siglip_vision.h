// SiglipVisionModel (transformers modeling_siglip.py): the SigLIP image tower HunyuanVideo-1.5's
// image-to-video pipeline encodes its first frame with (last_hidden_state, the "semantic tokens").
// Parameters under transformers' names:
//   vision_model.embeddings.patch_embedding.{weight [d, C, p, p], bias [d]} (a stride-p conv)
//   vision_model.embeddings.position_embedding.weight [(image_size / p)^2, d]
//   vision_model.encoder.layers.N.*      the CLIP encoder layer (clip_encoder.h: same names and
//                                        math: pre-norm attention and MLP, softmax in fp32)
//   vision_model.post_layernorm.{weight, bias}
//   vision_model.head.*                  (vision_use_head, default true) the attention-pooling
//                                        head: probe [1, 1, d], attention.in_proj_{weight, bias}
//                                        [3d, d] / [3d], attention.out_proj, layernorm, mlp
// forward: tokens = patches (row-major, no class token) + position_embedding, the encoder layers
// (no mask), last_hidden_state = post_layernorm(...); pooler_output = head(last_hidden_state):
// the probe attends to every token (nn.MultiheadAttention), plus a pre-norm MLP residual.
//
// call("forward", {pixel_values [B, C, image_size, image_size]}) returns
//   last_hidden_state [B, N, d]
//   hidden_states_penultimate [B, N, d]  hidden_states[-2] (the embeddings for a 1-layer model)
//   pooler_output [B, d]                 only with the head
// pixel_values are cast to the weights' dtype.
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

struct SiglipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  double layer_norm_eps = 1e-6;
  text_encoders::HiddenAct hidden_act = text_encoders::HiddenAct::kGeluTanh;
  bool vision_use_head = true;

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }

  // Reads a SiglipVisionConfig (or the vision_config of a full SiglipConfig); absent keys take
  // transformers' SiglipVisionConfig defaults.
  static SiglipVisionConfig from_json(const nlohmann::json& config, const std::string& path);
};

class SiglipPoolingHead;

class SiglipVisionTransformer : public Module {
 public:
  explicit SiglipVisionTransformer(const SiglipVisionConfig& config);

  struct Output {
    at::Tensor last_hidden_state;  // [B, N, d]
    at::Tensor penultimate;        // [B, N, d]
    at::Tensor pooled;             // [B, d]; undefined without the head
  };
  // pixel_values [B, C, image_size, image_size] (validated by the caller).
  Output forward(const at::Tensor& pixel_values) const;

 private:
  SiglipVisionConfig config_;
  ParamSlot* patch_weight_;
  ParamSlot* patch_bias_;
  ParamSlot* position_embedding_;
  std::vector<std::shared_ptr<text_encoders::ClipEncoderLayer>> layers_;
  std::shared_ptr<LayerNorm> post_layernorm_;
  std::shared_ptr<SiglipPoolingHead> head_;  // null without vision_use_head
};

class SiglipVisionModel : public Component {
 public:
  explicit SiglipVisionModel(const SiglipVisionConfig& config);

  std::string class_name() const override { return "SiglipVisionModel"; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;
  // Strict load that also accepts the `vision_model.embeddings.position_ids` buffer.
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  const SiglipVisionConfig& config() const { return config_; }
  // pixel_values [B, C, S, S] -> the tower's outputs (checked like call("forward")).
  SiglipVisionTransformer::Output forward(const at::Tensor& pixel_values) const;

 private:
  SiglipVisionConfig config_;
  std::shared_ptr<SiglipVisionTransformer> vision_model_;
};

}  // namespace xfuser::models::image
