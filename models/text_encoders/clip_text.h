// CLIPTextModel and CLIPTextModelWithProjection (transformers v4.44.2 modeling_clip.py) under
// transformers' parameter names:
//   text_model.embeddings.{token_embedding [V, d], position_embedding [P, d]}.weight
//   text_model.encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2,
//                                mlp.fc1 [I, d], mlp.fc2 [d, I]}.{weight, bias}
//   text_model.final_layer_norm.{weight, bias}
//   text_projection.weight [proj, d] (no bias; the projection variant only, no text_model. prefix)
// Pre-LN transformer with a causal mask (plus the optional padding attention_mask).
//
// call("forward", {input_ids [B, S], attention_mask [B, S] optional}) returns
//   last_hidden_state [B, S, d]            final-LN output of the last layer
//   pooler_output [B, d]                   (CLIPTextModel) last_hidden_state at the EOS position
//   text_embeds [B, proj]                  (projection variant) text_projection(pooled)
//   hidden_states_penultimate [B, S, d]    hidden_states[-2]: output of the second-to-last layer
//                                          (the embeddings for a 1-layer model), no final LN
// EOS position: legacy configs with eos_token_id == 2 take argmax(input_ids) (the highest id);
// otherwise the first position where input_ids == eos_token_id (0 when there is none).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/text_encoders/text_encoder_util.h"

namespace xfuser::models::text_encoders {

struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t projection_dim = 512;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  double layer_norm_eps = 1e-5;
  HiddenAct hidden_act = HiddenAct::kQuickGelu;
  int64_t eos_token_id = 49407;

  // Reads a CLIPTextConfig (or the text_config of a full CLIPConfig); absent keys take
  // transformers' CLIPTextConfig defaults.
  static ClipTextConfig from_json(const nlohmann::json& config, const std::string& path);
};

class ClipEncoderLayer;

class ClipTextTransformer : public Module {
 public:
  explicit ClipTextTransformer(const ClipTextConfig& config);

  struct Output {
    at::Tensor last_hidden_state;  // [B, S, d]
    at::Tensor pooled;             // [B, d]
    at::Tensor penultimate;        // [B, S, d]
  };
  // input_ids [B, S] int64 (validated), attention_mask [B, S] or undefined.
  Output forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

 private:
  ClipTextConfig config_;
  ParamSlot* token_embedding_;
  ParamSlot* position_embedding_;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers_;
  std::shared_ptr<LayerNorm> final_layer_norm_;
};

class ClipTextModel : public Component {
 public:
  ClipTextModel(const ClipTextConfig& config, bool with_projection);

  std::string class_name() const override;
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  // Strict load that also accepts the legacy `text_model.embeddings.position_ids` buffer.
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  const ClipTextConfig& config() const { return config_; }

 private:
  ClipTextConfig config_;
  bool with_projection_;
  std::shared_ptr<ClipTextTransformer> text_model_;
  std::shared_ptr<Linear> text_projection_;
};

}  // namespace xfuser::models::text_encoders
