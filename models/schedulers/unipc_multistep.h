// UniPCMultistepScheduler, equal to diffusers v0.33.1 and v0.42.1 step by step (Wan 2.1 / 2.2:
// prediction_type "flow_prediction", use_flow_sigmas, flow_shift, solver_order 2, bh2, predict_x0,
// lower_order_final).
//
// The scheduler is stateful like diffusers': step() keeps the last solver_order converted model
// outputs, the sample before the last predictor (for the corrector), the warm-up count and the
// step index. set_timesteps() and reset() clear that history; one generation per schedule.
//
// Quirks kept on purpose: the per-step scalars (sigma, alpha, lambda, h, B(h), the rho
// coefficients) are float32 0-dim tensors as in diffusers, so they round as diffusers does; with
// solver_type "bh1" the last step to a zero sigma gives NaN in diffusers (B(h) = -inf times a zero
// residual), and it does here too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace xfuser::models::schedulers {

enum class UniPCPrediction { kEpsilon, kSample, kVPrediction, kFlowPrediction };
enum class UniPCSolverType { kBh1, kBh2 };
enum class BetaSchedule { kLinear, kScaledLinear, kSquaredCosCapV2 };
enum class TimestepSpacing { kLinspace, kLeading, kTrailing };
enum class FinalSigmasType { kZero, kSigmaMin };
// The flow sigmas before the shift (use_flow_sigmas). diffusers changed them in 0.42:
//   kFromOne:    linspace(1, 1/T, n+1)[:-1], a first sigma of 1 lowered by 1e-6 (diffusers >= 0.42)
//   kReference:  linspace(1 - 1/T, 0, n+1)[:-1] (Wan's own FlowUniPCMultistepScheduler and
//                diffusers <= 0.41)
// With shift 8 and 3 steps the timesteps are [999, 941, 800] and [999, 941, 799].
enum class FlowSigmas { kFromOne, kReference };

struct UniPCMultistepConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.0001;
  double beta_end = 0.02;
  BetaSchedule beta_schedule = BetaSchedule::kLinear;
  int64_t solver_order = 2;
  UniPCPrediction prediction_type = UniPCPrediction::kEpsilon;
  double sample_max_value = 1.0;  // only used by thresholding, which is not supported
  bool predict_x0 = true;
  UniPCSolverType solver_type = UniPCSolverType::kBh2;
  bool lower_order_final = true;
  std::vector<int64_t> disable_corrector;
  bool use_flow_sigmas = false;
  double flow_shift = 1.0;
  TimestepSpacing timestep_spacing = TimestepSpacing::kLinspace;
  int64_t steps_offset = 0;
  FinalSigmasType final_sigmas_type = FinalSigmasType::kZero;
  bool rescale_betas_zero_snr = false;
  // From the config's _diffusers_version: kReference when it names a diffusers before 0.42 (the
  // published Wan folders), else kFromOne (today's diffusers). A run may override it.
  FlowSigmas flow_sigmas = FlowSigmas::kFromOne;

  // From scheduler_config.json's object with diffusers' defaults; unknown keys are ignored.
  // Unsupported settings (thresholding, trained_betas, solver_p, karras / exponential / beta
  // sigmas, an unknown prediction_type / solver_type / beta_schedule / timestep_spacing /
  // final_sigmas_type) raise xfuser::Error naming the key.
  static UniPCMultistepConfig from_json(const nlohmann::json& json);
  // From a scheduler_config.json file, or a folder holding one.
  static UniPCMultistepConfig from_file(const std::filesystem::path& path);
};

class UniPCMultistepScheduler {
 public:
  explicit UniPCMultistepScheduler(UniPCMultistepConfig config = {});

  const UniPCMultistepConfig& config() const { return config_; }

  // Sets the schedule for n steps and clears the multistep history (as diffusers does).
  void set_timesteps(int64_t num_inference_steps);
  // Clears the multistep history and the step index for a new generation on the same schedule.
  void reset();

  const at::Tensor& timesteps() const { return timesteps_; }  // [n] int64, CPU
  const at::Tensor& sigmas() const { return sigmas_; }        // [n + 1] float32, CPU, final last
  int64_t num_inference_steps() const { return num_inference_steps_; }
  // The index of the next step (-1 before the first step of a generation).
  int64_t step_index() const { return step_index_; }
  // Makes the first step() start at this schedule index (diffusers' set_begin_index, img2img).
  void set_begin_index(int64_t begin_index);
  // diffusers' index_for_timestep: the second match when the timestep repeats; error if absent.
  int64_t index_for_timestep(int64_t timestep) const;

  // One UniPC step (corrector on the previous predictor's result, then predictor) from the current
  // step index; the first call of a generation finds the index from `timestep` (or the begin
  // index), later calls check that `timestep` is the schedule's timestep at the step index.
  // Returns the next sample in sample's dtype.
  at::Tensor step(const at::Tensor& model_output, int64_t timestep, const at::Tensor& sample);

  // A copy of this scheduler (schedule, step index, order warm-up) whose multistep history holds
  // only elements [start, start + length) along `dim` of the samples: from then on it steps that
  // part of the sample exactly as this scheduler would step the whole (every UniPC update is
  // element-wise), e.g. one PipeFusion patch of the tokens.
  UniPCMultistepScheduler narrowed(int64_t dim, int64_t start, int64_t length) const;

 private:
  at::Tensor convert_model_output(const at::Tensor& model_output, const at::Tensor& sample) const;
  at::Tensor uni_p_update(const at::Tensor& sample, int64_t order) const;
  at::Tensor uni_c_update(const at::Tensor& this_model_output, const at::Tensor& last_sample,
                          const at::Tensor& this_sample, int64_t order) const;
  // (alpha_t, sigma_t) for schedule sigma i, float32 0-dim tensors.
  std::pair<at::Tensor, at::Tensor> alpha_sigma(int64_t i) const;
  at::Tensor lambda(int64_t i) const;

  UniPCMultistepConfig config_;
  at::Tensor alphas_cumprod_;  // [num_train_timesteps] float32
  int64_t num_inference_steps_ = 0;
  at::Tensor timesteps_;
  at::Tensor sigmas_;
  // History: model_outputs_[solver_order - 1] is the newest (undefined tensors before warm-up).
  std::vector<at::Tensor> model_outputs_;
  at::Tensor last_sample_;
  int64_t lower_order_nums_ = 0;
  int64_t this_order_ = 0;
  int64_t step_index_ = -1;
  int64_t begin_index_ = -1;
};

}  // namespace xfuser::models::schedulers
