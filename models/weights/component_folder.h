// Component folders (a diffusers model folder such as transformer/ or vae/, or a transformers
// one such as text_encoder/): config.json plus safetensors weights. Also the typed config
// readers model Config structs use to apply diffusers' defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "models/common/component.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models {

struct ComponentFolder {
  std::string dir;
  std::string config_path;  // dir/config.json
  nlohmann::json config;
  // diffusers' `_class_name`, else transformers' `architectures[0]`.
  std::string class_name;
  std::shared_ptr<TensorSource> weights;
};

// Reads dir/config.json and opens the weights with open_checkpoint(dir, variant). Errors name
// the file: a missing or unreadable config.json, bad JSON, no class name, no weights.
ComponentFolder open_component_folder(const std::string& dir, const std::string& variant = "");
// The same without the weights (`weights` stays null): a folder may hold its config.json alone.
ComponentFolder open_component_config(const std::string& dir);
// Whether `dir` holds weights open_checkpoint() would open (one of checkpoint_file_names()).
bool has_weight_files(const std::string& dir, const std::string& variant = "");

// Every tensor of a component folder as (name, shape): from the weight headers (memory-mapped, no
// data read) when the folder has weights, else from the module its config.json builds, which
// declares the shapes of every parameter it would load (no memory is allocated). So a memory
// plan needs only the configs of a model (a few kilobytes), not its weights.
// `build`: makes the module from the config-only folder; null: ComponentRegistry::create.
std::vector<std::pair<std::string, std::vector<int64_t>>> component_tensor_shapes(
    const std::string& dir,
    const std::function<std::shared_ptr<Module>(const ComponentFolder&)>& build = nullptr);

// open_component_folder -> ComponentRegistry::create(class, config) -> load(weights, dtype).
// The component classes must be registered first (register_builtin_components()).
std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          const std::string& variant = "");
// The same, with the weights copied to `device` as they are read (a pipeline's load options).
std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          c10::Device device, const std::string& variant = "");
// The same, with the loader's options (device, FSDP row sharding).
std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          const LoadOptions& options,
                                          const std::string& variant = "");

namespace detail {

[[noreturn]] void throw_config_type_error(const nlohmann::json& value, const std::string& key,
                                          const std::string& expected, const std::string& file);
[[noreturn]] void throw_config_missing(const std::string& key, const std::string& file);

// Sizes read from a config (layer, head, width, channel, vocabulary and position counts, known by
// their key's name) must lie in a range far beyond every real model's and be non-negative, so a
// corrupt value (a num_layers of 1e9) is an error naming the file and key before anything is
// built or allocated. Other integers pass. docs/errors.md lists the ranges.
void check_config_size(const std::string& key, int64_t value, const std::string& file);

// Records that `file` lacked `key` and cfg() read `value` (diffusers' default) instead: a load
// whose weights then do not match names these keys.
void note_config_default(const std::string& file, const std::string& key, const std::string& value);

// Strict conversion of one config value: an integer field rejects 2.5 and "2", a bool field
// rejects 1. `key` names the value in errors ("axes_dims_rope[1]" for array elements).
template <class T, class Enable = void>
struct ConfigValue;

template <>
struct ConfigValue<bool> {
  static std::string expected() { return "a boolean"; }
  static bool convert(const nlohmann::json& v, const std::string& key, const std::string& file) {
    if (!v.is_boolean()) throw_config_type_error(v, key, expected(), file);
    return v.get<bool>();
  }
};

template <class T>
struct ConfigValue<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static std::string expected() {
    return std::is_signed_v<T> ? "an integer" : "a non-negative integer";
  }
  static T convert(const nlohmann::json& v, const std::string& key, const std::string& file) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        check_config_size(
            key, u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u), file);
        return static_cast<T>(u);
      }
    } else if (v.is_number_integer()) {
      const auto i = v.get<int64_t>();
      if (i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
          (i < 0 ||
           static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
        check_config_size(key, i, file);
        return static_cast<T>(i);
      }
    }
    if (!v.is_number_integer()) throw_config_type_error(v, key, expected(), file);
    throw_config_type_error(v, key,
                            "an integer from " + std::to_string(std::numeric_limits<T>::min()) +
                                " to " + std::to_string(std::numeric_limits<T>::max()),
                            file);
  }
};

template <class T>
struct ConfigValue<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static std::string expected() { return "a number"; }
  static T convert(const nlohmann::json& v, const std::string& key, const std::string& file) {
    if (!v.is_number()) throw_config_type_error(v, key, expected(), file);
    return v.get<T>();
  }
};

template <>
struct ConfigValue<std::string> {
  static std::string expected() { return "a string"; }
  static std::string convert(const nlohmann::json& v, const std::string& key,
                             const std::string& file) {
    if (!v.is_string()) throw_config_type_error(v, key, expected(), file);
    return v.get<std::string>();
  }
};

template <>
struct ConfigValue<nlohmann::json> {
  static std::string expected() { return "any JSON value"; }
  static nlohmann::json convert(const nlohmann::json& v, const std::string&, const std::string&) {
    return v;
  }
};

template <class U>
struct ConfigValue<std::vector<U>> {
  static std::string expected() {
    return "an array (each element " + ConfigValue<U>::expected() + ")";
  }
  static std::vector<U> convert(const nlohmann::json& v, const std::string& key,
                                const std::string& file) {
    if (!v.is_array()) throw_config_type_error(v, key, expected(), file);
    std::vector<U> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(ConfigValue<U>::convert(v[i], key + "[" + std::to_string(i) + "]", file));
    return out;
  }
};

// Optional fields: null reads as nullopt.
template <class U>
struct ConfigValue<std::optional<U>> {
  static std::string expected() { return ConfigValue<U>::expected() + " or null"; }
  static std::optional<U> convert(const nlohmann::json& v, const std::string& key,
                                  const std::string& file) {
    if (v.is_null()) return std::nullopt;
    return ConfigValue<U>::convert(v, key, file);
  }
};

}  // namespace detail

// config[key] as T; a missing or null key gives `default_value` (diffusers' __init__ default).
// A value of the wrong type is an error naming `file`, the key and the expected type.
template <class T>
T cfg(const nlohmann::json& config, const std::string& key, T default_value,
      const std::string& file) {
  if (!config.is_object()) return default_value;
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if constexpr (std::is_arithmetic_v<T>) {
      detail::note_config_default(file, key, std::to_string(default_value));
    }
    return default_value;
  }
  return detail::ConfigValue<T>::convert(*it, key, file);
}

// For an error about weights that do not match their model: the keys the config.json beside
// `weights` (a path, or a description starting with one) lacked and cfg() read as defaults on this
// thread ("num_layers = 19"), in one sentence; "" when none.
std::string config_defaults_note(const std::string& weights);

// config[key] as T; a missing (or, unless T is std::optional, null) key is an error.
template <class T>
T cfg_required(const nlohmann::json& config, const std::string& key, const std::string& file) {
  if (!config.is_object()) detail::throw_config_missing(key, file);
  auto it = config.find(key);
  if (it == config.end()) detail::throw_config_missing(key, file);
  return detail::ConfigValue<T>::convert(*it, key, file);
}

}  // namespace xfuser::models
