#include "models/weights/component_folder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/error.h"
#include "models/weights/checkpoint.h"

namespace xfuser::models {
namespace fs = std::filesystem;

namespace detail {

void throw_config_type_error(const nlohmann::json& value, const std::string& key,
                             const std::string& expected, const std::string& file) {
  std::string shown = value.dump();
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  XF_THROW(file, ": config key '", key, "' must be ", expected, ", got ", value.type_name(), " ",
           shown);
}

void throw_config_missing(const std::string& key, const std::string& file) {
  XF_THROW(file, ": required config key '", key, "' is missing");
}

}  // namespace detail

ComponentFolder open_component_folder(const std::string& dir, const std::string& variant) {
  XF_CONTEXT("opening component folder ", dir);
  ComponentFolder folder;
  folder.dir = dir;
  folder.config_path = (fs::path(dir) / "config.json").string();
  XF_CHECK(fs::is_directory(dir), "component folder not found: ", dir);
  XF_CHECK(fs::is_regular_file(folder.config_path), "missing ", folder.config_path,
           " (a component folder needs its config.json)");
  std::ifstream in(folder.config_path, std::ios::binary);
  XF_CHECK(in.good(), "cannot read ", folder.config_path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    folder.config = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    XF_THROW(folder.config_path, ": not valid JSON: ", e.what());
  }
  XF_CHECK(folder.config.is_object(), folder.config_path, ": config must be a JSON object, got ",
           folder.config.type_name());

  const auto& config = folder.config;
  if (auto it = config.find("_class_name"); it != config.end()) {
    XF_CHECK(it->is_string(), folder.config_path, ": \"_class_name\" must be a string, got ",
             it->dump());
    folder.class_name = it->get<std::string>();
  } else if (auto arch = config.find("architectures"); arch != config.end()) {
    XF_CHECK(arch->is_array() && !arch->empty() && (*arch)[0].is_string(), folder.config_path,
             ": \"architectures\" must be a non-empty array of strings, got ", arch->dump());
    folder.class_name = (*arch)[0].get<std::string>();
  } else {
    XF_THROW(folder.config_path,
             ": no class name (neither diffusers' \"_class_name\" nor transformers' "
             "\"architectures\")");
  }
  folder.weights = open_checkpoint(dir, variant);
  return folder;
}

std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          const std::string& variant) {
  return load_component(dir, dtype, c10::Device(c10::kCPU), variant);
}

std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          c10::Device device, const std::string& variant) {
  ComponentFolder folder = open_component_folder(dir, variant);
  XF_CONTEXT("loading ", folder.class_name, " from ", dir);
  auto component = ComponentRegistry::create(folder.class_name, folder.config, folder.config_path);
  LoadOptions options;
  options.device = device;
  component->load(*folder.weights, dtype, "", options);
  return component;
}

}  // namespace xfuser::models
