#include "runner/progress.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

namespace xfuser::runner {

Progress::Progress(int64_t total, bool tty, std::FILE* out, bool log)
    : total_(total), tty_(tty), log_(log), out_(out), start_(std::chrono::steady_clock::now()) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::done_fraction() const {
  double done = static_cast<double>(done_);
  if (steps_ > 0 && step_ < steps_) {
    // The running batch: its size is that of the last one (the first: at most what is left).
    const int64_t batch = batch_size_ > 0 ? batch_size_ : total_ - done_;
    done += static_cast<double>(std::min(batch, total_ - done_)) * step_ / steps_;
  }
  return done;
}

double Progress::rate() const {
  const double t = elapsed();
  const double done = done_fraction();
  return t > 0 && done > 0 ? done / t : 0.0;
}

double Progress::eta_seconds() const {
  const double r = rate();
  if (r <= 0) return -1;
  return (static_cast<double>(total_) - done_fraction()) / r;
}

std::string Progress::format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

std::string Progress::status() const {
  std::string s = std::to_string(done_) + "/" + std::to_string(total_) + " images";
  if (steps_ > 0 && step_ < steps_) {
    s += " (batch " + std::to_string(batches_ + 1) + " step " + std::to_string(step_) + "/" +
         std::to_string(steps_) + ")";
  }
  char rate_text[32];
  std::snprintf(rate_text, sizeof rate_text, "%.3g images/s", rate());
  const double eta = eta_seconds();
  return s + " | " + rate_text + " | " + format_duration(elapsed()) + " elapsed | " +
         (eta < 0 ? std::string("? left") : format_duration(eta) + " left");
}

void Progress::draw() {
  constexpr int kWidth = 30;
  const int filled = total_ > 0
                         ? static_cast<int>(kWidth * done_fraction() / static_cast<double>(total_))
                         : kWidth;
  std::string bar(std::clamp(filled, 0, kWidth), '#');
  bar += std::string(kWidth - bar.size(), '.');
  std::fprintf(out_, "\r[%s] %s\x1b[K", bar.c_str(), status().c_str());
  if (done_ == total_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

void Progress::step(int step, int steps) {
  step_ = step;
  steps_ = steps;
  if (tty_) draw();
}

void Progress::batch_done(int64_t prompts, double seconds) {
  done_ += prompts;
  ++batches_;
  batch_size_ = prompts;
  step_ = steps_ = 0;
  if (tty_) {
    draw();
    return;
  }
  if (log_) spdlog::info("{} | batch {}: {:.2f} s", status(), batches_, seconds);
}

}  // namespace xfuser::runner
