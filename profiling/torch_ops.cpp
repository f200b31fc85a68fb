// libtorch's op-level profiler, converted into xfuser trace events. The only file that includes
// libtorch's profiler headers (torch/csrc/..., beyond ATen).
//
// - libtorch 1.x (Debian's 1.13): the legacy profiler (enableProfilerLegacy /
//   disableProfilerLegacy): per-thread lists of push/pop LegacyEvents, matched by handle.
// - libtorch 2.x: kineto (enableProfiler / disableProfiler -> KinetoEvent start and duration),
//   with the GPU's kernels and copies (CUPTI) when a GPU is visible.
// Both stamp events with CLOCK_REALTIME; they are moved onto the trace clock (steady) with an
// offset measured when the events are converted.
#include "profiling/torch_ops.h"

#include <time.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#if defined(__has_include)
#if XFUSER_TORCH_MAJOR >= 2 && __has_include(<torch/csrc/autograd/profiler_kineto.h>)
#include <torch/csrc/autograd/profiler_kineto.h>
#define XFUSER_TORCH_OPS_KINETO 1
#elif __has_include(<torch/csrc/autograd/profiler_legacy.h>)
#include <torch/csrc/autograd/profiler_legacy.h>
#define XFUSER_TORCH_OPS_LEGACY 1
#endif
#endif

namespace xfuser::profiling::detail {
namespace {

[[maybe_unused]] int64_t clock_ns(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// realtime - steady (ns), from the closest of a few back-to-back readings.
[[maybe_unused]] int64_t realtime_minus_steady_ns() {
  int64_t best_gap = INT64_MAX, offset = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t s0 = clock_ns(CLOCK_MONOTONIC);
    const int64_t r = clock_ns(CLOCK_REALTIME);
    const int64_t s1 = clock_ns(CLOCK_MONOTONIC);
    if (s1 - s0 < best_gap) {
      best_gap = s1 - s0;
      offset = r - (s0 + s1) / 2;
    }
  }
  return offset;
}

// steady_clock is CLOCK_MONOTONIC on Linux (libstdc++), which now_us() reads.
[[maybe_unused]] int64_t realtime_ns_to_trace_us(int64_t realtime_ns, int64_t offset_ns) {
  return (realtime_ns - offset_ns) / 1000;
}

// Sets ts/dur from begin and end in realtime ns. Both ends are truncated to us the same way, so
// ops nested in time stay nested in the trace.
[[maybe_unused]] void set_span(TraceEvent& t, int64_t begin_ns, int64_t end_ns, int64_t offset_ns) {
  t.ts_us = realtime_ns_to_trace_us(begin_ns, offset_ns);
  t.dur_us = std::max<int64_t>(0, realtime_ns_to_trace_us(end_ns, offset_ns) - t.ts_us);
}

[[maybe_unused]] nlohmann::json shapes_json(const std::vector<std::vector<int64_t>>& shapes) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : shapes) out.push_back(s);
  return out;
}

[[maybe_unused]] bool has_shape(const std::vector<std::vector<int64_t>>& shapes) {
  for (const auto& s : shapes) {
    if (!s.empty()) return true;
  }
  return false;
}

}  // namespace

#if defined(XFUSER_TORCH_OPS_LEGACY)

namespace tap = torch::autograd::profiler;

const char* torch_ops_profiler() { return "legacy"; }

std::string start_torch_ops() {
  try {
    tap::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
        torch::profiler::impl::ProfilerState::CPU, /*report_input_shapes=*/true));
    return "";
  } catch (const c10::Error& e) {
    return std::string("libtorch's legacy profiler could not start: ") + e.what_without_backtrace();
  }
}

std::vector<TraceEvent> stop_torch_ops(bool keep) {
  tap::thread_event_lists lists = tap::disableProfilerLegacy();
  std::vector<TraceEvent> out;
  if (!keep) return out;
  const int64_t offset = realtime_minus_steady_ns();
  // Absolute times through one reference event: LegacyEvent gives them only as double us
  // (~0.25 us steps at today's epoch), but differences exactly; the reference's rounding is then
  // shared by every event and nesting survives.
  const tap::LegacyEvent* ref = nullptr;
  for (const auto& list : lists) {
    if (!list.empty()) {
      ref = &list.front();
      break;
    }
  }
  if (ref == nullptr) return out;
  const auto ref_ns = static_cast<int64_t>(ref->cpuUs() * 1000.0);
  auto realtime_ns = [&](const tap::LegacyEvent& e) {
    return ref_ns + static_cast<int64_t>(std::llround(ref->cpuElapsedUs(e) * 1000.0));
  };
  // Pushes by handle, across threads (an op may end on another thread than it began).
  std::map<uint64_t, const tap::LegacyEvent*> open;
  for (const auto& list : lists) {
    for (const auto& e : list) {
      if (e.kind() == tap::EventKind::PushRange) {
        open[e.handle()] = &e;
      } else if (e.kind() == tap::EventKind::PopRange) {
        auto it = open.find(e.handle());
        if (it == open.end()) continue;  // popped without a recorded push (enabled mid-op)
        const tap::LegacyEvent& push = *it->second;
        TraceEvent t;
        t.name = push.name();
        t.category = "aten";
        set_span(t, realtime_ns(push), realtime_ns(e), offset);
        t.tid = kTorchOpsTidBase + push.threadId();
        const auto shapes = push.shapes();
        if (has_shape(shapes)) t.args = {{"input_shapes", shapes_json(shapes)}};
        out.push_back(std::move(t));
        open.erase(it);
      }
    }
  }
  return out;
}

#elif defined(XFUSER_TORCH_OPS_KINETO)

namespace tap = torch::autograd::profiler;

const char* torch_ops_profiler() { return "kineto"; }

std::string start_torch_ops() {
  try {
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                       /*report_input_shapes=*/true);
    std::set<torch::profiler::impl::ActivityType> activities{
        torch::profiler::impl::ActivityType::CPU};
    // GPU kernels and copies (CUPTI) when this libtorch has CUDA and a GPU is visible.
    if (at::hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0) {
      activities.insert(torch::profiler::impl::ActivityType::CUDA);
    }
    tap::prepareProfiler(config, activities);
    tap::enableProfiler(config, activities);
    return "";
  } catch (const c10::Error& e) {
    return std::string("libtorch's kineto profiler could not start: ") + e.what_without_backtrace();
  }
}

std::vector<TraceEvent> stop_torch_ops(bool keep) {
  auto result = tap::disableProfiler();
  std::vector<TraceEvent> out;
  if (!keep || !result) return out;
  const int64_t offset = realtime_minus_steady_ns();
  for (const auto& e : result->events()) {
    const bool gpu = e.deviceType() == c10::DeviceType::CUDA;
    if (e.deviceType() != c10::DeviceType::CPU && !gpu) continue;
    TraceEvent t;
    t.name = e.name();
    t.category = gpu ? "gpu" : "aten";
#if XFUSER_TORCH_MAJOR > 2 || XFUSER_TORCH_MINOR >= 3
    const auto begin_ns = static_cast<int64_t>(e.startNs());
    const auto end_ns = begin_ns + static_cast<int64_t>(e.durationNs());
#else
    const auto begin_ns = static_cast<int64_t>(e.startUs()) * 1000;
    const auto end_ns = begin_ns + static_cast<int64_t>(e.durationUs()) * 1000;
#endif
    set_span(t, begin_ns, end_ns, offset);
    // GPU activity on one track per device (kGpuTidBase + device index).
    t.tid = gpu ? kGpuTidBase + static_cast<uint64_t>(std::max<int64_t>(0, e.deviceIndex()))
                : kTorchOpsTidBase + e.startThreadId();
    if (e.hasShapes()) {
      std::vector<std::vector<int64_t>> shapes(e.shapes().begin(), e.shapes().end());
      if (has_shape(shapes)) t.args = {{"input_shapes", shapes_json(shapes)}};
    }
    out.push_back(std::move(t));
  }
  return out;
}

#else

const char* torch_ops_profiler() { return ""; }

std::string start_torch_ops() {
  return "this libtorch build provides no op profiler header (profiler_legacy.h / "
         "profiler_kineto.h)";
}

std::vector<TraceEvent> stop_torch_ops(bool) { return {}; }

#endif

}  // namespace xfuser::profiling::detail
