#include "models/schedulers/scheduler_config.h"

#include <cmath>
#include <fstream>

#include "models/schedulers/flow_match_euler.h"
#include "models/schedulers/unipc_multistep.h"

namespace xfuser::models::schedulers {

std::filesystem::path scheduler_config_file(const std::filesystem::path& path) {
  return std::filesystem::is_directory(path) ? path / "scheduler_config.json" : path;
}

nlohmann::json read_scheduler_config(const std::filesystem::path& path) {
  const auto file = scheduler_config_file(path);
  XF_CONTEXT("reading the scheduler config ", file);
  std::ifstream in(file);
  XF_CHECK(in.good(), "cannot open ", file);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("cannot parse ", file, ": ", e.what());
  }
}

void check_flow_shift(double shift, std::string_view what) {
  XF_CHECK(std::isfinite(shift) && shift > 0 && shift <= kMaxFlowShift, what,
           " must be a number in (0, ", kMaxFlowShift, "] (got ", shift, ")");
}

void check_scheduler_folder(const std::filesystem::path& path) {
  const std::filesystem::path file = scheduler_config_file(path);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return;
  const nlohmann::json json = read_scheduler_config(path);
  const std::string name = json.is_object() ? json.value("_class_name", "") : "";
  if (name == "UniPCMultistepScheduler") {
    UniPCMultistepConfig::from_file(path);
  } else {
    // FlowMatchEuler's reader names any other class it is given.
    FlowMatchEulerConfig::from_file(path);
  }
}

std::vector<double> linspace(double start, double stop, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  if (n == 1) {
    out[0] = start;
    return out;
  }
  const double step = (stop - start) / static_cast<double>(n - 1);
  for (int64_t k = 0; k < n; ++k)
    out[static_cast<size_t>(k)] = static_cast<double>(k) * step + start;
  out.back() = stop;
  return out;
}

}  // namespace xfuser::models::schedulers
