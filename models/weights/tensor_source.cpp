#include "models/weights/tensor_source.h"

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::models {

at::Tensor TensorSource::get_slice(const std::string& name, int64_t dim, int64_t start,
                                   int64_t length) const {
  return get(name).narrow(dim, start, length);
}

std::vector<std::string> TensorMapSource::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

TensorInfo TensorMapSource::info(const std::string& name) const {
  auto it = tensors_.find(name);
  XF_CHECK(it != tensors_.end(), "tensor '", name, "' not found in ", label_);
  const auto& t = it->second;
  return {t.scalar_type(), std::string(c10::toString(t.scalar_type())), t.sizes().vec(), label_};
}

at::Tensor TensorMapSource::get(const std::string& name) const {
  auto it = tensors_.find(name);
  XF_CHECK(it != tensors_.end(), "tensor '", name, "' not found in ", label_);
  return it->second;
}

}  // namespace xfuser::models
