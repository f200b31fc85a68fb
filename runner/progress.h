// Progress of a dataset run over images and denoising steps: a bar on a terminal, plain log lines
// otherwise; done / total, rate and time left.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace xfuser::runner {

class Progress {
 public:
  // `total`: images this rank's group will generate; `tty`: draw a bar on `out`; `log`: write
  // a log line per finished batch when there is no bar (false: track only, show nothing).
  Progress(int64_t total, bool tty, std::FILE* out = stderr, bool log = true);

  // After a denoising step of the current batch (redraws the bar on a terminal).
  void step(int step, int steps);
  // After a batch of `prompts` images finished in `seconds`.
  void batch_done(int64_t prompts, double seconds);

  int64_t done() const { return done_; }
  // Images finished, counting the current batch's finished steps as a fraction of it.
  double done_fraction() const;
  // Images per second so far (0: unknown yet).
  double rate() const;
  // Estimated seconds left (negative: unknown yet).
  double eta_seconds() const;
  // "12/40 images (batch 7 step 3/28) | 0.21 images/s | 1:02 elapsed | 2:14 left".
  std::string status() const;

  // "1:02:03" / "2:03".
  static std::string format_duration(double seconds);

 private:
  void draw();
  double elapsed() const;

  int64_t total_;
  int64_t done_ = 0;
  int64_t batches_ = 0;
  int64_t batch_size_ = 0;  // images of the last finished batch: the current one's estimate
  int step_ = 0, steps_ = 0;
  bool tty_;
  bool log_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace xfuser::runner
