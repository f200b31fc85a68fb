// Per-rank Chrome traces: a process-wide TraceRecorder and RAII Spans usable from every layer.
//
//   {
//     profiling::Span span("comm", "all_reduce");   // two relaxed atomic loads when disabled
//     if (span) span.arg("group", name).arg("bytes", bytes);
//     ...                                          // the span ends at the closing brace
//   }
//   XF_SPAN("stage", "decode");                    // the same, without args
//
// Recording is off until TraceRecorder::start(). Events are Chrome trace "X" (complete) events,
// ts/dur in microseconds of the steady clock; pid = rank, tid = the libtorch RecordFunction thread
// id of the recording thread; "M" metadata events name the process ("rank r") and the threads.
// Span names and categories must be string literals (or outlive the recorder); args are JSON.
// With TraceOptions::torch_ops, libtorch's profiler records the ATen op events of the recording
// thread into the same trace on the same clock (see docs/profiling.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace xfuser::profiling {

namespace detail {
inline std::atomic<bool> g_enabled{false};
// NVTX ranges on (set_nvtx); pushed and popped by Spans in profiling/nvtx.cpp.
inline std::atomic<bool> g_nvtx{false};
void nvtx_push(const char* category, const char* name) noexcept;
void nvtx_pop() noexcept;
}  // namespace detail

// True while a TraceRecorder is recording. With nvtx_enabled(), the only cost of a disabled Span.
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// The trace clock: std::chrono::steady_clock in microseconds.
inline int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// NVTX ranges for Nsight Systems and Nsight Compute: while on, every Span also pushes a range in
// the NVTX domain "xfuser" (message: the span's name; category: its category, named), popped when
// the span ends, whether or not a TraceRecorder records. On at start-up when an NVTX tool is
// attached (NVTX_INJECTION64_PATH is set, as nsys and ncu do) unless XFUSER_NVTX=0; XFUSER_NVTX=1
// turns them on without one. A build without the NVTX headers (XFUSER_WITH_NVTX off) has none.
bool nvtx_available() noexcept;
// Turns the ranges on or off (on only where available); returns whether they are on.
bool set_nvtx(bool on) noexcept;
inline bool nvtx_enabled() noexcept { return detail::g_nvtx.load(std::memory_order_relaxed); }

struct TraceEvent {
  std::string name;
  std::string category;
  int64_t ts_us = 0;   // steady clock
  int64_t dur_us = 0;  // >= 0
  uint64_t tid = 0;
  nlohmann::json args;  // null or an object
};

struct TraceOptions {
  // Also record libtorch's op-level events (legacy profiler on libtorch 1.x, kineto on 2.x).
  bool torch_ops = false;
};

// What the trace says about its rank and clock; stored under "otherData" -> "xfuser".
struct TraceProcess {
  int rank = 0;
  int world_size = 1;
  // Steady-clock time (us) of this rank right after the MPI barrier that starts the run; ranks
  // are on a common clock once each subtracts its own value (`xfuser trace merge`). -1: unknown.
  int64_t clock_sync_us = -1;
};

class TraceRecorder {
 public:
  static TraceRecorder& instance();

  // Drops previous events and starts recording (and the op profiler if asked and available).
  // Call from the thread that runs the model: libtorch's profiler follows that thread.
  void start(const TraceOptions& options = {});
  // Stops recording; op events recorded so far are converted into the trace.
  void stop();
  // Drops the events recorded so far and keeps recording (the profiler's warm-up steps).
  void clear();
  bool recording() const { return enabled(); }

  void set_process(const TraceProcess& process);
  TraceProcess process() const;

  // Adds one complete event (ignored unless recording).
  void record(TraceEvent event);
  std::vector<TraceEvent> events() const;

  // The whole trace: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
  nlohmann::json to_json() const;

  // Names the calling thread in the trace ("M" thread_name event).
  static void set_thread_name(const std::string& name);
  // The trace tid of the calling thread.
  static uint64_t current_thread_id();

  // Whether this build of libtorch provides an op profiler we can use, and which one.
  static bool torch_ops_available();
  static const char* torch_ops_profiler();

 private:
  TraceRecorder() = default;
  void stop_torch_ops(bool keep);

  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
  std::vector<std::pair<uint64_t, std::string>> thread_names_;
  TraceProcess process_;
  TraceOptions options_;
  bool torch_ops_running_ = false;
  std::string torch_ops_status_;  // why op events are missing, if they are
};

// An RAII span: records one "X" event from construction to destruction while recording.
class Span {
 public:
  Span(const char* category, const char* name) noexcept : category_(category), name_(name) {
    if (enabled()) {
      active_ = true;
      start_us_ = now_us();
    }
    if (nvtx_enabled()) {
      nvtx_ = true;
      detail::nvtx_push(category, name);
    }
  }
  ~Span() {
    if (active_) finish();
    if (nvtx_) detail::nvtx_pop();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // True when this span records: guard argument computations with it.
  explicit operator bool() const noexcept { return active_; }

  template <typename T>
  Span& arg(const char* key, T&& value) {
    if (active_) args_[key] = std::forward<T>(value);
    return *this;
  }

 private:
  void finish() noexcept;

  const char* category_;
  const char* name_;
  bool active_ = false;
  bool nvtx_ = false;  // pushed an NVTX range
  int64_t start_us_ = 0;
  nlohmann::json args_;
};

}  // namespace xfuser::profiling

#define XF_SPAN_CONCAT_INNER_(a, b) a##b
#define XF_SPAN_CONCAT_(a, b) XF_SPAN_CONCAT_INNER_(a, b)
// An anonymous span for the rest of the enclosing scope.
#define XF_SPAN(category, name) \
  ::xfuser::profiling::Span XF_SPAN_CONCAT_(xf_span_, __LINE__)(category, name)
