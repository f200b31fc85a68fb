// libtorch's op profiler behind one small interface (profiling/torch_ops.cpp holds the only
// includes of libtorch's profiler headers). Internal to profiling/.
#pragma once

#include <string>
#include <vector>

#include "profiling/trace.h"

namespace xfuser::profiling::detail {

// "legacy" (libtorch 1.x: profiler_legacy.h), "kineto" (libtorch 2.x: profiler_kineto.h), or
// "" when this build has none.
const char* torch_ops_profiler();

// Starts recording the ATen ops of the calling thread. Returns "" on success, else the reason.
std::string start_torch_ops();

// Stops the profiler started by start_torch_ops() on the same thread. When `keep`, returns its
// op events as complete events on the trace clock (steady, us), each on the track
// kTorchOpsTidBase + the libtorch thread id.
std::vector<TraceEvent> stop_torch_ops(bool keep);

constexpr uint64_t kTorchOpsTidBase = 1000000;
// Trace thread ids of GPU activity (kernels, copies) recorded by kineto: kGpuTidBase + device.
constexpr uint64_t kGpuTidBase = 2000000;

}  // namespace xfuser::profiling::detail
