#include "backends/error.h"

#include <atomic>
#include <cstring>

namespace xfuser {
namespace {

std::atomic<int> g_rank{-1};
thread_local std::vector<std::string> t_context;

const char* short_path(const char* file) {
  // Print paths relative to the source tree: keep from the last top-level folder name on.
  static const char* kRoots[] = {"/runner/",    "/parallel/", "/models/", "/backends/",
                                 "/profiling/", "/tests/",    "/bench/",  "/examples/"};
  const char* best = nullptr;
  for (const char* root : kRoots) {
    for (const char* p = std::strstr(file, root); p != nullptr; p = std::strstr(p + 1, root)) {
      best = p + 1;
    }
  }
  return best ? best : file;
}

std::string format(const char* file, int line, int rank, const std::string& check,
                   const std::string& message, const std::vector<std::string>& context) {
  std::ostringstream os;
  os << message;
  if (message.empty()) os << "check failed: " << check;
  for (auto it = context.rbegin(); it != context.rend(); ++it) os << "\n  while " << *it;
  os << "\n  at " << short_path(file) << ":" << line;
  if (rank >= 0) os << " (rank " << rank << ")";
  return os.str();
}

}  // namespace

Error::Error(const char* file, int line, const std::string& check, const std::string& message)
    : std::runtime_error(format(file, line, g_rank.load(), check, message, t_context)),
      file_(short_path(file)),
      line_(line),
      rank_(g_rank.load()),
      message_(message.empty() ? "check failed: " + check : message),
      context_(t_context) {}

void set_process_rank(int rank) { g_rank.store(rank); }
int process_rank() { return g_rank.load(); }

namespace detail {
ContextScope::ContextScope(std::string what) { t_context.push_back(std::move(what)); }
ContextScope::~ContextScope() { t_context.pop_back(); }
std::vector<std::string> current_context() { return t_context; }
}  // namespace detail
}  // namespace xfuser
