// parallel::Watchdog with stand-in operations (atomic flags instead of CUDA events): completed
// entries are finished in order and drain() returns; an entry past its deadline or failing
// aborts the communicator once, then calls the fatal handler naming the operation, the group and
// the rank, and releases every other entry; later entries are released at once.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "parallel/watchdog.h"

namespace xfuser::parallel {
namespace {

using namespace std::chrono_literals;
using Clock = Watchdog::Clock;

// What a stand-in communicator saw.
struct Observed {
  std::atomic<int> aborts{0};
  std::atomic<int> fatals{0};
  std::atomic<int> completed{0};
  std::atomic<int> released{0};  // finished without completing
  std::mutex mutex;
  std::string fatal_message;
  std::vector<int> finish_order;
};

std::unique_ptr<Watchdog> make_watchdog(Observed& seen) {
  return std::make_unique<Watchdog>(
      "ring", [&seen] { ++seen.aborts; },
      [&seen](const std::string& message) {
        std::lock_guard<std::mutex> lock(seen.mutex);
        seen.fatal_message = message;
        ++seen.fatals;
      });
}

// An operation that completes when `flag` is set (or fails with `error` when that is set).
Watchdog::Entry entry(Observed& seen, int id, std::shared_ptr<std::atomic<bool>> flag,
                      Clock::duration timeout, std::shared_ptr<std::string> error = nullptr) {
  Watchdog::Entry e;
  e.what = "nccl recv from rank " + std::to_string(id) + " on group 'ring' (64 bytes)";
  e.deadline = Clock::now() + timeout;
  e.poll = [flag, error]() -> Watchdog::Status {
    if (error && !error->empty()) return {Watchdog::State::kFailed, *error};
    return {flag->load() ? Watchdog::State::kDone : Watchdog::State::kPending, ""};
  };
  e.finish = [&seen, id](bool completed) {
    if (completed) {
      std::lock_guard<std::mutex> lock(seen.mutex);
      seen.finish_order.push_back(id);
      ++seen.completed;
    } else {
      ++seen.released;
    }
  };
  return e;
}

TEST(Watchdog, CompletedOperationsFinishAndDrainReturns) {
  Observed seen;
  auto dog = make_watchdog(seen);
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  for (int i = 0; i < 20; ++i) {
    flags.push_back(std::make_shared<std::atomic<bool>>(false));
    dog->watch(entry(seen, i, flags.back(), 60s));
  }
  EXPECT_EQ(dog->pending(), 20u);
  std::thread completer([&flags] {
    for (auto& f : flags) {
      std::this_thread::sleep_for(1ms);
      f->store(true);  // in order, as operations on one stream complete
    }
  });
  dog->drain();
  completer.join();
  EXPECT_EQ(dog->pending(), 0u);
  EXPECT_EQ(seen.completed.load(), 20);
  EXPECT_EQ(seen.released.load(), 0);
  EXPECT_EQ(seen.aborts.load(), 0);
  EXPECT_EQ(seen.fatals.load(), 0);
  EXPECT_FALSE(dog->fired());
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(seen.finish_order, expected);
}

TEST(Watchdog, AnOperationPastItsDeadlineAbortsThenEndsTheJobNamingItAndItsPeer) {
  Observed seen;
  auto dog = make_watchdog(seen);
  auto done = std::make_shared<std::atomic<bool>>(true);
  auto stuck = std::make_shared<std::atomic<bool>>(false);
  auto later = std::make_shared<std::atomic<bool>>(false);
  dog->watch(entry(seen, 1, done, 60s));
  dog->watch(entry(seen, 3, stuck, 50ms));
  dog->watch(entry(seen, 5, later, 60s));
  const auto start = Clock::now();
  dog->drain();  // returns once the watchdog fired (the test's fatal handler returns)
  EXPECT_GE(Clock::now() - start, 40ms);
  EXPECT_TRUE(dog->fired());
  EXPECT_EQ(seen.aborts.load(), 1);
  EXPECT_EQ(seen.fatals.load(), 1);
  EXPECT_EQ(seen.completed.load(), 1);
  EXPECT_EQ(seen.released.load(), 2);  // the stuck one and the one behind it
  EXPECT_EQ(dog->pending(), 0u);
  const std::string message = dog->message();
  EXPECT_EQ(message, seen.fatal_message);
  EXPECT_NE(message.find("nccl recv from rank 3 on group 'ring'"), std::string::npos) << message;
  EXPECT_NE(message.find("did not complete before its deadline"), std::string::npos) << message;
  EXPECT_NE(message.find("watchdog of group 'ring', rank"), std::string::npos) << message;
  EXPECT_NE(message.find("aborted"), std::string::npos) << message;

  // After firing, new operations are released at once and nothing fires again.
  dog->watch(entry(seen, 7, later, 60s));
  EXPECT_EQ(seen.released.load(), 3);
  EXPECT_EQ(dog->pending(), 0u);
  EXPECT_EQ(seen.aborts.load(), 1);
  EXPECT_EQ(seen.fatals.load(), 1);
}

// An abort that does not return (ncclCommAbort waiting for a device that never finishes its
// queued work) does not hold the job: the fatal handler runs after the abort grace, while the
// abort still waits; the entries are released once it returns.
TEST(Watchdog, AnAbortThatDoesNotReturnStillEndsTheJobAfterTheGrace) {
  Observed seen;
  std::atomic<bool> release_abort{false};
  std::atomic<bool> abort_returned{false};
  std::atomic<bool> abort_waiting_at_fatal{false};
  Watchdog dog(
      "ring",
      [&] {
        ++seen.aborts;
        while (!release_abort.load()) std::this_thread::sleep_for(1ms);
        abort_returned = true;
      },
      [&](const std::string& message) {
        abort_waiting_at_fatal = !abort_returned.load();
        std::lock_guard<std::mutex> lock(seen.mutex);
        seen.fatal_message = message;
        ++seen.fatals;
      });
  dog.set_abort_grace(200ms);
  auto stuck = std::make_shared<std::atomic<bool>>(false);
  dog.watch(entry(seen, 3, stuck, 20ms));
  const auto start = Clock::now();
  std::thread releaser([&] {
    while (seen.fatals.load() == 0 && Clock::now() - start < 30s) std::this_thread::sleep_for(1ms);
    release_abort = true;  // a test's fatal handler returns: let the abort finish
  });
  dog.drain();
  releaser.join();
  const auto waited = Clock::now() - start;
  EXPECT_EQ(seen.fatals.load(), 1);
  EXPECT_TRUE(abort_waiting_at_fatal.load()) << "fatal waited for the abort";
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 20s);
  EXPECT_EQ(seen.aborts.load(), 1);
  EXPECT_EQ(seen.released.load(), 1);
  EXPECT_NE(seen.fatal_message.find("did not complete before its deadline"), std::string::npos)
      << seen.fatal_message;
}

TEST(Watchdog, AFailedOperationAbortsAndReportsTheError) {
  Observed seen;
  auto dog = make_watchdog(seen);
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto error = std::make_shared<std::string>();
  dog->watch(entry(seen, 2, flag, 60s, error));
  std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(dog->fired());
  *error = "NCCL reported remote process exited or there was a network error";
  dog->drain();
  EXPECT_EQ(seen.aborts.load(), 1);
  EXPECT_EQ(seen.fatals.load(), 1);
  EXPECT_EQ(seen.released.load(), 1);
  EXPECT_NE(seen.fatal_message.find("nccl recv from rank 2 on group 'ring' (64 bytes) failed"),
            std::string::npos)
      << seen.fatal_message;
  EXPECT_NE(seen.fatal_message.find("remote process exited"), std::string::npos)
      << seen.fatal_message;
}

TEST(Watchdog, APollThatThrowsCountsAsAFailure) {
  Observed seen;
  auto dog = make_watchdog(seen);
  Watchdog::Entry e;
  e.what = "nccl all_reduce on group 'world' (4 bytes)";
  e.deadline = Clock::now() + 60s;
  e.poll = []() -> Watchdog::Status { throw std::runtime_error("cudaEventQuery failed"); };
  dog->watch(std::move(e));
  dog->drain();
  EXPECT_EQ(seen.aborts.load(), 1);
  EXPECT_NE(seen.fatal_message.find("cudaEventQuery failed"), std::string::npos);
}

TEST(Watchdog, DestructionWaitsForPendingOperations) {
  Observed seen;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::thread completer;
  {
    auto dog = make_watchdog(seen);
    dog->watch(entry(seen, 4, flag, 60s));
    completer = std::thread([flag] {
      std::this_thread::sleep_for(20ms);
      flag->store(true);
    });
  }  // ~Watchdog drains: the operation completed, it was not released
  completer.join();
  EXPECT_EQ(seen.completed.load(), 1);
  EXPECT_EQ(seen.released.load(), 0);
  EXPECT_EQ(seen.fatals.load(), 0);
}

TEST(Watchdog, ManyThreadsWatchAtOnce) {
  Observed seen;
  auto dog = make_watchdog(seen);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&seen, &dog, t] {
      for (int i = 0; i < 250; ++i) {
        dog->watch(entry(seen, t * 1000 + i, std::make_shared<std::atomic<bool>>(true), 60s));
      }
    });
  }
  for (auto& th : threads) th.join();
  dog->drain();
  EXPECT_EQ(seen.completed.load(), 1000);
  EXPECT_EQ(dog->pending(), 0u);
  EXPECT_FALSE(dog->fired());
}

}  // namespace
}  // namespace xfuser::parallel
