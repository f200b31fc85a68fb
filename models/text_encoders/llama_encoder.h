// Decoder-only language models used as text encoders: LlamaModel (HunyuanVideo's text_encoder,
// Llama 3 8B) and MistralModel (the language model of FLUX.2's Mistral-Small-3.1), as
// transformers v4.44.2 modeling_llama.py / modeling_mistral.py compute them, under transformers'
// parameter names:
//   embed_tokens.weight [V, d]
//   layers.N.input_layernorm.weight [d]
//   layers.N.self_attn.q_proj [H*hd, d], k_proj / v_proj [KV*hd, d], o_proj [d, H*hd]
//                                   (.weight; .bias too when attention_bias, Llama only)
//   layers.N.post_attention_layernorm.weight [d]
//   layers.N.mlp.{gate_proj, up_proj} [I, d], mlp.down_proj [d, I]  (.bias when mlp_bias, Llama)
//   norm.weight [d]
// The *ForCausalLM architectures hold the same under "model." plus lm_head.weight, which the
// encoder does not use (ignored when loading, present or not). Mistral3ForConditionalGeneration
// (FLUX.2's Mistral-Small-3.1) holds its language model under "model.language_model." (or
// "language_model.model."), configured by config.json's text_config; only that part is read.
// Qwen2_5_VLTextModel (HunyuanVideo-1.5's text_encoder, transformers 4.57.1) is the same decoder
// with biases on q/k/v_proj (not o_proj), head_dim = hidden_size / heads and Qwen2.5-VL's
// multimodal RoPE, which for text equals the 1-D RoPE here: the model expands its position ids
// (0..S-1) to three equal rows, so every mrope_section takes the same angles.
// Qwen2_5_VLForConditionalGeneration folders are read for their language model only (config
// text_config or, in the original checkpoints, the top-level keys; weights under
// "model.language_model." or "model."), computed as its Qwen2_5_VLTextModel with default
// position ids (the full model's get_rope_index would shift a left-padded row's positions).
//
// Math (as transformers' eager path): RMSNorm with the variance in float32 and the normalised
// value cast back before the weight; RoPE (rotate_half) with inv_freq computed in float32 on the
// host at construction (default, or rope_type "llama3" exactly as _compute_llama3_parameters),
// freqs = positions * inv_freq in float32 on the device, cos / sin cast to the compute dtype;
// position ids 0..S-1 whatever the padding (transformers' default); GQA by grouping the query
// heads over their key/value head (repeat_kv without the copy); scores / sqrt(hd) plus an
// additive finfo(dtype).min mask (causal, padding keys where attention_mask == 0, Mistral's
// sliding window: key j is kept for query i when i - window < j <= i, which transformers 4.44.2's
// eager/SDPA mask applies whenever sliding_window is set), softmax in float32.
// Query rows whose every key is masked (the leading pads of a left-padded row) attend to every
// key, as transformers 4.44's SDPA path does on CUDA (AttentionMaskConverter._unmask_unattended);
// the eager / CPU path would average them uniformly instead. Mistral3ForConditionalGeneration
// (transformers >= 4.50) gives them a zero attention output instead, as SDPA does on torch >= 2.5
// (config.fully_masked_rows). Only padded positions differ between the rules; no real token ever
// attends to them.
//
// call("forward", {input_ids [B, S] integer, attention_mask [B, S] optional}) returns
//   last_hidden_state [B, S, d]      after the final norm
//   hidden_states [L + 1, B, S, d]   transformers' output_hidden_states tuple, stacked:
//                                    [0] the embeddings, [i] the output of layer i for i < L,
//                                    and [L] the LAST layer's output AFTER the final norm
//                                    (== last_hidden_state): transformers 4.44.2 appends the
//                                    normed tensor as the last entry. hidden_states[-3] (what
//                                    HunyuanVideo takes) is the output of layer L - 2, not normed.
// Weights and activations are in the load dtype; only the RMSNorm statistics, RoPE tables and the
// softmax are float32, as in transformers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/text_encoders/text_encoder_util.h"

namespace xfuser::models::text_encoders {

struct LlamaEncoderConfig {
  enum class Family { kLlama, kMistral, kQwen2 };
  enum class RopeType { kDefault, kLlama3 };

  std::string architecture = "LlamaModel";  // config.json "architectures"[0]
  Family family = Family::kLlama;
  bool causal_lm = false;  // *ForCausalLM: weights under "model.", lm_head ignored
  // Mistral3ForConditionalGeneration (FLUX.2): the config's text_config, the weights under
  // "model.language_model." (or "language_model.model."), everything else ignored.
  bool multimodal = false;
  // Query rows whose every key is masked (the leading pads of a left-padded row): kAttendAll as
  // transformers 4.44's SDPA path on CUDA (_unmask_unattended; HunyuanVideo), kZero as the SDPA
  // path of transformers >= 4.48 on torch >= 2.5 (a zero attention output; Mistral 3 / FLUX.2).
  // Only padded positions differ; no real token attends to them.
  enum class FullyMaskedRows { kAttendAll, kZero };
  FullyMaskedRows fully_masked_rows = FullyMaskedRows::kAttendAll;

  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;  // Llama: hidden_size / heads; Mistral: the config's head_dim if set
  HiddenAct hidden_act = HiddenAct::kSilu;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool attention_bias = false;  // Llama only (Mistral has no biases)
  bool qkv_bias = false;        // Qwen2 / Qwen2.5-VL: biases on q/k/v_proj only (not o_proj)
  bool mlp_bias = false;
  int64_t max_position_embeddings = 2048;  // informational: transformers does not enforce it
  std::optional<int64_t> sliding_window;   // Mistral only

  RopeType rope_type = RopeType::kDefault;
  // rope_scaling of rope_type "llama3".
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;

  // Reads a LlamaConfig (architectures LlamaModel / LlamaForCausalLM) or a MistralConfig
  // (MistralModel / MistralForCausalLM) with transformers 4.44.2's defaults. rope_scaling may be
  // null, {"rope_type" (or legacy "type"): "default"} or the llama3 form (Llama only); any other
  // is an error, as is a Llama head_dim other than hidden_size / num_attention_heads
  // (transformers 4.44 ignores it in attention), or num_attention_heads not a multiple of
  // num_key_value_heads. pretraining_tp > 1 only splits the projections in transformers (the
  // same sums in another order) and is accepted.
  // Qwen2_5_VLTextModel / Qwen2_5_VLForConditionalGeneration read a Qwen2_5_VLTextConfig with
  // transformers 4.57.1's defaults: rope_scaling null or {"type" / "rope_type": "mrope" |
  // "default", "mrope_section" summing to head_dim / 2}; sliding-window layers
  // (use_sliding_window with max_window_layers < num_hidden_layers, or a "sliding_attention"
  // in layer_types) are an error.
  static LlamaEncoderConfig from_json(const nlohmann::json& config, const std::string& path,
                                      const std::string& architecture);
};

// RoPE inverse frequencies [head_dim / 2], float32 on the host, computed with the same float32
// operations as transformers' _compute_default_rope_parameters / _compute_llama3_parameters.
at::Tensor llama_rope_inv_freq(const LlamaEncoderConfig& config);

class LlamaDecoderLayer;
class LlamaRmsNorm;

class LlamaEncoder : public Component {
 public:
  explicit LlamaEncoder(const LlamaEncoderConfig& config);

  std::string class_name() const override { return config_.architecture; }
  TensorMap call(const std::string& method, const TensorMap& inputs) override;
  uint64_t activation_bytes(const ActivationQuery& query) const override;

  // Strict load; lm_head.* of a *ForCausalLM checkpoint is ignored.
  void load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix = "",
            const LoadOptions& options = {}) override;

  struct Output {
    at::Tensor last_hidden_state;  // [B, S, d]
    at::Tensor hidden_states;      // [L + 1, B, S, d] (see the file comment)
  };
  // input_ids [B, S] integer, attention_mask [B, S] or undefined (both checked as call() does).
  Output forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

  // The entries `layers` of transformers' hidden_states tuple (index i in [-(L+1), L], negative
  // from the end as in Python: -3 is L - 2), in the order asked, without stacking the others.
  // Layers after the deepest index asked are not run: asking for hidden_states[-3] of a 32-layer
  // model runs 30 layers. Index L (or -1) is the final-normed output, as in transformers.
  std::vector<at::Tensor> forward_hidden_states(const at::Tensor& input_ids,
                                                const at::Tensor& attention_mask,
                                                const std::vector<int64_t>& layers) const;

  const LlamaEncoderConfig& config() const { return config_; }

 private:
  // Runs the embeddings and layers 0..last_layer-1 (last_layer in [0, L]), calling
  // `visit(i, h)` with hidden_states[i] for i in 0..last_layer (the final norm applied when
  // last_layer == L).
  void run(const at::Tensor& input_ids, const at::Tensor& attention_mask, int64_t last_layer,
           const std::function<void(int64_t, const at::Tensor&)>& visit) const;
  // Validates the inputs (rank, dtype, vocabulary, mask shape, device) and returns int64 ids.
  at::Tensor checked_ids(const at::Tensor& input_ids, const at::Tensor& attention_mask) const;

  LlamaEncoderConfig config_;
  at::Tensor inv_freq_;  // [hd / 2] float32, host
  ParamSlot* embed_tokens_;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> layers_;
  std::shared_ptr<LlamaRmsNorm> norm_;
};

}  // namespace xfuser::models::text_encoders
