// A thread that watches the operations the host does not wait for: the NCCL backend enqueues
// collectives and point-to-point operations and returns at once, and its Watchdog polls each one
// until it is done. When one fails or outlives its deadline, the watchdog aborts the
// communicator (so no kernel waits forever on a peer) and ends the job through its fatal
// handler, naming the operation, the group and the peer; the message is logged with the rank
// before the abort, and the default handler calls MPI_Abort (every rank of the job ends, none
// hangs). The abort runs on a thread of its own and the job ends after at most the abort grace
// whether or not it returned: ncclCommAbort frees device memory, which waits for the work already
// queued on the device, so a device that never finishes that work would hold the abort forever.
//
// Written for NCCL but free of CUDA: an entry is a poll function, so the logic is tested on the
// CPU with stand-in operations (tests/test_watchdog.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace xfuser::parallel {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  enum class State { kPending, kDone, kFailed };
  struct Status {
    State state = State::kPending;
    std::string error;  // why, when kFailed
  };

  struct Entry {
    std::string what;  // "nccl recv from rank 3 on group 'ring' (4096 bytes)"
    Clock::time_point deadline;
    // Called on the watchdog thread until it returns kDone or kFailed.
    std::function<Status()> poll;
    // Called once on the watchdog thread when the entry leaves: true when it completed, false
    // when the watchdog fired (after the abort). Releases what the operation kept alive.
    std::function<void(bool completed)> finish;
  };

  using Fatal = std::function<void(const std::string& message)>;

  // `name` (the group) goes into messages. `abort` runs once, on a thread of its own, when an
  // entry fails or times out; `fatal` follows when it returns or after the abort grace. `fatal`
  // defaults to default_fatal. `thread_init` runs first on the thread (the NCCL backend selects its
  // CUDA device there).
  Watchdog(std::string name, std::function<void()> abort, Fatal fatal = {},
           std::function<void()> thread_init = {});
  // Waits for the entries still pending (each bounded by its deadline), then stops the thread.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `entry` from now on. After the watchdog fired, the entry is finished (false) at once.
  void watch(Entry entry);
  // Blocks until no entry is pending (each is bounded by its deadline, or the watchdog fires).
  void drain();
  std::size_t pending() const { return pending_.load(); }
  bool fired() const { return fired_.load(); }
  // The message the watchdog fired with ("" before).
  std::string message() const;

  // How long `fatal` waits for `abort` to return (default 10 s). Set before the first watch().
  void set_abort_grace(std::chrono::milliseconds grace) { abort_grace_ = grace; }

  // Flushes the log, then ends every rank (MPI_Abort, or _Exit without MPI) with exit code 1.
  [[noreturn]] static void default_fatal(const std::string& message);

 private:
  void run();
  void fire(const std::string& message, std::vector<Entry>& active);

  std::string name_;
  std::function<void()> abort_;
  Fatal fatal_;
  std::function<void()> thread_init_;
  std::chrono::milliseconds abort_grace_{10000};

  mutable std::mutex mutex_;
  std::condition_variable wake_;     // new entries, stop
  std::condition_variable drained_;  // pending_ reached 0
  std::deque<Entry> incoming_;
  bool stop_ = false;
  std::string message_;
  std::atomic<std::size_t> pending_{0};
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

}  // namespace xfuser::parallel
