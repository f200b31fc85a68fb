#pragma once

#include <filesystem>
#include <string>

namespace xfuser::models {

// A trained pipeline folder committed in the source tree (`source_relative`, e.g.
// "models/flux/tiny_shapes") and installed as <datadir>/xfuser/<install_name>: the source tree's,
// else the installed one (the configured prefix, else <the running program's folder>/../share).
// Throws naming `model_id` and the places looked at when none holds model_index.json.
std::filesystem::path trained_pipeline_dir(const std::string& model_id,
                                           const std::string& source_relative,
                                           const std::string& install_name);

}  // namespace xfuser::models
