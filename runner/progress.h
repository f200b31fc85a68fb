// Progress of a dataset run: a bar with ETA on a terminal, plain log lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace xfuser::runner {

class Progress {
 public:
  // `total`: prompts this rank will generate; `tty`: draw a bar on `out` (else log lines).
  Progress(int64_t total, bool tty, std::FILE* out = stderr);

  // After a denoising step of the current batch (redraws the bar on a terminal).
  void step(int step, int steps);
  // After a batch of `prompts` prompts finished in `seconds`.
  void batch_done(int64_t prompts, double seconds);

  int64_t done() const { return done_; }
  // Estimated seconds left (negative: unknown yet).
  double eta_seconds() const;

  // "1:02:03" / "2:03".
  static std::string format_duration(double seconds);

 private:
  void draw(const std::string& detail);

  int64_t total_;
  int64_t done_ = 0;
  int64_t batches_ = 0;
  bool tty_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace xfuser::runner
