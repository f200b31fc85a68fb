// T5EncoderModel and UMT5EncoderModel (transformers v4.44.2 modeling_t5.py / modeling_umt5.py)
// under transformers' parameter names:
//   shared.weight [V, d]                       (tied to encoder.embed_tokens.weight: checkpoints
//                                               may hold either name or both)
//   encoder.block.N.layer.0.SelfAttention.{q,k,v} [H*dk, d], .o [d, H*dk]   (no bias)
//   encoder.block.N.layer.0.SelfAttention.relative_attention_bias.weight [buckets, H]
//                                               (T5: block 0 only, shared by all; UMT5: every
//                                               block)
//   encoder.block.N.layer.0.layer_norm.weight
//   encoder.block.N.layer.1.DenseReluDense.{wi_0, wi_1, wo}  (gated, e.g. gated-gelu) or {wi, wo}
//   encoder.block.N.layer.1.layer_norm.weight
//   encoder.final_layer_norm.weight
// T5 RMS norm (fp32 variance, no mean, no bias), no 1/sqrt(dk) scaling, bidirectional relative
// position buckets, attention_mask as an additive dtype-min bias.
//
// Dtypes as transformers: loaded in fp16, `wo` stays fp32 (_keep_in_fp32_modules, applied by
// transformers 4.44 to fp16 loads only) and hidden states are clamped to the fp16 range after
// each sub-layer while they are fp16.
//
// call("forward", {input_ids [B, S], attention_mask [B, S] optional}) returns
//   last_hidden_state [B, S, d].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/text_encoders/text_encoder_util.h"

namespace xfuser::models::text_encoders {

struct T5EncoderConfig {
  bool umt5 = false;  // UMT5: a relative_attention_bias in every block
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool is_gated_act = false;
  HiddenAct dense_act_fn = HiddenAct::kRelu;

  // Reads a T5Config / UMT5Config. feed_forward_proj "ACT" or "gated-ACT" sets the activation
  // ("gated-gelu" means gelu_new); dense_act_fn / is_gated_act saved in the file take precedence,
  // as they do when transformers loads the config.
  static T5EncoderConfig from_json(const nlohmann::json& config, const std::string& path,
                                   bool umt5);
};

// T5's bucket of each relative position (key - query), bidirectional: [Q, K] int64.
at::Tensor t5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                        int64_t num_buckets, int64_t max_distance);

class T5Block;
class T5RmsNorm;

class T5Encoder : public Component {
 public:
  explicit T5Encoder(const T5EncoderConfig& config);

  std::string class_name() const override;
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  // Strict load that resolves the tied embedding (shared.weight, encoder.embed_tokens.weight or
  // both; with both, encoder.embed_tokens.weight wins as it does in transformers), keeps `wo` in
  // fp32 for fp16 loads, and ignores decoder.* / lm_head.* tensors of a full T5 checkpoint
  // (transformers' _keys_to_ignore_on_load_unexpected).
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  // input_ids [B, S] int64, attention_mask [B, S] or undefined -> [B, S, d].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

  const T5EncoderConfig& config() const { return config_; }

 private:
  T5EncoderConfig config_;
  ParamSlot* shared_;
  std::vector<std::shared_ptr<T5Block>> blocks_;
  std::shared_ptr<T5RmsNorm> final_layer_norm_;
};

}  // namespace xfuser::models::text_encoders
