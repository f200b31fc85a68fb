#include "models/text_encoders/clip_encoder.h"

#include <cmath>

#include <ATen/ATen.h>

#include "backends/attention.h"

namespace xfuser::models::text_encoders {

class ClipAttention : public Module {
 public:
  ClipAttention(int64_t dim, int64_t heads) : heads_(heads), head_dim_(dim / heads) {
    q_proj_ = child("q_proj", std::make_shared<Linear>(dim, dim, true));
    k_proj_ = child("k_proj", std::make_shared<Linear>(dim, dim, true));
    v_proj_ = child("v_proj", std::make_shared<Linear>(dim, dim, true));
    out_proj_ = child("out_proj", std::make_shared<Linear>(dim, dim, true));
  }

  // x [B, S, d]; bias fp32, broadcastable to [B, H, S, S] (additive), or undefined. The one
  // attention op (backends/attention.h): scores, bias and softmax in fp32 on the CPU, the fused
  // memory-efficient kernel on a GPU.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) const {
    const int64_t b = x.size(0), s = x.size(1);
    auto heads = [&](const at::Tensor& t) {  // [B, S, H*D] -> [B, S, H, D]
      return t.view({b, s, heads_, head_dim_});
    };
    backends::AttentionOptions opts;
    opts.scale = std::pow(static_cast<double>(head_dim_), -0.5);
    opts.bias = bias;
    auto out = backends::attention(heads(q_proj_->forward(x)), heads(k_proj_->forward(x)),
                                   heads(v_proj_->forward(x)), opts)
                   .out;                                                 // [B, S, H, D]
    return out_proj_->forward(out.reshape({b, s, heads_ * head_dim_}));  // [B, S, d]
  }

 private:
  int64_t heads_, head_dim_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, out_proj_;
};

class ClipMlp : public Module {
 public:
  ClipMlp(int64_t dim, int64_t inner, HiddenAct act) : act_(act) {
    fc1_ = child("fc1", std::make_shared<Linear>(dim, inner, true));
    fc2_ = child("fc2", std::make_shared<Linear>(inner, dim, true));
  }
  at::Tensor forward(const at::Tensor& x) const {
    return fc2_->forward(apply_hidden_act(fc1_->forward(x), act_));
  }

 private:
  HiddenAct act_;
  std::shared_ptr<Linear> fc1_, fc2_;
};

ClipEncoderLayer::ClipEncoderLayer(int64_t hidden_size, int64_t intermediate_size,
                                   int64_t num_heads, double layer_norm_eps, HiddenAct act) {
  self_attn_ = child("self_attn", std::make_shared<ClipAttention>(hidden_size, num_heads));
  layer_norm1_ = child("layer_norm1", std::make_shared<LayerNorm>(hidden_size, layer_norm_eps));
  mlp_ = child("mlp", std::make_shared<ClipMlp>(hidden_size, intermediate_size, act));
  layer_norm2_ = child("layer_norm2", std::make_shared<LayerNorm>(hidden_size, layer_norm_eps));
}

at::Tensor ClipEncoderLayer::forward(const at::Tensor& x, const at::Tensor& bias) const {
  auto h = x + self_attn_->forward(layer_norm1_->forward(x), bias);
  return h + mlp_->forward(layer_norm2_->forward(h));
}

}  // namespace xfuser::models::text_encoders
