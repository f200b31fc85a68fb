#include "parallel/watchdog.h"

#include <exception>
#include <future>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>

#include "backends/error.h"
#include "parallel/mpi_env.h"

namespace xfuser::parallel {

namespace {

// Polling interval while operations are in flight: short enough not to delay an error, long
// enough that the thread costs nothing next to the collectives it watches.
constexpr std::chrono::microseconds kPollInterval{200};

}  // namespace

Watchdog::Watchdog(std::string name, std::function<void()> abort, Fatal fatal,
                   std::function<void()> thread_init)
    : name_(std::move(name)),
      abort_(std::move(abort)),
      fatal_(fatal ? std::move(fatal) : Fatal(&Watchdog::default_fatal)),
      thread_init_(std::move(thread_init)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch(Entry entry) {
  if (fired_.load()) {
    if (entry.finish) entry.finish(false);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++pending_;
    incoming_.push_back(std::move(entry));
  }
  wake_.notify_all();
}

void Watchdog::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  drained_.wait(lock, [this] { return pending_.load() == 0; });
}

std::string Watchdog::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

void Watchdog::default_fatal(const std::string& /*message*/) {
  spdlog::default_logger()->flush();  // fire() logged the message before the abort
  MpiEnvironment::abort(1);
}

void Watchdog::fire(const std::string& message, std::vector<Entry>& active) {
  fired_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    message_ = message;
    for (auto& e : incoming_) active.push_back(std::move(e));
    incoming_.clear();
  }
  // Logged first: the abort below may wait on the device.
  spdlog::critical("[rank {}] {}", process_rank(), message);
  spdlog::default_logger()->flush();
  auto returned = std::make_shared<std::promise<void>>();
  std::future<void> aborted = returned->get_future();
  std::thread aborter([this, returned] {
    try {
      if (abort_) abort_();
    } catch (const std::exception& e) {
      spdlog::error("watchdog of group '{}': aborting the communicator failed: {}", name_,
                    e.what());
    }
    returned->set_value();
  });
  const bool in_time = aborted.wait_for(abort_grace_) == std::future_status::ready;
  if (!in_time) {
    spdlog::critical(
        "[rank {}] watchdog of group '{}': aborting the communicator did not return within {} ms "
        "(it waits for work already queued on the device); ending the job without it",
        process_rank(), name_, abort_grace_.count());
    spdlog::default_logger()->flush();
    fatal_(message);  // ends the job (default); a test's handler returns, and the abort is awaited
  }
  aborter.join();
  for (auto& e : active) {
    if (e.finish) e.finish(false);
  }
  if (in_time) fatal_(message);  // as above
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ -= active.size();
  }
  active.clear();
  drained_.notify_all();
}

void Watchdog::run() {
  try {
    if (thread_init_) thread_init_();
  } catch (const std::exception& e) {
    spdlog::error("watchdog of group '{}': thread set-up failed: {}", name_, e.what());
  }
  std::vector<Entry> active;  // this thread's only
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (active.empty()) {
        wake_.wait(lock, [this] { return stop_ || !incoming_.empty(); });
      } else {
        wake_.wait_for(lock, kPollInterval, [this] { return stop_ || !incoming_.empty(); });
      }
      for (auto& e : incoming_) active.push_back(std::move(e));
      incoming_.clear();
      if (stop_ && active.empty()) return;
    }
    if (fired_.load()) {  // watched while the watchdog fired: released, never fired twice
      for (auto& e : active) {
        if (e.finish) e.finish(false);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_ -= active.size();
      }
      active.clear();
      drained_.notify_all();
      continue;
    }
    // Oldest first: on one stream they complete in order.
    std::size_t done = 0;
    for (std::size_t i = 0; i < active.size();) {
      Entry& e = active[i];
      Status status;
      try {
        status = e.poll();
      } catch (const std::exception& ex) {
        status = {State::kFailed, ex.what()};
      }
      if (status.state == State::kPending && Clock::now() > e.deadline) {
        fire(e.what + " did not complete before its deadline (watchdog of group '" + name_ +
                 "', rank " + std::to_string(process_rank()) +
                 "): a peer did not take part; the communicator was aborted",
             active);
        break;
      }
      if (status.state == State::kFailed) {
        fire(e.what + " failed (watchdog of group '" + name_ + "', rank " +
                 std::to_string(process_rank()) + "): " + status.error +
                 "; the communicator was aborted",
             active);
        break;
      }
      if (status.state == State::kDone) {
        try {
          if (e.finish) e.finish(true);
        } catch (const std::exception& ex) {
          spdlog::error("watchdog of group '{}': finishing {} failed: {}", name_, e.what,
                        ex.what());
        }
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        ++done;
        continue;
      }
      ++i;
    }
    if (done > 0) {
      bool empty = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        pending_ -= done;
        empty = pending_.load() == 0;
      }
      if (empty) drained_.notify_all();
    }
  }
}

}  // namespace xfuser::parallel
