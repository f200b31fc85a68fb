#include "models/common/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

ParamSlot& Module::param(const std::string& name, std::vector<int64_t> shape) {
  for (const auto& [n, slot] : params_)
    XF_CHECK(n != name, "parameter '", name, "' declared twice");
  params_.emplace_back(name, std::make_unique<ParamSlot>());
  params_.back().second->shape = std::move(shape);
  return *params_.back().second;
}

std::vector<std::pair<std::string, ParamSlot*>> Module::named_parameters(
    const std::string& prefix) {
  std::vector<std::pair<std::string, ParamSlot*>> out;
  for (auto& [name, slot] : params_) out.emplace_back(prefix + name, slot.get());
  for (auto& [name, mod] : children_) {
    auto sub = mod->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, const ParamSlot*>> Module::named_parameters(
    const std::string& prefix) const {
  auto mut = const_cast<Module*>(this)->named_parameters(prefix);
  return {mut.begin(), mut.end()};
}

void Module::load(const TensorSource& source, c10::ScalarType dtype, const std::string& prefix,
                  const LoadOptions& options) {
  XF_CONTEXT("loading weights from ", source.describe());
  auto params = named_parameters();
  std::vector<std::string> missing, mismatched, unexpected, wrong_dtype;
  std::set<std::string> claimed;
  for (auto& [name, slot] : params) {
    const std::string full = prefix + name;
    claimed.insert(full);
    if (!source.contains(full)) {
      missing.push_back(full + " " + shape_string(slot->shape));
      continue;
    }
    auto info = source.info(full);
    if (info.shape != slot->shape) {
      mismatched.push_back(full + ": checkpoint " + shape_string(info.shape) + ", model expects " +
                           shape_string(slot->shape));
    }
    // Weights are floating point: an integer or bool tensor would be cast to garbage silently.
    const auto want = slot->dtype.value_or(dtype);
    if (at::isFloatingType(want) && !at::isFloatingType(info.dtype)) {
      wrong_dtype.push_back(full + ": checkpoint " + info.dtype_name +
                            ", model expects a floating-point type");
    }
  }
  if (!options.allow_unexpected) {
    for (const auto& name : source.names()) {
      if (!starts_with(name, prefix) || claimed.count(name)) continue;
      bool ignored = std::any_of(
          options.ignore_unexpected_prefixes.begin(), options.ignore_unexpected_prefixes.end(),
          [&](const std::string& p) { return starts_with(name, prefix + p); });
      if (!ignored) unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty() || !wrong_dtype.empty()) {
    std::ostringstream os;
    os << "state dict does not match the model (" << missing.size() << " missing, "
       << mismatched.size() << " shape mismatches, " << unexpected.size() << " unexpected";
    if (!wrong_dtype.empty()) os << ", " << wrong_dtype.size() << " dtype mismatches";
    os << ") in " << source.describe();
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      os << "\n  " << title << ":";
      for (const auto& it : items) os << "\n    " << it;
    };
    list("missing tensors", missing);
    list("shape mismatches", mismatched);
    list("dtype mismatches", wrong_dtype);
    list("unexpected tensors", unexpected);
    XF_THROW(os.str());
  }
  for (auto& [name, slot] : params) {
    at::Tensor t = source.get(prefix + name);
    const auto want = slot->dtype.value_or(dtype);
    slot->tensor = t.scalar_type() == want ? t : t.to(want);
  }
}

void Module::init_random(uint64_t seed, double std, c10::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, slot] : named_parameters()) {
    auto t = at::empty(slot->shape, at::TensorOptions().dtype(at::kFloat));
    t.normal_(0.0, std, gen);
    slot->tensor = t.to(slot->dtype.value_or(dtype));
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, slot] : named_parameters()) {
    int64_t k = 1;
    for (auto d : slot->shape) k *= d;
    n += k;
  }
  return n;
}

}  // namespace xfuser::models
