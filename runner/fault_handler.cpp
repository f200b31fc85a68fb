#include "runner/fault_handler.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <typeinfo>

#include "backends/error.h"
#include "parallel/mpi_env.h"

namespace xfuser::runner {
namespace {

std::atomic<int> g_stop_signal{0};
std::once_flag g_install_once;
std::once_flag g_watchdog_once;
// Alternate stack so a stack overflow (SIGSEGV on the guard page) still reaches the handler.
alignas(16) char g_alt_stack[64 * 1024];

// ---- async-signal-safe output (write(2) only, no allocation, no locks) ----------------------
void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void write_int(long v) {
  char buf[24];
  char* p = buf + sizeof(buf) - 1;
  *p = '\0';
  const bool neg = v < 0;
  unsigned long u = neg ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    *--p = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (neg) *--p = '-';
  write_str(p);
}

void write_prefix() {
  const int rank = process_rank();  // an atomic load: async-signal-safe
  if (rank < 0) {                   // before the rank is known: no "[rank -1]"
    write_str("xfuser: ");
    return;
  }
  write_str("xfuser: [rank ");
  write_int(rank);
  write_str("] ");
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV (invalid memory access)";
    case SIGBUS:
      return "SIGBUS (bus error)";
    case SIGFPE:
      return "SIGFPE (arithmetic error)";
    case SIGILL:
      return "SIGILL (illegal instruction)";
    case SIGABRT:
      return "SIGABRT (abort)";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal";
  }
}

void crash_handler(int sig, siginfo_t* info, void*) {
  write_prefix();
  write_str("fatal signal ");
  write_str(signal_name(sig));
  write_str(" (");
  write_int(sig);
  write_str(")");
  if (sig != SIGABRT && info != nullptr) {
    write_str(" at address 0x");
    char hex[2 * sizeof(void*) + 1];
    auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (int i = static_cast<int>(sizeof(hex)) - 2; i >= 0; --i) {
      hex[i] = "0123456789abcdef"[addr & 0xf];
      addr >>= 4;
    }
    hex[sizeof(hex) - 1] = '\0';
    write_str(hex);
  }
  write_str("; the process dies by this signal and the launcher ends the job. Backtrace:\n");
  // backtrace() was called once at install time, so libgcc is loaded and it does not allocate.
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  // Default action and re-raise: the exit status says which signal killed the rank.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

// What a first stop signal does, when not stopping a run after its current step (a service's
// drain): set once by set_stop_meaning, read by the handler (a pointer load is signal-safe).
std::atomic<const char*> g_stop_meaning{nullptr};

void stop_handler(int sig) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, sig)) {
    // Second stop signal: stop now.
    write_prefix();
    write_str("second stop signal: exiting now\n");
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    return;
  }
  write_prefix();
  write_str("received ");
  write_str(signal_name(sig));
  if (const char* what = g_stop_meaning.load()) {
    write_str(": ");
    write_str(what);
    write_str(" (send it again to stop at once)\n");
    return;
  }
  write_str(
      ": stopping after the current step (send it again to stop at once; under mpirun this "
      "usually means the launcher is ending the job after another rank's error, reported "
      "first)\n");
}

void terminate_handler() {
  std::string what = "no active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = std::string(typeid(ex).name()) + ": " + ex.what();
    } catch (...) {
      what = "an exception of unknown type";
    }
  }
  std::fprintf(stderr, "xfuser: [rank %d] std::terminate called (%s); aborting the job\n",
               process_rank(), what.c_str());
  std::fflush(stderr);
  parallel::MpiEnvironment::abort(134);
}

}  // namespace

void install_fault_handlers(int rank) {
  if (rank >= 0) set_process_rank(rank);
  std::call_once(g_install_once, [] {
    void* warm[4];
    ::backtrace(warm, 4);  // loads the unwinder now, outside any signal handler

    stack_t ss{};
    ss.ss_sp = g_alt_stack;
    ss.ss_size = sizeof(g_alt_stack);
    ss.ss_flags = 0;
    ::sigaltstack(&ss, nullptr);

    struct sigaction crash {};
    crash.sa_sigaction = crash_handler;
    crash.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&crash.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::sigaction(sig, &crash, nullptr);

    struct sigaction stop {};
    stop.sa_handler = stop_handler;
    stop.sa_flags = SA_RESTART;
    sigemptyset(&stop.sa_mask);
    for (int sig : {SIGTERM, SIGINT}) ::sigaction(sig, &stop, nullptr);

    std::set_terminate(terminate_handler);
  });
}

void start_parent_watchdog() {
  std::call_once(g_watchdog_once, [] {
    const pid_t parent = ::getppid();
    std::thread([parent] {
      while (true) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (::getppid() != parent) {
          write_prefix();
          write_str("the launcher (parent process ");
          write_int(parent);
          write_str(") is gone: exiting\n");
          std::_Exit(1);
        }
      }
    }).detach();
  });
}

int stop_signal() { return g_stop_signal.load(); }

void set_stop_meaning(const char* meaning) { g_stop_meaning.store(meaning); }

void check_stop_requested(const std::string& where) {
  const int sig = g_stop_signal.load();
  if (sig == 0) return;
  XF_THROW("stopped by ", sig == SIGINT ? "SIGINT" : "SIGTERM", " ", where,
           "; completed outputs are kept");
}

void reset_stop_request() { g_stop_signal.store(0); }

}  // namespace xfuser::runner
