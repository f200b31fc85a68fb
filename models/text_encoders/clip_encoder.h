// The pre-LN encoder layer transformers' CLIPEncoderLayer (v4.44.2 modeling_clip.py) defines,
// shared by the CLIP text tower (clip_text.h) and the CLIP vision tower
// (models/image/clip_vision.h):
//   layer_norm1 -> self_attn.{q,k,v,out}_proj (+ residual) -> layer_norm2 -> mlp.{fc1, fc2}
//   (+ residual), every Linear with a bias, attention through backends::attention (on the CPU the
//   scores, bias and softmax in fp32, as the eager form).
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "models/common/layers.h"
#include "models/common/module.h"
#include "models/text_encoders/text_encoder_util.h"

namespace xfuser::models::text_encoders {

class ClipAttention;
class ClipMlp;

class ClipEncoderLayer : public Module {
 public:
  ClipEncoderLayer(int64_t hidden_size, int64_t intermediate_size, int64_t num_heads,
                   double layer_norm_eps, HiddenAct act);
  // x [B, S, d]; bias: an additive fp32 attention bias broadcastable to [B, H, S, S] (the text
  // tower's causal + padding mask), or undefined for none (the vision tower).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) const;

 private:
  std::shared_ptr<ClipAttention> self_attn_;
  std::shared_ptr<LayerNorm> layer_norm1_, layer_norm2_;
  std::shared_ptr<ClipMlp> mlp_;
};

}  // namespace xfuser::models::text_encoders
