// Multi-rank fault handling of xfuser-run (docs/errors.md "Faults"): a rank killed with SIGKILL
// mid-step, SIGTERM to mpirun, an exception or SIGSEGV in rank 1, a rank stalled past
// --comm_timeout, mpirun itself killed. Each job must end within 30 s with a non-zero exit, leave
// no process behind, and leave the outputs of an earlier complete run byte-identical (and no
// temporary files). Run at np 2 and np 4 (oversubscribed). Labelled "faults slow".
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "tests/background_job.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using xfuser::testing::Job;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The files of a folder and their contents (what "intact" is checked against).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    files[e.path().filename().string()] = read_file(e.path());
  }
  return files;
}

// Live processes whose command line contains `marker` (the job's unique output folder), read
// from /proc as `pgrep -f` does (zombies have an empty command line and are not counted).
int processes_with(const std::string& marker) {
  int count = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoi(name) == ::getpid()) continue;
    std::string cmdline = read_file(e.path() / "cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    if (cmdline.find(marker) != std::string::npos) ++count;
  }
  return count;
}

struct Layout {
  int np;
  std::string flags;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << "np " << l.np << " " << l.flags; }

class Faults : public ::testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() { cache_ = new xfuser::testing::TempDir("xfuser-faults-cache"); }
  static void TearDownTestSuite() {
    delete cache_;
    cache_ = nullptr;
  }

  void SetUp() override {
    out_ = std::make_unique<xfuser::testing::TempDir>("xfuser-faults-out");
    // A complete earlier run in the same folder: its outputs must survive every fault.
    std::string log;
    ASSERT_EQ(xfuser::testing::run_command(
                  "XFUSER_CACHE=" + cache_->path().string() + " " + bin() +
                      " --model tiny-flux --prompt earlier --height 32 --width 32 "
                      "--num_inference_steps 1 --output_directory " +
                      out_->path().string(),
                  &log),
              0)
        << log;
    before_ = snapshot(out_->path());
    ASSERT_FALSE(before_.empty());
  }

  static std::string bin() {
    return (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  }

  // mpirun + xfuser-run on the tiny model; `env`: extra VAR=value exported to every rank.
  std::string command(const std::string& extra, const std::string& env = "") const {
    std::string cmd = "env XFUSER_CACHE=" + cache_->path().string() + " OMP_NUM_THREADS=1 " + env +
                      " mpirun -np " + std::to_string(GetParam().np) + " --oversubscribe";
    if (::geteuid() == 0) cmd += " --allow-run-as-root";
    cmd += " -x XFUSER_CACHE -x OMP_NUM_THREADS";
    if (!env.empty()) cmd += " -x " + env.substr(0, env.find('='));
    return cmd + " " + bin() + " --model tiny-flux --prompt x --height 64 --width 64 " +
           GetParam().flags + " " + extra + " --output_directory " + out_->path().string();
  }

  // The checks every fault shares: ended within 30 s, non-zero, nothing left behind, earlier
  // outputs intact (same names, same bytes, no temporary files).
  void expect_clean_failure(Job& job) {
    const bool ended = job.wait(30.0);
    EXPECT_TRUE(ended) << "job still running after 30 s\n" << job.log();
    if (!ended) return;
    EXPECT_NE(job.exit_code(), 0) << job.log();
    EXPECT_LT(job.seconds(), 30.0);
    // Ranks may outlive mpirun by the time it takes the kernel to reap them.
    int left = 0;
    for (int i = 0; i < 50 && (left = processes_with(out_->path().string())) > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(left, 0) << "processes left behind\n" << job.log();
    const auto after = snapshot(out_->path());
    EXPECT_EQ(after.size(), before_.size()) << job.log();
    for (const auto& [name, bytes] : before_) {
      auto it = after.find(name);
      ASSERT_NE(it, after.end()) << name << " lost";
      EXPECT_EQ(std::hash<std::string>{}(it->second), std::hash<std::string>{}(bytes))
          << name << " changed";
    }
  }

  static xfuser::testing::TempDir* cache_;
  std::unique_ptr<xfuser::testing::TempDir> out_;
  std::map<std::string, std::string> before_;
  xfuser::testing::TempDir logs_{"xfuser-faults-log"};
};
xfuser::testing::TempDir* Faults::cache_ = nullptr;

TEST_P(Faults, ARankKilledWithSigkillMidStepEndsTheJob) {
  // Rank 1 hangs inside step 1 (it prints its pid), its peers wait in a collective with a
  // generous --comm_timeout: only mpirun's watch over its children can end the job quickly.
  Job job(command("--num_inference_steps 3 --comm_timeout 300", "XFUSER_INJECT_FAILURE=1:1:stall"),
          logs_ / "log");
  const std::string pid = job.wait_for_log("injected stall .* pid ([0-9]+)", 60);
  ASSERT_FALSE(pid.empty()) << job.log();
  ASSERT_EQ(::kill(std::stoi(pid), SIGKILL), 0);
  expect_clean_failure(job);
}

TEST_P(Faults, SigtermToMpirunEndsEveryRank) {
  // 5000 steps: mpirun forwards the ranks' output in chunks, so "step 2" can reach the log long
  // after step 2; 200 steps (~4 s of tiny-flux) sometimes ended before the signal was sent.
  Job job(command("--num_inference_steps 5000 --comm_timeout 300 --log_level debug"),
          logs_ / "log");
  ASSERT_FALSE(job.wait_for_log("denoising step 2/5000", 60).empty()) << job.log();
  ASSERT_EQ(::kill(job.pid(), SIGTERM), 0);
  expect_clean_failure(job);
}

TEST_P(Faults, AnExceptionInRank1EndsTheJobWithTheReason) {
  Job job(command("--num_inference_steps 3 --comm_timeout 300", "XFUSER_INJECT_FAILURE=1:1"),
          logs_ / "log");
  expect_clean_failure(job);
  EXPECT_NE(job.log().find("injected failure (XFUSER_INJECT_FAILURE) on rank 1"), std::string::npos)
      << job.log();
}

TEST_P(Faults, ASegfaultInRank1IsLoggedAndEndsTheJob) {
  Job job(command("--num_inference_steps 3 --comm_timeout 300", "XFUSER_INJECT_FAILURE=1:1:segv"),
          logs_ / "log");
  expect_clean_failure(job);
  EXPECT_NE(job.log().find("[rank 1] fatal signal SIGSEGV"), std::string::npos) << job.log();
}

TEST_P(Faults, ARankStalledPastCommTimeoutIsNamedAndTheJobAborts) {
  Job job(command("--num_inference_steps 3 --comm_timeout 3", "XFUSER_INJECT_FAILURE=1:1:stall"),
          logs_ / "log");
  expect_clean_failure(job);
  const std::string log = job.log();
  EXPECT_NE(log.find("timed out after 3s in "), std::string::npos) << log;
  EXPECT_NE(log.find("on group '"), std::string::npos) << log;
}

TEST_P(Faults, RanksExitWhenMpirunIsKilled) {
  // SIGKILL to mpirun: nobody forwards a signal. The ranks lose their connection to mpirun (Open
  // MPI ends a rank whose lifeline drops) and their parent watchdog sees the launcher gone;
  // their stderr went through mpirun, so no message can reach the log: the test checks that
  // every rank is gone.
  Job job(command("--num_inference_steps 3 --comm_timeout 300", "XFUSER_INJECT_FAILURE=1:1:stall"),
          logs_ / "log");
  ASSERT_FALSE(job.wait_for_log("injected stall", 60).empty()) << job.log();
  ASSERT_EQ(::kill(job.pid(), SIGKILL), 0);
  expect_clean_failure(job);
}

INSTANTIATE_TEST_SUITE_P(Np, Faults,
                         ::testing::Values(Layout{2, "--ulysses_degree 2"},
                                           Layout{4, "--ulysses_degree 2 --ring_degree 2"}),
                         [](const auto& info) { return "np" + std::to_string(info.param.np); });

TEST(FaultsOneRank, SigtermStopsAfterTheCurrentStep) {
  xfuser::testing::TempDir cache, out, logs;
  Job job("env XFUSER_CACHE=" + cache.path().string() + " OMP_NUM_THREADS=1 " +
              (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string() +
              " --model tiny-flux --prompt x --height 64 --width 64 --num_inference_steps 500 "
              "--log_level debug --output_directory " +
              out.path().string(),
          logs / "log");
  ASSERT_FALSE(job.wait_for_log("denoising step 2/500", 120).empty()) << job.log();
  ASSERT_EQ(::kill(job.pid(), SIGTERM), 0);
  ASSERT_TRUE(job.wait(30)) << job.log();
  EXPECT_NE(job.exit_code(), 0);
  const std::string log = job.log();
  EXPECT_NE(log.find("received SIGTERM: stopping after the current step"), std::string::npos)
      << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("stopped by SIGTERM after denoising step "
                                                "[0-9]+/500; completed outputs are kept")))
      << log;
  EXPECT_TRUE(fs::is_empty(out.path())) << "nothing was complete, nothing written";
}

}  // namespace
