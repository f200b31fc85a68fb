#include "backends/backend.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "backends/kernels.h"

namespace xfuser::backends {

bool Backend::has_override(const std::string& tag) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overrides_.count(tag) > 0;
}

std::vector<BackendTimelineEntry> Backend::timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

void Backend::clear_timeline() {
  std::lock_guard<std::mutex> lock(mutex_);
  timeline_.clear();
}

void Backend::record(BackendTimelineEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeline_.push_back(std::move(entry));
}

namespace {

// VmHWM / VmRSS of this process from /proc/self/status, in bytes (0 when unreadable).
int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      int64_t kb = 0;
      is >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    register_override<NormModulateFn>("norm_modulate", norm_modulate_fused);
    register_override<RopeQkFn>("rope_qk", rope_qk_fused);
  }
  std::string name() const override { return "cpu"; }
  bool is_available() const override { return true; }
  Capabilities capabilities() const override {
    return {{"fp32", "bf16", "fp16"}, /*compile_available=*/false, /*graph_mode=*/false};
  }
  MemoryStats memory_stats() const override {
    // The kernel folds the current RSS into VmHWM lazily: the peak is at least the current.
    const int64_t rss = proc_status_bytes("VmRSS");
    return {std::max(proc_status_bytes("VmHWM"), rss), rss};
  }

 protected:
  std::any compile(const std::string& tag, const std::any&) override {
    XF_THROW("the cpu backend has no compile path for '", tag,
             "' (libtorch's C++ API has no torch.compile; CPU runs hand-written overrides or "
             "eager ops)");
  }
};

}  // namespace

Backend& backend_for(const std::string& device) {
  if (device == "cpu") {
    static CpuBackend cpu;
    return cpu;
  }
  XF_THROW("no backend for device '", device,
           "' in this build (available: cpu; the cuda backend needs a CUDA libtorch)");
}

}  // namespace xfuser::backends
