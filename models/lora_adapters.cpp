#include "models/lora_adapters.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "backends/error.h"
#include "models/registry.h"

namespace xfuser::models {

RunLora read_run_lora(const ModelSpec& model, const std::vector<LoraSpec>& specs, bool fused,
                      c10::Device device) {
  RunLora out;
  if (specs.empty()) return out;
  const Family& family = family_of(model);
  std::map<std::string, std::shared_ptr<ComponentLora>> parts;
  std::set<std::string> names;
  for (const LoraSpec& given : specs) {
    const std::string flag = given.target.empty() ? "--lora" : "--lora_2";
    LoraSpec spec = given;
    if (spec.name.empty()) {
      const std::string stem = std::filesystem::path(spec.path).stem().string();
      spec.name = stem;
      for (int i = 2; names.count(spec.name); ++i) spec.name = stem + "_" + std::to_string(i);
    }
    XF_CHECK(!names.count(spec.name), flag, " ", spec.path, ": an adapter named '", spec.name,
             "' is already loaded");
    names.insert(spec.name);
    auto adapter = std::make_shared<LoraAdapter>(read_lora_adapter(spec, family.lora_layouts));
    auto scale = std::make_shared<double>(spec.scale);
    for (const auto& [component, updates] : adapter->components) {
      std::string target = component;
      if (!spec.target.empty()) {
        XF_CHECK(component == "transformer", flag, " ", spec.path, ": the adapter adapts '",
                 component, "'; ", flag, " loads an adapter's transformer part into ", spec.target,
                 " only (give text-encoder adapters with --lora)");
        target = spec.target;
      }
      const auto& allowed = family.lora_components;
      XF_CHECK(std::find(allowed.begin(), allowed.end(), target) != allowed.end(), flag, " ",
               spec.path, ": the adapter adapts '", target, "' (",
               target == component ? "" : "its transformer part, as " + flag + " asks; ",
               updates.front().key, "), but adapters for ", model.id, " adapt only: ", [&] {
                 std::string s;
                 for (const auto& a : allowed) s += (s.empty() ? "" : ", ") + a;
                 return s;
               }());
      auto& part = parts[target];
      if (!part) {
        part = std::make_shared<ComponentLora>();
        part->component = target;
        part->fused = fused;
        part->device = device;
      }
      for (const auto& u : updates) part->entries.push_back({adapter.get(), &u, scale});
    }
    out.adapters.push_back(adapter);
    out.load_scales.push_back(spec.scale);
    out.scales.push_back(scale);
  }
  for (auto& [name, part] : parts) out.components[name] = part;
  return out;
}

}  // namespace xfuser::models
