// What every scheduler's config reader shares: scheduler_config.json read from a file or a
// pipeline's scheduler folder, typed fields with diffusers' defaults, and numpy's linspace.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/error.h"

namespace xfuser::models::schedulers {

// `path` itself, or path/scheduler_config.json when it is a folder, parsed (errors name the file).
// The file a scheduler path names: path/scheduler_config.json for a folder, else path itself.
std::filesystem::path scheduler_config_file(const std::filesystem::path& path);
nlohmann::json read_scheduler_config(const std::filesystem::path& path);

// json[key] as T; absent or null: `fallback`; the wrong type is an error naming the key.
template <typename T>
T config_value(const nlohmann::json& json, const char* key, T fallback) {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("scheduler config: '", key, "' has the wrong type: ", e.what());
  }
}

// A flow-matching shift, from a flag or from a scheduler config: one check for both. A shift
// must be finite and positive (sigma' = shift * s / (1 + (shift - 1) * s)); above 1000 every sigma
// but the last rounds to the first timestep, so larger values are refused as typos.
inline constexpr double kMaxFlowShift = 1000.0;
void check_flow_shift(double shift, std::string_view what);

// Reads a pipeline's scheduler folder (or scheduler_config.json) with the reader of the class its
// `_class_name` names (FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler), so every value
// the run would refuse is refused before loading; another class is an error naming it and the
// file. A folder without scheduler_config.json is left to the loader, which names it.
void check_scheduler_folder(const std::filesystem::path& path);

// np.linspace(start, stop, n) in float64 (endpoint included, last element exactly stop).
std::vector<double> linspace(double start, double stop, int64_t n);

}  // namespace xfuser::models::schedulers
