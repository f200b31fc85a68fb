// Pipelines xfuser builds itself (the embedded tiny models) live in a cache folder:
// $XFUSER_CACHE, else $XDG_CACHE_HOME/xfuser, else ~/.cache/xfuser.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace xfuser::models {

// The cache folder (not created).
std::filesystem::path xfuser_cache_dir();

// cache/`name`, written by `write(folder)` on first use. Safe when several processes ask at
// once: one builds under a temporary name (behind a lock file) and renames; the others wait and
// find the finished folder. `name` should carry a layout version, so a changed layout never
// reuses an old folder.
std::filesystem::path ensure_cached_pipeline(
    const std::string& name, const std::function<void(const std::filesystem::path&)>& write);

}  // namespace xfuser::models
