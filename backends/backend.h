// The device backend contract (../shared/seeds/omnirt-backend-onboarding.md, in C++):
//
//   Backend& backend = backend_for(device);
//   backend.register_override<Sig>("tag", fused_fn);        // hand-written kernels
//   std::function<Sig> fn = backend.wrap<Sig>("tag", eager_fn, compile_requested);
//
// wrap() tries, in order, the backend's compile path for the tag, then a registered override,
// then the eager function, and appends one BackendTimelineEntry with every attempt and the exact
// reason each one failed or was skipped. The timeline is the single source of truth for "why did
// this op run eagerly" and goes into the run report (timings_rank{r}.json, "backend_timeline").
//
// Signatures are type-erased per tag: an override registered under a tag with a different
// signature is an attempt that fails with a reason, never a crash.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/error.h"

namespace xfuser::backends {

struct BackendAttempt {
  std::string level;   // "compile", "override", "eager"
  bool ok = false;     // this level was chosen
  std::string reason;  // why it failed or was skipped; what was used when ok
};

struct BackendTimelineEntry {
  std::string tag;
  std::string backend;  // "cpu", "cuda"
  std::string chosen;   // the level in use: "compile", "override" or "eager"
  std::vector<BackendAttempt> attempts;
};

struct Capabilities {
  std::vector<std::string> dtypes;  // "fp32", "bf16", "fp16"
  bool compile_available = false;   // a compile path exists for some tags
  bool graph_mode = false;          // whole-step graph capture (CUDA graphs)
};

struct MemoryStats {
  int64_t peak_bytes = 0;       // RSS high-water mark on CPU; allocator peak on CUDA
  int64_t allocated_bytes = 0;  // current RSS on CPU; allocated on CUDA
};

// A function over a list of tensors: the shape a compile path (graph capture) can take.
using TensorListFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual bool is_available() const = 0;
  virtual Capabilities capabilities() const = 0;
  virtual void synchronize() const {}
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_memory_stats() {}

  // compile -> override -> eager for `tag` (see the file comment). `try_compile` is the user's
  // request (--use_torch_compile); without it the compile level is recorded as not requested.
  // `allow_override` false skips the override level (recorded as disabled).
  template <typename Sig>
  std::function<Sig> wrap(const std::string& tag, std::function<Sig> eager, bool try_compile,
                          bool allow_override = true);

  // Registers a hand-written kernel as the compile fallback for `tag` (replaces an earlier one).
  template <typename Sig>
  void register_override(const std::string& tag, std::function<Sig> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    overrides_[tag] = std::move(fn);
  }
  bool has_override(const std::string& tag) const;

  std::vector<BackendTimelineEntry> timeline() const;
  void clear_timeline();

 protected:
  // The backend's compile path. `eager` holds a std::function of the tag's signature; return a
  // std::any holding a callable of the same signature, or throw xfuser::Error with the reason.
  virtual std::any compile(const std::string& tag, const std::any& eager) = 0;

 private:
  void record(BackendTimelineEntry entry);

  mutable std::mutex mutex_;
  std::map<std::string, std::any> overrides_;
  std::vector<BackendTimelineEntry> timeline_;
};

// The process-wide backend of a device type ("cpu" or "cuda"); an error naming the device when
// it is not available in this build or on this host.
Backend& backend_for(const std::string& device);

template <typename Sig>
std::function<Sig> Backend::wrap(const std::string& tag, std::function<Sig> eager, bool try_compile,
                                 bool allow_override) {
  XF_CHECK(static_cast<bool>(eager), "backend ", name(), ": wrap(", tag, ") without an eager op");
  BackendTimelineEntry entry;
  entry.tag = tag;
  entry.backend = name();
  std::function<Sig> chosen;
  if (!try_compile) {
    entry.attempts.push_back({"compile", false, "not requested (--use_torch_compile is off)"});
  } else {
    try {
      std::any compiled = compile(tag, std::any(eager));
      auto* fn = std::any_cast<std::function<Sig>>(&compiled);
      XF_CHECK(fn != nullptr && *fn, "the compile path returned a callable of another signature");
      chosen = *fn;
      entry.attempts.push_back({"compile", true, "compiled by the " + name() + " backend"});
      entry.chosen = "compile";
    } catch (const std::exception& e) {
      entry.attempts.push_back({"compile", false, e.what()});
    }
  }
  if (!chosen && !allow_override) {
    entry.attempts.push_back({"override", false, "overrides disabled for this run"});
  } else if (!chosen) {
    std::any override_fn;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = overrides_.find(tag);
      if (it != overrides_.end()) override_fn = it->second;
    }
    if (!override_fn.has_value()) {
      entry.attempts.push_back({"override", false, "no override registered for this tag"});
    } else if (auto* fn = std::any_cast<std::function<Sig>>(&override_fn); fn && *fn) {
      chosen = *fn;
      entry.attempts.push_back({"override", true, "hand-written kernel"});
      entry.chosen = "override";
    } else {
      entry.attempts.push_back(
          {"override", false, "the override registered for this tag has another signature"});
    }
  }
  if (!chosen) {
    chosen = std::move(eager);
    entry.attempts.push_back({"eager", true, "reference implementation"});
    entry.chosen = "eager";
  }
  record(std::move(entry));
  return chosen;
}

}  // namespace xfuser::backends
