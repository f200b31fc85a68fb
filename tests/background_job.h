// A shell command run in the background, in its own process group, its output in a log file:
// the multi-process tests (faults, the HTTP service) start, watch, signal and reap programs
// with it. Killed with its group when the object goes, if still running.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <sys/wait.h>

namespace xfuser::testing {

class Job {
 public:
  using Clock = std::chrono::steady_clock;
  Job(const std::string& command, const std::filesystem::path& log) : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const std::string cmd = "exec " + command + " > '" + log.string() + "' 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    start_ = Clock::now();
  }
  ~Job() {
    if (!done_) {
      ::kill(-pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(log_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits until the log matches `pattern` (returns the first capture group, or the match).
  std::string wait_for_log(const std::string& pattern, double seconds) {
    const std::regex re(pattern);
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      const std::string text = log();
      std::smatch m;
      if (std::regex_search(text, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
      if (finished()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "";
  }
  bool finished() {
    if (done_) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
      status_ = status;
      seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
    }
    return done_;
  }
  // Waits up to `seconds` for the job to end; false (and the job killed) when it did not.
  bool wait(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      if (finished()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  int exit_code() const {
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  double seconds() const { return seconds_; }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  Clock::time_point start_;
  bool done_ = false;
  int status_ = 0;
  double seconds_ = 0;
};

}  // namespace xfuser::testing
