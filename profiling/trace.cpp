#include "profiling/trace.h"

#include <algorithm>
#include <iterator>
#include <set>

#include <ATen/record_function.h>

#include "backends/error.h"
#include "profiling/torch_ops.h"

namespace xfuser::profiling {

constexpr int kTraceSchemaVersion = 1;

TraceRecorder& TraceRecorder::instance() {
  static auto* recorder = new TraceRecorder();  // never destroyed: spans may end at exit
  return *recorder;
}

void TraceRecorder::start(const TraceOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  XF_CHECK(!enabled(), "TraceRecorder::start: already recording (call stop() first)");
  events_.clear();
  options_ = options;
  torch_ops_status_.clear();
  if (options.torch_ops) {
    torch_ops_status_ = detail::start_torch_ops();
    torch_ops_running_ = torch_ops_status_.empty();
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void TraceRecorder::stop_torch_ops(bool keep) {
  if (!torch_ops_running_) return;
  torch_ops_running_ = false;
  auto ops = detail::stop_torch_ops(keep);
  if (keep) {
    events_.insert(events_.end(), std::make_move_iterator(ops.begin()),
                   std::make_move_iterator(ops.end()));
  }
}

void TraceRecorder::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled()) return;
  detail::g_enabled.store(false, std::memory_order_relaxed);
  stop_torch_ops(true);
}

void TraceRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
  if (torch_ops_running_) {
    // The op profiler cannot drop its events in place: restart it.
    stop_torch_ops(false);
    torch_ops_status_ = detail::start_torch_ops();
    torch_ops_running_ = torch_ops_status_.empty();
  }
}

void TraceRecorder::set_process(const TraceProcess& process) {
  XF_CHECK(process.rank >= 0 && process.world_size >= 1 && process.rank < process.world_size,
           "TraceRecorder::set_process: rank ", process.rank, " is outside [0, ",
           process.world_size, ")");
  std::lock_guard<std::mutex> lock(mutex_);
  process_ = process;
}

TraceProcess TraceRecorder::process() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return process_;
}

void TraceRecorder::record(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled()) return;  // a span that ends after stop()
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

uint64_t TraceRecorder::current_thread_id() { return at::RecordFunction::currentThreadId(); }

void TraceRecorder::set_thread_name(const std::string& name) {
  auto& self = instance();
  const uint64_t tid = current_thread_id();
  std::lock_guard<std::mutex> lock(self.mutex_);
  for (auto& [id, n] : self.thread_names_) {
    if (id == tid) {
      n = name;
      return;
    }
  }
  self.thread_names_.emplace_back(tid, name);
}

bool TraceRecorder::torch_ops_available() { return *detail::torch_ops_profiler() != '\0'; }

const char* TraceRecorder::torch_ops_profiler() { return detail::torch_ops_profiler(); }

nlohmann::json TraceRecorder::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int pid = process_.rank;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(pid)}}}});
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"sort_index", pid}}}});
  std::set<uint64_t> tids;
  for (const auto& e : events_) tids.insert(e.tid);
  for (uint64_t tid : tids) {
    std::string name;
    for (const auto& [id, n] : thread_names_) {
      if (id == tid) name = n;
    }
    if (name.empty()) {
      if (tid >= detail::kGpuTidBase) {
        name = "gpu " + std::to_string(tid - detail::kGpuTidBase) + " (kernels, copies)";
      } else if (tid >= detail::kTorchOpsTidBase) {
        name = "aten ops (thread " + std::to_string(tid - detail::kTorchOpsTidBase) + ")";
      } else {
        name = "thread " + std::to_string(tid);
      }
    }
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const auto& e : events_) {
    nlohmann::json j = {{"ph", "X"},       {"name", e.name}, {"cat", e.category}, {"ts", e.ts_us},
                        {"dur", e.dur_us}, {"pid", pid},     {"tid", e.tid}};
    if (e.args.is_object() && !e.args.empty()) j["args"] = e.args;
    events.push_back(std::move(j));
  }
  nlohmann::json xfuser = {{"schema", "xfuser.trace"},
                           {"version", kTraceSchemaVersion},
                           {"rank", process_.rank},
                           {"world_size", process_.world_size},
                           {"clock", "steady_clock, microseconds"},
                           {"clock_sync_us", process_.clock_sync_us},
                           {"torch_ops_profiler", detail::torch_ops_profiler()}};
  if (options_.torch_ops && !torch_ops_status_.empty()) {
    xfuser["torch_ops_missing"] = torch_ops_status_;
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"xfuser", std::move(xfuser)}}}};
}

void Span::finish() noexcept {
  try {
    TraceEvent e;
    const int64_t end = now_us();
    e.name = name_;
    e.category = category_;
    e.ts_us = start_us_;
    e.dur_us = std::max<int64_t>(0, end - start_us_);
    e.tid = TraceRecorder::current_thread_id();
    e.args = std::move(args_);
    TraceRecorder::instance().record(std::move(e));
  } catch (...) {
    // Out of memory while tracing: the span is lost, the run goes on.
  }
}

}  // namespace xfuser::profiling
