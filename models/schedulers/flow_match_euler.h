// FlowMatchEulerDiscreteScheduler, equal to diffusers v0.33.1 (FLUX, SD3, Wan, HunyuanVideo).
//
// Quirk kept on purpose: with a static shift, __init__ already shifts the 1000 training sigmas,
// so set_timesteps' default linspace runs between the shifted ends and shifts again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace xfuser::models::schedulers {

enum class TimeShiftType { kExponential, kLinear };

struct FlowMatchEulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;
  TimeShiftType time_shift_type = TimeShiftType::kExponential;

  // From scheduler_config.json's object; unknown keys are ignored, unsupported settings
  // (karras / exponential / beta sigmas) raise xfuser::Error.
  static FlowMatchEulerConfig from_json(const nlohmann::json& json);
  // From a scheduler_config.json file, or a folder holding one.
  static FlowMatchEulerConfig from_file(const std::filesystem::path& path);
};

// FLUX/SD3 resolution-dependent shift: linear in the image sequence length.
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len = 256,
                       int64_t max_seq_len = 4096, double base_shift = 0.5,
                       double max_shift = 1.15);

class FlowMatchEulerDiscreteScheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(FlowMatchEulerConfig config = {});

  const FlowMatchEulerConfig& config() const { return config_; }

  // Sets the schedule for n steps. sigmas: explicit per-step sigmas (size n) before shifting;
  // mu: the dynamic shift (required when use_dynamic_shifting).
  void set_timesteps(int64_t num_inference_steps,
                     const std::optional<std::vector<double>>& sigmas = std::nullopt,
                     std::optional<double> mu = std::nullopt);

  const at::Tensor& timesteps() const { return timesteps_; }  // [n] float32
  const at::Tensor& sigmas() const { return sigmas_; }        // [n + 1] float32, terminal last
  int64_t num_inference_steps() const { return num_inference_steps_; }
  double sigma_min() const { return sigma_min_; }
  double sigma_max() const { return sigma_max_; }
  double shift() const { return shift_; }
  void set_shift(double shift) { shift_ = shift; }

  // One Euler step from schedule index i: sample + (sigma[i+1] - sigma[i]) * model_output,
  // with the sample upcast to float32 and the result cast to model_output's dtype.
  at::Tensor step(const at::Tensor& model_output, int64_t step_index,
                  const at::Tensor& sample) const;
  // Forward process (img2img): sigma[i] * noise + (1 - sigma[i]) * sample, in sample's dtype.
  at::Tensor scale_noise(const at::Tensor& sample, int64_t step_index,
                         const at::Tensor& noise) const;
  // diffusers' index_for_timestep: the second match when the timestep repeats.
  int64_t index_for_timestep(double timestep) const;

  // calculate_shift with this scheduler's base/max shift and sequence lengths.
  double calculate_shift(int64_t image_seq_len) const;

 private:
  FlowMatchEulerConfig config_;
  double shift_;
  double sigma_min_ = 0.0;
  double sigma_max_ = 1.0;
  int64_t num_inference_steps_ = 0;
  at::Tensor timesteps_;
  at::Tensor sigmas_;
};

}  // namespace xfuser::models::schedulers
