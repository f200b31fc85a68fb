#include "runner/progress.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

namespace xfuser::runner {

Progress::Progress(int64_t total, bool tty, std::FILE* out)
    : total_(total), tty_(tty), out_(out), start_(std::chrono::steady_clock::now()) {}

double Progress::eta_seconds() const {
  if (done_ == 0) return -1;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_);
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

void Progress::draw(const std::string& detail) {
  constexpr int kWidth = 30;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
  std::string bar(filled, '#');
  bar += std::string(kWidth - filled, '.');
  const double eta = eta_seconds();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(out_, "\r[%s] %lld/%lld prompts | %s elapsed | ETA %s | %s\x1b[K", bar.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_),
               format_duration(elapsed).c_str(), eta < 0 ? "?" : format_duration(eta).c_str(),
               detail.c_str());
  if (done_ == total_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

void Progress::step(int step, int steps) {
  if (!tty_) return;
  draw("batch " + std::to_string(batches_ + 1) + " step " + std::to_string(step) + "/" +
       std::to_string(steps));
}

void Progress::batch_done(int64_t prompts, double seconds) {
  done_ += prompts;
  ++batches_;
  char detail[64];
  std::snprintf(detail, sizeof detail, "batch %lld: %.2f s", static_cast<long long>(batches_),
                seconds);
  if (tty_) {
    draw(detail);
    return;
  }
  const double eta = eta_seconds();
  spdlog::info("{}/{} prompts | {} | ETA {}", done_, total_, detail,
               eta < 0 ? "?" : format_duration(eta));
}

}  // namespace xfuser::runner
