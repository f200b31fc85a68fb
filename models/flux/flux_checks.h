// FLUX.1's layout check and memory estimate (ModelSpec::check_run): config.json files and
// weight headers only, no tensor data.
#pragma once

#include <filesystem>

#include "models/registry.h"

namespace xfuser::models::flux {

MemoryEstimate check_flux_run(const std::filesystem::path& pipeline_dir, const RunLayout& run);

}  // namespace xfuser::models::flux
