// Pieces shared by the transformers text encoders (CLIP, T5, UMT5): the activations transformers'
// ACT2FN names (including CLIP's quick_gelu) and the checks on call() inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/common/component.h"

namespace xfuser::models::text_encoders {

// transformers' ACT2FN entries the text encoders use.
enum class HiddenAct {
  kQuickGelu,  // quick_gelu: x * sigmoid(1.702 x)
  kGelu,       // gelu: exact erf form
  kGeluTanh,   // gelu_new, gelu_pytorch_tanh, gelu_fast: tanh approximation
  kRelu,       // relu
  kSilu,       // silu, swish
};

// Parses an ACT2FN name; `where` names the config file and key for the error.
HiddenAct hidden_act_from_name(const std::string& name, const std::string& where);
at::Tensor apply_hidden_act(const at::Tensor& x, HiddenAct act);

// at::matmul(a, b), except that float16 on the CPU (where libtorch has no half matmul) is
// computed in float32 and rounded back, as a GPU's half matmul accumulates in float32.
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

// Checks call() arguments: `method` must be "forward", every input name must be in `required`
// or `optional`, every `required` one present. Errors name the class and the input.
void check_call(const std::string& class_name, const std::string& method, const TensorMap& inputs,
                const std::vector<std::string>& required, const std::vector<std::string>& optional);

// Validates `input_ids` ([B, S], integer, every id in [0, vocab_size)) and returns it as int64.
at::Tensor checked_input_ids(const std::string& class_name, const TensorMap& inputs,
                             int64_t vocab_size);

// Returns the optional `attention_mask` ([B, S] like input_ids, any real or integer dtype), or
// an undefined tensor when absent.
at::Tensor checked_attention_mask(const std::string& class_name, const TensorMap& inputs,
                                  const at::Tensor& input_ids);

}  // namespace xfuser::models::text_encoders
