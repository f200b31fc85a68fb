#include "models/weights/tensor_source.h"

#include <algorithm>

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

std::vector<std::string> InsertedPrefixSource::names() const {
  std::vector<std::string> out;
  for (const auto& name : base_.names()) {
    out.push_back(name.rfind(at_, 0) == 0 ? at_ + inserted_ + name.substr(at_.size()) : name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string InsertedPrefixSource::to_base(const std::string& name, bool checked) const {
  if (name.rfind(at_, 0) != 0) return name;
  if (name.compare(at_.size(), inserted_.size(), inserted_) != 0) {
    XF_CHECK(!checked, "tensor '", name, "' not found in ", describe(), " (read with '", inserted_,
             "' inserted after '", at_, "')");
    return std::string();
  }
  return at_ + name.substr(at_.size() + inserted_.size());
}

TensorInfo InsertedPrefixSource::info(const std::string& name) const {
  return base_.info(to_base(name, true));
}

at::Tensor InsertedPrefixSource::get(const std::string& name) const {
  return base_.get(to_base(name, true));
}

at::Tensor InsertedPrefixSource::get_slice(const std::string& name, int64_t dim, int64_t start,
                                           int64_t length) const {
  return base_.get_slice(to_base(name, true), dim, start, length);
}

bool InsertedPrefixSource::contains(const std::string& name) const {
  const std::string base = to_base(name);
  return !base.empty() && base_.contains(base);
}

bool has_prefix(const TensorSource& source, const std::string& prefix) {
  for (const auto& name : source.names()) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace xfuser::models
