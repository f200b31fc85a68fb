#include "runner/serve/scheduler.h"

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

namespace xfuser::runner::serve {

const char* job_state_name(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "in_progress";
    case JobState::kCompleted:
      return "completed";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string JobInputs::batch_key(const std::string& job_id) const {
  nlohmann::json key = {{"negative", negative_prompt.has_value()}};
  auto put = [&](const char* name, const auto& value) {
    if (value) key[name] = *value;
  };
  put("height", height);
  put("width", width);
  put("num_frames", num_frames);
  put("fps", fps);
  put("num_inference_steps", num_inference_steps);
  put("guidance_scale", guidance_scale);
  put("true_cfg_scale", true_cfg_scale);
  put("guidance_scale_2", guidance_scale_2);
  put("max_sequence_length", max_sequence_length);
  if (!lora_scales.empty()) key["lora_scales"] = lora_scales;
  if (!pictures.empty()) key["job"] = job_id;
  return key.dump();
}

ApiError make_error(int status, const std::string& message, const std::string& type,
                    const std::string& param, const std::string& code) {
  ApiError e;
  e.status = status;
  e.message = message;
  e.type = type;
  e.param = param;
  e.code = code;
  return e;
}

void Job::fail(const ApiError& error) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (finished()) return;
    this->error = error;
  }
  finish(JobState::kFailed);
}

void Job::finish(JobState final_state) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (finished()) return;
    state = final_state;
    completed_unix = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    if (final_state == JobState::kCompleted) progress = 100;
  }
  done.notify_all();
}

bool Job::wait_until(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex);
  return done.wait_until(lock, deadline, [&] { return finished(); });
}

Scheduler::Scheduler(size_t max_queue, int max_batch_outputs, std::chrono::milliseconds batch_wait)
    : max_queue_(max_queue), max_batch_outputs_(max_batch_outputs), batch_wait_(batch_wait) {}

SubmitResult Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return SubmitResult::kClosed;
    if (queue_.size() >= max_queue_) return SubmitResult::kFull;
    queue_.push_back(job);
  }
  arrived_.notify_all();
  return SubmitResult::kQueued;
}

std::vector<std::shared_ptr<Job>> Scheduler::next_batch(std::chrono::milliseconds idle) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!arrived_.wait_for(lock, idle, [&] { return !queue_.empty() || closed_; })) return {};
  if (queue_.empty()) return {};
  const std::string key = queue_.front()->inputs.batch_key(queue_.front()->id);
  // Outputs of the queued jobs with this key (in order, as many as fit in a batch).
  auto fitting = [&] {
    int outputs = 0;
    for (const auto& job : queue_) {
      if (job->inputs.batch_key(job->id) != key) continue;
      if (outputs > 0 && outputs + job->inputs.n > max_batch_outputs_) break;
      outputs += job->inputs.n;
    }
    return outputs;
  };
  // More jobs of this shape may arrive: wait up to batch_wait for a full batch.
  const auto until = Clock::now() + batch_wait_;
  while (fitting() < max_batch_outputs_ && !closed_) {
    if (arrived_.wait_until(lock, until) == std::cv_status::timeout) break;
  }
  std::vector<std::shared_ptr<Job>> batch;
  int outputs = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto& job = *it;
    if (job->inputs.batch_key(job->id) != key ||
        (outputs > 0 && outputs + job->inputs.n > max_batch_outputs_)) {
      ++it;
      continue;
    }
    outputs += job->inputs.n;
    batch.push_back(job);
    it = queue_.erase(it);
    if (outputs >= max_batch_outputs_) break;
  }
  for (const auto& job : batch) {
    std::lock_guard<std::mutex> job_lock(job->mutex);
    job->state = JobState::kRunning;
  }
  return batch;
}

bool Scheduler::cancel(const std::string& id) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it =
        std::find_if(queue_.begin(), queue_.end(), [&](const auto& j) { return j->id == id; });
    if (it == queue_.end()) return false;
    job = *it;
    queue_.erase(it);
  }
  job->finish(JobState::kCancelled);
  return true;
}

void Scheduler::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  arrived_.notify_all();
}

bool Scheduler::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

size_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

void Scheduler::fail_all(const ApiError& error) {
  std::deque<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs.swap(queue_);
    closed_ = true;
  }
  for (const auto& job : jobs) job->fail(error);
  arrived_.notify_all();
}

const std::vector<double>& Metrics::latency_buckets() {
  static const std::vector<double> buckets = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  return buckets;
}

void Metrics::request(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{endpoint, status}];
  const auto& buckets = latency_buckets();
  auto& counts = latency_counts_[endpoint];
  counts.resize(buckets.size() + 1, 0);
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (seconds <= buckets[i]) ++counts[i];
  }
  ++counts.back();  // +Inf
  latency_sum_[endpoint] += seconds;
  ++latency_count_[endpoint];
}

void Metrics::batch(int outputs, int steps, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++batch_sizes_[outputs];
  outputs_ += outputs;
  steps_ += steps;
  generation_seconds_ += seconds;
  if (seconds > 0) last_steps_per_second_ = steps / seconds;
}

std::string Metrics::text(size_t queue_length, bool healthy) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream os;
  os << "# HELP xfuser_queue_length Jobs waiting for a generation.\n"
     << "# TYPE xfuser_queue_length gauge\n"
     << "xfuser_queue_length " << queue_length << "\n"
     << "# HELP xfuser_healthy 1 while every rank serves.\n"
     << "# TYPE xfuser_healthy gauge\n"
     << "xfuser_healthy " << (healthy ? 1 : 0) << "\n"
     << "# HELP xfuser_requests_total HTTP requests answered, by endpoint and status.\n"
     << "# TYPE xfuser_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    os << "xfuser_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} "
       << n << "\n";
  }
  os << "# HELP xfuser_request_seconds Time from a request's arrival to its answer.\n"
     << "# TYPE xfuser_request_seconds histogram\n";
  const auto& buckets = latency_buckets();
  for (const auto& [endpoint, counts] : latency_counts_) {
    for (size_t i = 0; i <= buckets.size(); ++i) {
      os << "xfuser_request_seconds_bucket{endpoint=\"" << endpoint << "\",le=\"";
      if (i < buckets.size()) {
        os << buckets[i];
      } else {
        os << "+Inf";
      }
      os << "\"} " << counts[i] << "\n";
    }
    os << "xfuser_request_seconds_sum{endpoint=\"" << endpoint << "\"} "
       << latency_sum_.at(endpoint) << "\n"
       << "xfuser_request_seconds_count{endpoint=\"" << endpoint << "\"} "
       << latency_count_.at(endpoint) << "\n";
  }
  os << "# HELP xfuser_batches_total Generations run, by the outputs they made together.\n"
     << "# TYPE xfuser_batches_total counter\n";
  for (const auto& [size, n] : batch_sizes_) {
    os << "xfuser_batches_total{outputs=\"" << size << "\"} " << n << "\n";
  }
  os << "# HELP xfuser_outputs_total Images and videos generated.\n"
     << "# TYPE xfuser_outputs_total counter\n"
     << "xfuser_outputs_total " << outputs_ << "\n"
     << "# HELP xfuser_denoising_steps_total Denoising steps run (one per step of a batch).\n"
     << "# TYPE xfuser_denoising_steps_total counter\n"
     << "xfuser_denoising_steps_total " << steps_ << "\n"
     << "# HELP xfuser_generation_seconds_total Time spent generating.\n"
     << "# TYPE xfuser_generation_seconds_total counter\n"
     << "xfuser_generation_seconds_total " << generation_seconds_ << "\n"
     << "# HELP xfuser_steps_per_second Denoising steps per second of the last batch.\n"
     << "# TYPE xfuser_steps_per_second gauge\n"
     << "xfuser_steps_per_second " << last_steps_per_second_ << "\n";
  return os.str();
}

}  // namespace xfuser::runner::serve
