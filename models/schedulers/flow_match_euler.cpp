#include "models/schedulers/flow_match_euler.h"

#include <cmath>
#include <fstream>

#include "backends/error.h"
#include "models/schedulers/scheduler_config.h"

namespace xfuser::models::schedulers {
namespace {

constexpr const char* kFlowMatchClassName = "FlowMatchEulerDiscreteScheduler";

// The shift and terminal stretch of set_timesteps, in the arithmetic type numpy uses: float64
// for the default schedule, float32 (Python scalars rounded to float32) for explicit sigmas.
template <typename T>
std::vector<T> shift_sigmas(std::vector<T> sigmas, const FlowMatchEulerConfig& config, double shift,
                            std::optional<double> mu) {
  if (config.use_dynamic_shifting) {
    const T m = static_cast<T>(*mu);
    const T exp_mu = static_cast<T>(std::exp(*mu));
    for (auto& s : sigmas) {
      const T odds = T(1) / s - T(1);  // (1/t - 1) ** 1.0
      switch (config.time_shift_type) {
        case TimeShiftType::kExponential:
          s = exp_mu / (exp_mu + odds);
          break;
        case TimeShiftType::kLinear:
          s = m / (m + odds);
          break;
      }
    }
  } else {
    const T k = static_cast<T>(shift);
    const T k1 = static_cast<T>(shift - 1.0);
    for (auto& s : sigmas) s = k * s / (T(1) + k1 * s);
  }
  if (config.shift_terminal && *config.shift_terminal != 0.0) {
    // stretch_shift_to_terminal: 1 - (1 - t) / ((1 - t[-1]) / (1 - shift_terminal)).
    const double scale = static_cast<double>(T(1) - sigmas.back()) / (1.0 - *config.shift_terminal);
    const T scale_t = static_cast<T>(scale);
    for (auto& s : sigmas) s = T(1) - (T(1) - s) / scale_t;
  }
  return sigmas;
}

}  // namespace

FlowMatchEulerConfig FlowMatchEulerConfig::from_json(const nlohmann::json& json) {
  XF_CHECK(json.is_object(), "scheduler config must be a JSON object");
  if (auto it = json.find("_class_name"); it != json.end() && it->is_string()) {
    XF_CHECK(it->get<std::string>() == kFlowMatchClassName, "scheduler config is for ",
             it->get<std::string>(), ", expected ", kFlowMatchClassName);
  }
  FlowMatchEulerConfig c;
  c.num_train_timesteps = config_value<int64_t>(json, "num_train_timesteps", c.num_train_timesteps);
  c.shift = config_value<double>(json, "shift", c.shift);
  c.use_dynamic_shifting = config_value<bool>(json, "use_dynamic_shifting", c.use_dynamic_shifting);
  c.base_shift = config_value<double>(json, "base_shift", c.base_shift);
  c.max_shift = config_value<double>(json, "max_shift", c.max_shift);
  c.base_image_seq_len = config_value<int64_t>(json, "base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = config_value<int64_t>(json, "max_image_seq_len", c.max_image_seq_len);
  c.invert_sigmas = config_value<bool>(json, "invert_sigmas", c.invert_sigmas);
  if (auto it = json.find("shift_terminal"); it != json.end() && !it->is_null()) {
    c.shift_terminal = config_value<double>(json, "shift_terminal", 0.0);
    XF_CHECK(*c.shift_terminal != 1.0, "scheduler config: shift_terminal must not be 1");
  }
  // stochastic_sampling: diffusers re-noises each step (x0 + sigma_next * noise) instead of the
  // Euler step; not built.
  for (const char* key :
       {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    XF_CHECK(!config_value<bool>(json, key, false), "scheduler config: ", key,
             "=true is not supported by ", kFlowMatchClassName, " here");
  }
  const auto type = config_value<std::string>(json, "time_shift_type", "exponential");
  if (type == "exponential") {
    c.time_shift_type = TimeShiftType::kExponential;
  } else if (type == "linear") {
    c.time_shift_type = TimeShiftType::kLinear;
  } else {
    XF_THROW("scheduler config: time_shift_type must be 'exponential' or 'linear', got '", type,
             "'");
  }
  XF_CHECK(c.num_train_timesteps > 0,
           "scheduler config: num_train_timesteps must be positive, got ", c.num_train_timesteps);
  // The static shift passes the same check as --flow_shift; dynamic shifting's mu bounds are
  // exponents (exp(mu)), so they need only be finite.
  if (!c.use_dynamic_shifting) check_flow_shift(c.shift, "scheduler config: shift");
  for (auto [key, value] :
       {std::pair{"base_shift", c.base_shift}, std::pair{"max_shift", c.max_shift}}) {
    XF_CHECK(std::isfinite(value), "scheduler config: ", key, " must be finite (got ", value, ")");
  }
  XF_CHECK(c.max_image_seq_len != c.base_image_seq_len,
           "scheduler config: max_image_seq_len equals base_image_seq_len (", c.base_image_seq_len,
           ")");
  return c;
}

FlowMatchEulerConfig FlowMatchEulerConfig::from_file(const std::filesystem::path& path) {
  const nlohmann::json json = read_scheduler_config(path);
  XF_CONTEXT("reading the scheduler config ", scheduler_config_file(path));  // names the file
  return from_json(json);
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift) {
  XF_CHECK(max_seq_len != base_seq_len, "calculate_shift: max_seq_len equals base_seq_len (",
           base_seq_len, ")");
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig config)
    : config_(std::move(config)), shift_(config_.shift) {
  c10::InferenceMode guard;
  const int64_t n = config_.num_train_timesteps;
  // linspace(1, N, N) reversed, / N and the static shift, all in float32.
  at::Tensor t = at::arange(n, 0, -1, at::kFloat);  // [N]
  at::Tensor sigmas = t / n;
  if (!config_.use_dynamic_shifting) sigmas = shift_ * sigmas / (1 + (shift_ - 1) * sigmas);
  timesteps_ = sigmas * n;
  sigmas_ = sigmas;
  sigma_min_ = sigmas[-1].item<float>();
  sigma_max_ = sigmas[0].item<float>();
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(
    int64_t num_inference_steps, const std::optional<std::vector<double>>& sigmas,
    std::optional<double> mu) {
  XF_CONTEXT("FlowMatchEulerDiscreteScheduler.set_timesteps(", num_inference_steps, ")");
  XF_CHECK(num_inference_steps > 0, "num_inference_steps must be positive, got ",
           num_inference_steps);
  XF_CHECK(!config_.use_dynamic_shifting || mu.has_value(),
           "mu must be given when use_dynamic_shifting is true");
  if (sigmas) {
    XF_CHECK(static_cast<int64_t>(sigmas->size()) == num_inference_steps, "got ", sigmas->size(),
             " sigmas for ", num_inference_steps, " steps");
    for (double s : *sigmas) {
      XF_CHECK(std::isfinite(s), "sigmas must be finite, got ", s);
    }
  }
  c10::InferenceMode guard;
  const auto n_train = static_cast<double>(config_.num_train_timesteps);
  std::vector<float> shifted(static_cast<size_t>(num_inference_steps));
  if (!sigmas) {
    std::vector<double> s =
        linspace(sigma_max_ * n_train, sigma_min_ * n_train, num_inference_steps);
    for (auto& v : s) v /= n_train;
    s = shift_sigmas<double>(std::move(s), config_, shift_, mu);
    for (size_t k = 0; k < s.size(); ++k) shifted[k] = static_cast<float>(s[k]);
  } else {
    std::vector<float> s(sigmas->begin(), sigmas->end());
    shifted = shift_sigmas<float>(std::move(s), config_, shift_, mu);
  }
  at::Tensor sig = at::tensor(shifted, at::kFloat);  // [n]
  at::Tensor timesteps = sig * config_.num_train_timesteps;
  if (config_.invert_sigmas) {
    sig = 1.0 - sig;
    timesteps = sig * config_.num_train_timesteps;
    sig = at::cat({sig, at::ones({1}, at::kFloat)});
  } else {
    sig = at::cat({sig, at::zeros({1}, at::kFloat)});
  }
  timesteps_ = timesteps;
  sigmas_ = sig;
  num_inference_steps_ = num_inference_steps;
}

at::Tensor FlowMatchEulerDiscreteScheduler::step(const at::Tensor& model_output, int64_t step_index,
                                                 const at::Tensor& sample) const {
  XF_CHECK(num_inference_steps_ > 0, "step() before set_timesteps()");
  XF_CHECK(step_index >= 0 && step_index < num_inference_steps_, "step index ", step_index,
           " out of range [0, ", num_inference_steps_, ")");
  XF_CHECK(model_output.sizes() == sample.sizes(), "step: model_output ", model_output.sizes(),
           " and sample ", sample.sizes(), " differ in shape");
  // 0-dim float32 tensors, so type promotion is diffusers' (dt * model_output keeps its dtype).
  const at::Tensor sigma = sigmas_[step_index];
  const at::Tensor sigma_next = sigmas_[step_index + 1];
  const at::Tensor dt = (sigma_next - sigma).to(model_output.device());
  at::Tensor prev = sample.to(at::kFloat) + dt * model_output;
  return prev.to(model_output.scalar_type());
}

at::Tensor FlowMatchEulerDiscreteScheduler::scale_noise(const at::Tensor& sample,
                                                        int64_t step_index,
                                                        const at::Tensor& noise) const {
  XF_CHECK(step_index >= 0 && step_index < sigmas_.size(0), "scale_noise: index ", step_index,
           " out of range [0, ", sigmas_.size(0), ")");
  XF_CHECK(noise.sizes() == sample.sizes(), "scale_noise: noise ", noise.sizes(), " and sample ",
           sample.sizes(), " differ in shape");
  std::vector<int64_t> shape(static_cast<size_t>(std::max<int64_t>(sample.dim(), 1)), 1);
  const at::Tensor sigma = sigmas_.to(sample.device(), sample.scalar_type())
                               .narrow(0, step_index, 1)
                               .reshape(shape);  // [1, ..., 1]
  return sigma * noise + (1.0 - sigma) * sample;
}

int64_t FlowMatchEulerDiscreteScheduler::index_for_timestep(double timestep) const {
  const at::Tensor matches = (timesteps_ == timestep).nonzero();
  XF_CHECK(matches.size(0) > 0, "timestep ", timestep, " is not in the schedule");
  return matches[matches.size(0) > 1 ? 1 : 0][0].item<int64_t>();
}

double FlowMatchEulerDiscreteScheduler::calculate_shift(int64_t image_seq_len) const {
  return schedulers::calculate_shift(image_seq_len, config_.base_image_seq_len,
                                     config_.max_image_seq_len, config_.base_shift,
                                     config_.max_shift);
}

}  // namespace xfuser::models::schedulers
