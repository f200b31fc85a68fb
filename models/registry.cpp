#include "models/registry.h"

#include <sstream>

#include "backends/error.h"
#include "models/flux/flux_pipeline.h"

namespace xfuser::models {

std::string to_string(Task task) {
  switch (task) {
    case Task::kTextToImage:
      return "text-to-image";
    case Task::kImageToImage:
      return "image-to-image";
    case Task::kTextToVideo:
      return "text-to-video";
    case Task::kImageToVideo:
      return "image-to-video";
  }
  return "unknown";
}

const std::vector<ModelSpec>& ModelRegistry::all() {
  static const std::vector<ModelSpec> specs = [] {
    std::vector<ModelSpec> out;
    for (auto& s : flux::model_specs()) out.push_back(std::move(s));
    return out;
  }();
  return specs;
}

const ModelSpec* ModelRegistry::find_or_null(const std::string& name) {
  for (const auto& spec : all()) {
    if (spec.id == name) return &spec;
    for (const auto& alias : spec.aliases) {
      if (alias == name) return &spec;
    }
  }
  return nullptr;
}

const ModelSpec& ModelRegistry::find(const std::string& name) {
  if (const ModelSpec* spec = find_or_null(name)) return *spec;
  std::ostringstream known;
  for (const auto& spec : all()) {
    known << "\n    " << spec.id;
    for (const auto& alias : spec.aliases) known << ", " << alias;
  }
  XF_THROW("unknown model '", name, "'; known models:", known.str());
}

}  // namespace xfuser::models
