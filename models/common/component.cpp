#include "models/common/component.h"

#include <mutex>

#include <nlohmann/json.hpp>

#include "backends/error.h"

namespace xfuser::models {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ComponentFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void ComponentRegistry::add(const std::string& class_name, ComponentFactory factory) {
  XF_CHECK(!class_name.empty(), "a component class needs a name");
  XF_CHECK(factory != nullptr, "component class '", class_name, "' registered without a factory");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const bool inserted = r.factories.emplace(class_name, std::move(factory)).second;
  XF_CHECK(inserted, "component class '", class_name, "' is registered twice");
}

std::shared_ptr<Component> ComponentRegistry::create(const std::string& class_name,
                                                     const nlohmann::json& config,
                                                     const std::string& config_path) {
  ComponentFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(class_name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& name : known_classes()) known += (known.empty() ? "" : ", ") + name;
    XF_THROW("unknown component class '", class_name, "' (from ", config_path, "); known: ",
             known.empty() ? "none (was register_builtin_components() called?)" : known);
  }
  // Outside the lock: a factory may build sub-components through the registry.
  auto component = factory(config, config_path);
  XF_CHECK(component != nullptr, "factory of component class '", class_name,
           "' returned nothing for ", config_path);
  return component;
}

std::vector<std::string> ComponentRegistry::known_classes() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  out.reserve(r.factories.size());
  for (const auto& [name, factory] : r.factories) out.push_back(name);
  return out;
}

}  // namespace xfuser::models
