#include "models/text_encoders/text_encoder_util.h"

#include <algorithm>
#include <sstream>

#include <ATen/ATen.h>

#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/tensor_util.h"

namespace xfuser::models::text_encoders {

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  if (backends::widen_cpu_products(a)) {
    return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(a.scalar_type());
  }
  return at::matmul(a, b);
}
namespace {

std::string join(const std::vector<std::string>& items) {
  std::ostringstream os;
  for (size_t i = 0; i < items.size(); ++i) os << (i ? ", " : "") << items[i];
  return os.str();
}

}  // namespace

HiddenAct hidden_act_from_name(const std::string& name, const std::string& where) {
  if (name == "quick_gelu") return HiddenAct::kQuickGelu;
  if (name == "gelu") return HiddenAct::kGelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") {
    return HiddenAct::kGeluTanh;
  }
  if (name == "relu") return HiddenAct::kRelu;
  if (name == "silu" || name == "swish") return HiddenAct::kSilu;
  XF_THROW("unsupported activation '", name, "' in ", where,
           " (supported: quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, "
           "swish)");
}

at::Tensor apply_hidden_act(const at::Tensor& x, HiddenAct act) {
  // libtorch's CPU kernels lack some float16 activations: float32 and round back.
  if (x.scalar_type() == at::kHalf && x.device().is_cpu() && act != HiddenAct::kRelu) {
    return apply_hidden_act(x.to(at::kFloat), act).to(at::kHalf);
  }
  switch (act) {
    case HiddenAct::kQuickGelu:
      return x * at::sigmoid(x * 1.702);
    case HiddenAct::kGelu:
      return at::gelu(x);
    case HiddenAct::kGeluTanh:
      return at::gelu(x, "tanh");
    case HiddenAct::kRelu:
      return at::relu(x);
    case HiddenAct::kSilu:
      return at::silu(x);
  }
  XF_THROW("unknown activation value ", static_cast<int>(act));
}

void check_call(const std::string& class_name, const std::string& method, const TensorMap& inputs,
                const std::vector<std::string>& required,
                const std::vector<std::string>& optional) {
  XF_CHECK(method == "forward", class_name, " has no method '", method, "' (methods: forward)");
  std::vector<std::string> accepted = required;
  accepted.insert(accepted.end(), optional.begin(), optional.end());
  for (const auto& [name, tensor] : inputs) {
    XF_CHECK(std::find(accepted.begin(), accepted.end(), name) != accepted.end(), class_name,
             ".forward: unknown input '", name, "' (accepted: ", join(accepted), ")");
  }
  for (const auto& name : required) {
    XF_CHECK(inputs.count(name) && inputs.at(name).defined(), class_name,
             ".forward: missing required input '", name, "'");
  }
}

at::Tensor checked_input_ids(const std::string& class_name, const TensorMap& inputs,
                             int64_t vocab_size) {
  const at::Tensor& ids = inputs.at("input_ids");
  XF_CHECK(ids.dim() == 2, class_name, ".forward: input_ids must be [batch, seq], got shape ",
           shape_string(ids.sizes()));
  XF_CHECK(!at::isFloatingType(ids.scalar_type()) && !at::isComplexType(ids.scalar_type()) &&
               ids.scalar_type() != at::kBool,
           class_name, ".forward: input_ids must be an integer tensor, got ", ids.scalar_type());
  XF_CHECK(ids.size(0) > 0 && ids.size(1) > 0, class_name,
           ".forward: input_ids must not be empty, got shape ", shape_string(ids.sizes()));
  auto out = ids.to(at::kLong).contiguous();
  const int64_t lo = out.min().item<int64_t>();
  const int64_t hi = out.max().item<int64_t>();
  XF_CHECK(lo >= 0 && hi < vocab_size, class_name, ".forward: input_ids hold ids in [", lo, ", ",
           hi, "], outside the vocabulary [0, ", vocab_size, ")");
  return out;
}

at::Tensor checked_attention_mask(const std::string& class_name, const TensorMap& inputs,
                                  const at::Tensor& input_ids) {
  auto it = inputs.find("attention_mask");
  if (it == inputs.end() || !it->second.defined()) return {};
  const at::Tensor& mask = it->second;
  XF_CHECK(mask.sizes() == input_ids.sizes(), class_name, ".forward: attention_mask shape ",
           shape_string(mask.sizes()), " does not match input_ids shape ",
           shape_string(input_ids.sizes()));
  XF_CHECK(!at::isComplexType(mask.scalar_type()), class_name,
           ".forward: attention_mask must be real, got ", mask.scalar_type());
  return mask;
}

}  // namespace xfuser::models::text_encoders
