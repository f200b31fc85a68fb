#include "models/schedulers/unipc_multistep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "backends/error.h"
#include "models/schedulers/scheduler_config.h"
#include "models/weights/hub_cache.h"

namespace xfuser::models::schedulers {
namespace {

constexpr const char* kUniPCClassName = "UniPCMultistepScheduler";

// numpy's round: half to even (the default floating-point rounding mode).
double round_half_even(double v) { return std::nearbyint(v); }

// diffusers' betas_for_alpha_bar (cosine, max_beta 0.999), in Python floats, then float32.
at::Tensor cosine_betas(int64_t n) {
  auto alpha_bar = [](double t) {
    const double c = std::cos((t + 0.008) / 1.008 * M_PI / 2.0);
    return c * c;
  };
  std::vector<float> betas;
  for (int64_t i = 0; i < n; ++i) {
    const double t1 = static_cast<double>(i) / static_cast<double>(n);
    const double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
    betas.push_back(static_cast<float>(std::min(1.0 - alpha_bar(t2) / alpha_bar(t1), 0.999)));
  }
  return at::tensor(betas, at::kFloat);
}

// diffusers' rescale_zero_terminal_snr, float32 throughout.
at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas) {
  at::Tensor alphas_bar_sqrt = at::cumprod((1.0 - betas).to(at::kDouble), 0).to(at::kFloat).sqrt();
  const at::Tensor first = alphas_bar_sqrt[0].clone();
  const at::Tensor last = alphas_bar_sqrt[-1].clone();
  alphas_bar_sqrt = alphas_bar_sqrt - last;
  alphas_bar_sqrt = alphas_bar_sqrt * (first / (first - last));
  const at::Tensor alphas_bar = alphas_bar_sqrt.pow(2);
  const int64_t n = alphas_bar.size(0);
  at::Tensor alphas = alphas_bar.slice(0, 1) / alphas_bar.slice(0, 0, n - 1);
  alphas = at::cat({alphas_bar.slice(0, 0, 1), alphas});
  return 1 - alphas;
}

}  // namespace

UniPCMultistepConfig UniPCMultistepConfig::from_json(const nlohmann::json& json) {
  XF_CHECK(json.is_object(), "scheduler config must be a JSON object");
  if (auto it = json.find("_class_name"); it != json.end() && it->is_string()) {
    XF_CHECK(it->get<std::string>() == kUniPCClassName, "scheduler config is for ",
             it->get<std::string>(), ", expected ", kUniPCClassName);
  }
  UniPCMultistepConfig c;
  c.num_train_timesteps = config_value<int64_t>(json, "num_train_timesteps", c.num_train_timesteps);
  c.beta_start = config_value<double>(json, "beta_start", c.beta_start);
  c.beta_end = config_value<double>(json, "beta_end", c.beta_end);
  c.solver_order = config_value<int64_t>(json, "solver_order", c.solver_order);
  c.sample_max_value = config_value<double>(json, "sample_max_value", c.sample_max_value);
  c.predict_x0 = config_value<bool>(json, "predict_x0", c.predict_x0);
  c.lower_order_final = config_value<bool>(json, "lower_order_final", c.lower_order_final);
  c.disable_corrector =
      config_value<std::vector<int64_t>>(json, "disable_corrector", c.disable_corrector);
  c.use_flow_sigmas = config_value<bool>(json, "use_flow_sigmas", c.use_flow_sigmas);
  c.flow_shift = config_value<double>(json, "flow_shift", c.flow_shift);
  c.steps_offset = config_value<int64_t>(json, "steps_offset", c.steps_offset);
  c.rescale_betas_zero_snr = config_value<bool>(json, "rescale_betas_zero_snr", false);
  if (saved_before_diffusers(json, 0, 42)) c.flow_sigmas = FlowSigmas::kReference;

  const auto schedule = config_value<std::string>(json, "beta_schedule", "linear");
  if (schedule == "linear") {
    c.beta_schedule = BetaSchedule::kLinear;
  } else if (schedule == "scaled_linear") {
    c.beta_schedule = BetaSchedule::kScaledLinear;
  } else if (schedule == "squaredcos_cap_v2") {
    c.beta_schedule = BetaSchedule::kSquaredCosCapV2;
  } else {
    XF_THROW("scheduler config: beta_schedule '", schedule,
             "' is not one of linear, scaled_linear, squaredcos_cap_v2");
  }
  const auto prediction = config_value<std::string>(json, "prediction_type", "epsilon");
  if (prediction == "epsilon") {
    c.prediction_type = UniPCPrediction::kEpsilon;
  } else if (prediction == "sample") {
    c.prediction_type = UniPCPrediction::kSample;
  } else if (prediction == "v_prediction") {
    c.prediction_type = UniPCPrediction::kVPrediction;
  } else if (prediction == "flow_prediction") {
    c.prediction_type = UniPCPrediction::kFlowPrediction;
  } else {
    XF_THROW("scheduler config: prediction_type '", prediction,
             "' is not one of epsilon, sample, v_prediction, flow_prediction");
  }
  // diffusers maps the DPM-Solver names onto bh2.
  const auto solver = config_value<std::string>(json, "solver_type", "bh2");
  if (solver == "bh1") {
    c.solver_type = UniPCSolverType::kBh1;
  } else if (solver == "bh2" || solver == "midpoint" || solver == "heun" || solver == "logrho") {
    c.solver_type = UniPCSolverType::kBh2;
  } else {
    XF_THROW("scheduler config: solver_type '", solver, "' is not one of bh1, bh2");
  }
  const auto spacing = config_value<std::string>(json, "timestep_spacing", "linspace");
  if (spacing == "linspace") {
    c.timestep_spacing = TimestepSpacing::kLinspace;
  } else if (spacing == "leading") {
    c.timestep_spacing = TimestepSpacing::kLeading;
  } else if (spacing == "trailing") {
    c.timestep_spacing = TimestepSpacing::kTrailing;
  } else {
    XF_THROW("scheduler config: timestep_spacing '", spacing,
             "' is not one of linspace, leading, trailing");
  }
  const auto final_type = config_value<std::string>(json, "final_sigmas_type", "zero");
  if (final_type == "zero") {
    c.final_sigmas_type = FinalSigmasType::kZero;
  } else if (final_type == "sigma_min") {
    c.final_sigmas_type = FinalSigmasType::kSigmaMin;
  } else {
    XF_THROW("scheduler config: final_sigmas_type '", final_type,
             "' is not one of zero, sigma_min");
  }

  // Settings that change the schedule and are not built: errors naming the key, never ignored
  // (use_dynamic_shifting and shift_terminal came with diffusers' flow-matching UniPC).
  for (const char* key : {"thresholding", "use_karras_sigmas", "use_exponential_sigmas",
                          "use_beta_sigmas", "use_dynamic_shifting"}) {
    XF_CHECK(!config_value<bool>(json, key, false), "scheduler config: ", key,
             "=true is not supported by ", kUniPCClassName, " here");
  }
  for (const char* key : {"trained_betas", "solver_p", "shift_terminal"}) {
    const auto it = json.find(key);
    XF_CHECK(it == json.end() || it->is_null(), "scheduler config: ", key, " is not supported by ",
             kUniPCClassName, " here (must be null)");
  }
  XF_CHECK(c.num_train_timesteps > 1,
           "scheduler config: num_train_timesteps must be at least 2, got ", c.num_train_timesteps);
  XF_CHECK(c.solver_order >= 1, "scheduler config: solver_order must be positive, got ",
           c.solver_order);
  XF_CHECK(c.predict_x0 || c.prediction_type != UniPCPrediction::kFlowPrediction,
           "scheduler config: prediction_type 'flow_prediction' needs predict_x0=true");
  check_flow_shift(c.flow_shift, "scheduler config: flow_shift");
  return c;
}

UniPCMultistepConfig UniPCMultistepConfig::from_file(const std::filesystem::path& path) {
  const nlohmann::json json = read_scheduler_config(path);
  XF_CONTEXT("reading the scheduler config ", scheduler_config_file(path));  // names the file
  return from_json(json);
}

UniPCMultistepScheduler::UniPCMultistepScheduler(UniPCMultistepConfig config)
    : config_(std::move(config)) {
  c10::InferenceMode guard;
  const int64_t n = config_.num_train_timesteps;
  at::Tensor betas;
  switch (config_.beta_schedule) {
    case BetaSchedule::kLinear:
      betas = at::linspace(config_.beta_start, config_.beta_end, n, at::kFloat);
      break;
    case BetaSchedule::kScaledLinear:
      betas =
          at::linspace(std::sqrt(config_.beta_start), std::sqrt(config_.beta_end), n, at::kFloat)
              .pow(2);
      break;
    case BetaSchedule::kSquaredCosCapV2:
      betas = cosine_betas(n);
      break;
  }
  if (config_.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  // torch's CPU cumprod accumulates float32 in double (libtorch 1.13's does not): do so here.
  alphas_cumprod_ = at::cumprod((1.0 - betas).to(at::kDouble), 0).to(at::kFloat);
  if (config_.rescale_betas_zero_snr) alphas_cumprod_[-1].fill_(std::ldexp(1.0, -24));
  model_outputs_.assign(static_cast<size_t>(config_.solver_order), at::Tensor());
}

void UniPCMultistepScheduler::set_timesteps(int64_t num_inference_steps) {
  XF_CONTEXT(kUniPCClassName, ".set_timesteps(", num_inference_steps, ")");
  XF_CHECK(num_inference_steps > 0, "num_inference_steps must be positive, got ",
           num_inference_steps);
  c10::InferenceMode guard;
  const int64_t n_train = config_.num_train_timesteps;
  const int64_t n = num_inference_steps;
  std::vector<int64_t> timesteps;
  std::vector<float> sigmas;
  if (config_.use_flow_sigmas) {
    // Float64 as numpy; timesteps = int64(sigma * N) (truncation).
    const std::vector<double> base = linspace(1.0, 1.0 / static_cast<double>(n_train), n + 1);
    const double s = config_.flow_shift;
    std::vector<double> sig;
    for (int64_t j = 0; j < n; ++j) {
      // kReference: sigma = 1 - alpha with alphas = base, flipped, the last (zero) dropped.
      // kFromOne: base[:-1] itself.
      const double v = config_.flow_sigmas == FlowSigmas::kReference
                           ? 1.0 - base[static_cast<size_t>(n - j)]
                           : base[static_cast<size_t>(j)];
      sig.push_back(s * v / (1.0 + (s - 1.0) * v));
    }
    // diffusers >= 0.42: a first sigma within 1e-6 of 1 is lowered by 1e-6 (log(alpha) finite).
    if (config_.flow_sigmas == FlowSigmas::kFromOne && std::fabs(sig[0] - 1.0) < 1e-6) {
      sig[0] -= 1e-6;
    }
    for (double v : sig) {
      timesteps.push_back(static_cast<int64_t>(v * static_cast<double>(n_train)));
      sigmas.push_back(static_cast<float>(v));
    }
    sigmas.push_back(config_.final_sigmas_type == FinalSigmasType::kZero
                         ? 0.0f
                         : static_cast<float>(sig.back()));
  } else {
    switch (config_.timestep_spacing) {
      case TimestepSpacing::kLinspace: {
        const std::vector<double> t = linspace(0.0, static_cast<double>(n_train - 1), n + 1);
        for (int64_t j = 0; j < n; ++j)
          timesteps.push_back(static_cast<int64_t>(round_half_even(t[static_cast<size_t>(n - j)])));
        break;
      }
      case TimestepSpacing::kLeading: {
        const int64_t ratio = n_train / (n + 1);
        for (int64_t j = 0; j < n; ++j) timesteps.push_back((n - j) * ratio + config_.steps_offset);
        break;
      }
      case TimestepSpacing::kTrailing: {
        // np.arange(N, 0, -N/n): ceil(N / ratio) values N + i * delta, delta = (N - ratio) - N.
        const double start = static_cast<double>(n_train);
        const double ratio = start / static_cast<double>(n);
        const double delta = (start - ratio) - start;
        const auto len = static_cast<int64_t>(std::ceil((0.0 - start) / -ratio));
        for (int64_t i = 0; i < len; ++i)
          timesteps.push_back(
              static_cast<int64_t>(round_half_even(start + static_cast<double>(i) * delta)) - 1);
        break;
      }
    }
    // np.interp on the integer grid: the training sigma at each timestep, clamped at the ends.
    const at::Tensor train_sigmas = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
    const float* ts = train_sigmas.data_ptr<float>();
    for (int64_t t : timesteps) sigmas.push_back(ts[std::clamp<int64_t>(t, 0, n_train - 1)]);
    sigmas.push_back(config_.final_sigmas_type == FinalSigmasType::kZero ? 0.0f : ts[0]);
  }
  sigmas_ = at::tensor(sigmas, at::kFloat);
  timesteps_ = at::tensor(timesteps, at::kLong);
  num_inference_steps_ = static_cast<int64_t>(timesteps.size());
  begin_index_ = -1;
  reset();
}

void UniPCMultistepScheduler::reset() {
  model_outputs_.assign(static_cast<size_t>(config_.solver_order), at::Tensor());
  last_sample_ = at::Tensor();
  lower_order_nums_ = 0;
  this_order_ = 0;
  step_index_ = -1;
}

void UniPCMultistepScheduler::set_begin_index(int64_t begin_index) {
  XF_CHECK(num_inference_steps_ > 0, "set_begin_index() before set_timesteps()");
  XF_CHECK(begin_index >= 0 && begin_index < num_inference_steps_, "begin index ", begin_index,
           " out of range [0, ", num_inference_steps_, ")");
  begin_index_ = begin_index;
}

int64_t UniPCMultistepScheduler::index_for_timestep(int64_t timestep) const {
  XF_CHECK(num_inference_steps_ > 0, "index_for_timestep() before set_timesteps()");
  const at::Tensor matches = (timesteps_ == timestep).nonzero();
  XF_CHECK(matches.size(0) > 0, "timestep ", timestep, " is not in the schedule");
  return matches[matches.size(0) > 1 ? 1 : 0][0].item<int64_t>();
}

std::pair<at::Tensor, at::Tensor> UniPCMultistepScheduler::alpha_sigma(int64_t i) const {
  const at::Tensor sigma = sigmas_[i];  // float32 0-dim
  if (config_.use_flow_sigmas) return {1 - sigma, sigma};
  const at::Tensor alpha = 1 / (sigma.pow(2) + 1).pow(0.5);
  return {alpha, sigma * alpha};
}

at::Tensor UniPCMultistepScheduler::lambda(int64_t i) const {
  const auto [alpha, sigma] = alpha_sigma(i);
  return at::log(alpha) - at::log(sigma);
}

at::Tensor UniPCMultistepScheduler::convert_model_output(const at::Tensor& model_output,
                                                         const at::Tensor& sample) const {
  const auto [alpha_t, sigma_t] = alpha_sigma(step_index_);
  if (config_.predict_x0) {
    switch (config_.prediction_type) {
      case UniPCPrediction::kEpsilon:
        return (sample - sigma_t * model_output) / alpha_t;
      case UniPCPrediction::kSample:
        return model_output;
      case UniPCPrediction::kVPrediction:
        return alpha_t * sample - sigma_t * model_output;
      case UniPCPrediction::kFlowPrediction:
        return sample - sigmas_[step_index_] * model_output;
    }
  }
  switch (config_.prediction_type) {
    case UniPCPrediction::kEpsilon:
      return model_output;
    case UniPCPrediction::kSample:
      return (sample - alpha_t * model_output) / sigma_t;
    case UniPCPrediction::kVPrediction:
      return alpha_t * model_output + sigma_t * sample;
    case UniPCPrediction::kFlowPrediction:
      break;
  }
  XF_THROW("prediction_type flow_prediction needs predict_x0");
}

namespace {

// The B(h) coefficients shared by UniP and UniC: h_phi_1, B_h and the R / b system.
struct BhCoefficients {
  at::Tensor h_phi_1, b_h, r, b;  // float32 (0-dim, 0-dim, [order, order], [order])
};

BhCoefficients bh_coefficients(const at::Tensor& h, std::vector<at::Tensor> rks, int64_t order,
                               bool predict_x0, UniPCSolverType solver) {
  rks.push_back(at::ones({}, h.options()));
  const at::Tensor rk = at::stack(rks);
  const at::Tensor hh = predict_x0 ? -h : h;
  BhCoefficients c;
  c.h_phi_1 = at::expm1(hh);  // h * phi_1(h) = e^h - 1
  at::Tensor h_phi_k = c.h_phi_1 / hh - 1;
  int64_t factorial = 1;
  c.b_h = solver == UniPCSolverType::kBh1 ? hh : at::expm1(hh);
  std::vector<at::Tensor> r_rows, b_vals;
  for (int64_t i = 1; i <= order; ++i) {
    r_rows.push_back(at::pow(rk, i - 1));
    b_vals.push_back(h_phi_k * factorial / c.b_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  c.r = at::stack(r_rows);
  c.b = at::stack(b_vals);
  return c;
}

// einsum("k,bkc...->bc...", rhos[:k], D1s): sum_k rhos[k] * D1s[k].
at::Tensor weighted_sum(const at::Tensor& rhos, const std::vector<at::Tensor>& d1s) {
  at::Tensor out = rhos[0] * d1s[0];
  for (size_t k = 1; k < d1s.size(); ++k) out = out + rhos[static_cast<int64_t>(k)] * d1s[k];
  return out;
}

}  // namespace

at::Tensor UniPCMultistepScheduler::uni_p_update(const at::Tensor& sample, int64_t order) const {
  const at::Tensor& m0 = model_outputs_.back();
  const at::Tensor& x = sample;
  const int64_t i0 = step_index_;
  const auto [alpha_t, sigma_t] = alpha_sigma(i0 + 1);
  const auto [alpha_s0, sigma_s0] = alpha_sigma(i0);
  const at::Tensor lambda_s0 = lambda(i0);
  const at::Tensor h = lambda(i0 + 1) - lambda_s0;

  std::vector<at::Tensor> rks, d1s;
  const auto n_hist = static_cast<int64_t>(model_outputs_.size());
  for (int64_t i = 1; i < order; ++i) {
    const at::Tensor& mi = model_outputs_[static_cast<size_t>(n_hist - (i + 1))];
    const at::Tensor rk = (lambda(i0 - i) - lambda_s0) / h;
    rks.push_back(rk);
    d1s.push_back((mi - m0) / rk);
  }
  const BhCoefficients c = bh_coefficients(h, rks, order, config_.predict_x0, config_.solver_type);
  at::Tensor rhos_p;
  if (!d1s.empty()) {
    rhos_p = order == 2 ? at::full({1}, 0.5, at::TensorOptions().dtype(x.scalar_type()))
                        : at::linalg_solve(c.r.slice(0, 0, order - 1).slice(1, 0, order - 1),
                                           c.b.slice(0, 0, order - 1))
                              .to(x.scalar_type());
  }
  at::Tensor x_t;
  if (config_.predict_x0) {
    const at::Tensor x_t_ = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
    x_t = d1s.empty() ? x_t_ - alpha_t * c.b_h * 0
                      : x_t_ - alpha_t * c.b_h * weighted_sum(rhos_p, d1s);
  } else {
    const at::Tensor x_t_ = alpha_t / alpha_s0 * x - sigma_t * c.h_phi_1 * m0;
    x_t = d1s.empty() ? x_t_ - sigma_t * c.b_h * 0
                      : x_t_ - sigma_t * c.b_h * weighted_sum(rhos_p, d1s);
  }
  return x_t.to(x.scalar_type());
}

at::Tensor UniPCMultistepScheduler::uni_c_update(const at::Tensor& this_model_output,
                                                 const at::Tensor& last_sample,
                                                 const at::Tensor& this_sample,
                                                 int64_t order) const {
  const at::Tensor& m0 = model_outputs_.back();
  const at::Tensor& x = last_sample;
  const at::Tensor& model_t = this_model_output;
  const int64_t i0 = step_index_;
  const auto [alpha_t, sigma_t] = alpha_sigma(i0);
  const auto [alpha_s0, sigma_s0] = alpha_sigma(i0 - 1);
  const at::Tensor lambda_s0 = lambda(i0 - 1);
  const at::Tensor h = lambda(i0) - lambda_s0;
  (void)this_sample;  // diffusers takes it only for its device

  std::vector<at::Tensor> rks, d1s;
  const auto n_hist = static_cast<int64_t>(model_outputs_.size());
  for (int64_t i = 1; i < order; ++i) {
    const at::Tensor& mi = model_outputs_[static_cast<size_t>(n_hist - (i + 1))];
    const at::Tensor rk = (lambda(i0 - (i + 1)) - lambda_s0) / h;
    rks.push_back(rk);
    d1s.push_back((mi - m0) / rk);
  }
  const BhCoefficients c = bh_coefficients(h, rks, order, config_.predict_x0, config_.solver_type);
  const at::Tensor rhos_c = order == 1
                                ? at::full({1}, 0.5, at::TensorOptions().dtype(x.scalar_type()))
                                : at::linalg_solve(c.r, c.b).to(x.scalar_type());
  const at::Tensor d1_t = model_t - m0;
  const at::Tensor rho_last = rhos_c[-1];
  at::Tensor x_t;
  if (config_.predict_x0) {
    const at::Tensor x_t_ = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
    const at::Tensor corr =
        d1s.empty() ? rho_last * d1_t : weighted_sum(rhos_c, d1s) + rho_last * d1_t;
    x_t = x_t_ - alpha_t * c.b_h * corr;
  } else {
    const at::Tensor x_t_ = alpha_t / alpha_s0 * x - sigma_t * c.h_phi_1 * m0;
    const at::Tensor corr =
        d1s.empty() ? rho_last * d1_t : weighted_sum(rhos_c, d1s) + rho_last * d1_t;
    x_t = x_t_ - sigma_t * c.b_h * corr;
  }
  return x_t.to(x.scalar_type());
}

at::Tensor UniPCMultistepScheduler::step(const at::Tensor& model_output, int64_t timestep,
                                         const at::Tensor& sample) {
  XF_CONTEXT(kUniPCClassName, ".step(timestep ", timestep, ")");
  XF_CHECK(num_inference_steps_ > 0, "step() before set_timesteps()");
  XF_CHECK(model_output.defined() && sample.defined(), "step: model_output or sample is undefined");
  XF_CHECK(model_output.sizes() == sample.sizes(), "step: model_output ", model_output.sizes(),
           " and sample ", sample.sizes(), " differ in shape");
  XF_CHECK(model_output.device() == sample.device(), "step: model_output on ",
           model_output.device(), " but sample on ", sample.device());
  XF_CHECK(
      at::isFloatingType(sample.scalar_type()) && at::isFloatingType(model_output.scalar_type()),
      "step: model_output (", model_output.scalar_type(), ") and sample (", sample.scalar_type(),
      ") must be floating point");
  c10::InferenceMode guard;
  if (step_index_ < 0) {
    step_index_ = begin_index_ >= 0 ? begin_index_ : index_for_timestep(timestep);
  }
  XF_CHECK(step_index_ < num_inference_steps_, "step: all ", num_inference_steps_,
           " steps are done; call reset() or set_timesteps() for a new generation");
  const int64_t expected = timesteps_[step_index_].item<int64_t>();
  XF_CHECK(timestep == expected, "step: timestep ", timestep, " is not the schedule's timestep ",
           expected, " at step index ", step_index_);

  const bool corrector_disabled =
      std::find(config_.disable_corrector.begin(), config_.disable_corrector.end(),
                step_index_ - 1) != config_.disable_corrector.end();
  const bool use_corrector = step_index_ > 0 && !corrector_disabled && last_sample_.defined();

  const at::Tensor converted = convert_model_output(model_output, sample);
  at::Tensor x = sample;
  if (use_corrector) x = uni_c_update(converted, last_sample_, x, this_order_);

  std::rotate(model_outputs_.begin(), model_outputs_.begin() + 1, model_outputs_.end());
  model_outputs_.back() = converted;

  int64_t order = config_.solver_order;
  if (config_.lower_order_final) order = std::min(order, num_inference_steps_ - step_index_);
  this_order_ = std::min(order, lower_order_nums_ + 1);  // warm-up for the multistep

  last_sample_ = x;
  at::Tensor prev = uni_p_update(x, this_order_);
  if (lower_order_nums_ < config_.solver_order) ++lower_order_nums_;
  ++step_index_;
  return prev;
}

UniPCMultistepScheduler UniPCMultistepScheduler::narrowed(int64_t dim, int64_t start,
                                                          int64_t length) const {
  UniPCMultistepScheduler part = *this;
  auto cut = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    XF_CHECK(
        dim >= 0 && dim < t.dim() && start >= 0 && length >= 1 && start + length <= t.size(dim),
        kUniPCClassName, ".narrowed: elements [", start, ", ", start + length, ") of dim ", dim,
        " are outside the history's ", t.sizes());
    return t.narrow(dim, start, length).clone();
  };
  for (auto& t : part.model_outputs_) t = cut(t);
  part.last_sample_ = cut(last_sample_);
  return part;
}

}  // namespace xfuser::models::schedulers
