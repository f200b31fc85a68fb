// The request side of `xfuser serve`: jobs (one HTTP request's generation), their bounded queue
// and the batching of same-shape jobs into one generation, and the service's metrics. Plain C++:
// no model, no HTTP, no MPI (tests/test_serve.cpp drives it directly).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace xfuser::runner::serve {

using Clock = std::chrono::steady_clock;

enum class JobKind { kImage, kVideo };
enum class JobState { kQueued, kRunning, kCompleted, kFailed, kCancelled };
const char* job_state_name(JobState state);  // OpenAI's video statuses: queued, in_progress, ...

// An error answered to the client as OpenAI's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the field at fault, "" when none
  std::string type = "invalid_request_error";
  std::string code;
};

ApiError make_error(int status, const std::string& message,
                    const std::string& type = "invalid_request_error",
                    const std::string& param = "", const std::string& code = "");

// The inputs of one job: one prompt, `n` outputs (seeds seed, seed + 1, ...), and the values
// that must be equal for jobs to share a generation (batch_key).
struct JobInputs {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  int64_t seed = 0;
  int n = 1;
  std::optional<int> height;
  std::optional<int> width;
  std::optional<int> num_frames;
  std::optional<int> fps;
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> true_cfg_scale;
  std::optional<double> guidance_scale_2;
  std::optional<int> max_sequence_length;
  std::map<std::string, double> lora_scales;  // by adapter name (the service's unfused --lora)
  // Input pictures as uploaded (PNG or JPEG bytes), and their file extensions.
  std::vector<std::string> pictures;
  std::vector<std::string> picture_extensions;

  // Jobs with equal keys run in one generation: every value but the prompt, the seed and n.
  // A job with input pictures has a key of its own.
  std::string batch_key(const std::string& job_id) const;
};

struct Job {
  std::string id;
  JobKind kind = JobKind::kImage;
  JobInputs inputs;
  Clock::time_point created = Clock::now();
  int64_t created_unix = 0;
  std::string response_format = "b64_json";  // images: b64_json or url

  // Set by the scheduler and the generation loop; read under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable done;
  JobState state = JobState::kQueued;
  int progress = 0;  // percent of the denoising steps
  int64_t completed_unix = 0;
  std::vector<std::string> outputs;  // images: PNG bytes; videos: the MP4's path
  std::vector<std::string> output_names;
  std::vector<int64_t> output_seeds;
  ApiError error;

  bool finished() const {
    return state == JobState::kCompleted || state == JobState::kFailed ||
           state == JobState::kCancelled;
  }
  // Marks the job finished in `state` and wakes its waiters.
  void finish(JobState final_state);
  // Finishes it as failed with `error`.
  void fail(const ApiError& error);
  // Waits until finished or `deadline`; true when finished.
  bool wait_until(Clock::time_point deadline);
};

// Why submit() refused a job.
enum class SubmitResult { kQueued, kFull, kClosed };

// A bounded FIFO of jobs. The generation loop takes a batch at a time: the oldest job and the
// later ones with its batch key, up to `max_batch_outputs` outputs, waiting up to `batch_wait` for
// more to arrive.
class Scheduler {
 public:
  Scheduler(size_t max_queue, int max_batch_outputs, std::chrono::milliseconds batch_wait);

  SubmitResult submit(const std::shared_ptr<Job>& job);
  // The next batch, or empty when none arrived within `idle` (or at once when closed and empty).
  std::vector<std::shared_ptr<Job>> next_batch(std::chrono::milliseconds idle);
  // Removes a queued job (finished as cancelled); false when it is not queued.
  bool cancel(const std::string& id);
  // Refuses new jobs from now on (a drain); queued jobs still run.
  void close();
  bool closed() const;
  size_t queued() const;
  // Finishes every queued job as failed with `error` (the service is ending).
  void fail_all(const ApiError& error);

 private:
  const size_t max_queue_;
  const int max_batch_outputs_;
  const std::chrono::milliseconds batch_wait_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool closed_ = false;
};

// Prometheus metrics of the service (text exposition format 0.0.4).
class Metrics {
 public:
  void request(const std::string& endpoint, int status, double seconds);
  void batch(int outputs, int steps, double seconds);
  void set_queue_length(size_t n);
  std::string text(size_t queue_length, bool healthy) const;

  static const std::vector<double>& latency_buckets();

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, std::vector<int64_t>> latency_counts_;  // per endpoint, per bucket (+Inf)
  std::map<std::string, double> latency_sum_;
  std::map<std::string, int64_t> latency_count_;
  std::map<int, int64_t> batch_sizes_;
  int64_t outputs_ = 0;
  int64_t steps_ = 0;
  double generation_seconds_ = 0;
  double last_steps_per_second_ = 0;
};

}  // namespace xfuser::runner::serve
