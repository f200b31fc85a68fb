#include "models/dit/step_cache.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::models {

const char* cache_method_name(CacheMethod method) {
  switch (method) {
    case CacheMethod::kNone:
      return "none";
    case CacheMethod::kFirstBlock:
      return "fbcache";
    case CacheMethod::kTaylorSeer:
      return "taylorseer";
    case CacheMethod::kMagCache:
      return "magcache";
    case CacheMethod::kTeaCache:
      return "teacache";
  }
  return "?";
}

CacheMethod parse_cache_method(const std::string& name, const std::string& flag) {
  for (CacheMethod m : {CacheMethod::kNone, CacheMethod::kFirstBlock, CacheMethod::kTaylorSeer,
                        CacheMethod::kMagCache, CacheMethod::kTeaCache}) {
    if (name == cache_method_name(m)) return m;
  }
  XF_THROW(flag, " '", name, "' is not a step-cache method: use fbcache, taylorseer, magcache, ",
           "teacache or none");
}

}  // namespace xfuser::models

namespace xfuser::models::dit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Python's a % b for b > 0 (never negative), as diffusers' schedules compute it.
int py_mod(int a, int b) { return ((a % b) + b) % b; }

// The first `rows` rows of [B, n, D] (all of them when rows < 0).
at::Tensor valid_rows(const at::Tensor& x, int64_t rows) {
  return rows < 0 || rows >= x.size(1) ? x : x.narrow(1, 0, rows);
}

// The sums of `values` (float64 scalars) over the decision's ranks.
at::Tensor summed(const at::Tensor& values, const CacheScope& scope) {
  at::Tensor t = values.to(at::kCPU, at::kDouble).contiguous();
  if (scope.sum) scope.sum(t);
  return t;
}

// sum|x - prev| / sum|prev| over the first `rows` rows (diffusers' and TeaCache's
// (x - prev).abs().mean() / prev.abs().mean()): {over this rank's rows alone, over the rows of
// every rank of the decision}. One copy of two float64 sums to the host.
std::pair<double, double> relative_change(const at::Tensor& x, const at::Tensor& prev, int64_t rows,
                                          const CacheScope& scope) {
  const at::Tensor p = valid_rows(prev, rows);
  at::Tensor sums = at::stack({(valid_rows(x, rows) - p).abs().sum(c10::ScalarType::Double),
                               p.abs().sum(c10::ScalarType::Double)})
                        .to(at::kCPU)
                        .contiguous();
  const double local = sums[0].item<double>() / sums[1].item<double>();
  if (scope.sum) scope.sum(sums);
  return {local, sums[0].item<double>() / sums[1].item<double>()};
}

}  // namespace

at::Tensor image_stream(const DiTTransformer& model, const DiTActivations& a) {
  if (!a.joined) return a.hidden;
  const int64_t n = a.hidden.size(1) - a.text_tokens;
  return model.text_attention() == TextAttention::kJointTextFirst
             ? a.hidden.narrow(1, a.text_tokens, n)
             : a.hidden.narrow(1, 0, n);
}

double default_cache_threshold(CacheMethod method) {
  switch (method) {
    case CacheMethod::kFirstBlock:
      return 0.05;  // diffusers' FirstBlockCacheConfig
    case CacheMethod::kMagCache:
      return 0.06;                // diffusers' MagCacheConfig
    case CacheMethod::kTeaCache:  // the model's (TeaCacheModel)
    case CacheMethod::kTaylorSeer:
    case CacheMethod::kNone:
      return 0.0;
  }
  return 0.0;
}

const std::vector<double>& flux_mag_ratios() {
  static const std::vector<double> ratios = {
      1.0,     1.21094, 1.11719, 1.07812, 1.0625,  1.03906, 1.03125, 1.03906, 1.02344, 1.03125,
      1.02344, 0.98047, 1.01562, 1.00781, 1.0,     1.00781, 1.0,     1.00781, 1.0,     1.0,
      0.99609, 0.99609, 0.98047, 0.98828, 0.96484, 0.95703, 0.93359, 0.89062};
  return ratios;
}

const TeaCacheModel& flux_teacache() {
  // TeaCache4FLUX (FLUX.1-dev); its README: 0.25 for 1.5x, 0.4 for 1.8x, 0.6 for 2.0x.
  static const TeaCacheModel m{
      {4.98651651e+02, -2.83781631e+02, 5.58554382e+01, -3.82021401e+00, 2.64230861e-01}, 0.25};
  return m;
}

const TeaCacheModel& flux_kontext_teacache() {
  // ComfyUI-TeaCache's fit for FLUX.1-Kontext-dev (TeaCache itself publishes none); the
  // threshold is FLUX.1's.
  static const TeaCacheModel m{
      {-1.04655119e+03, 3.12563399e+02, -1.69500694e+01, 4.10995971e-01, 3.74537863e-02}, 0.25};
  return m;
}

const TeaCacheModel& hunyuan_video_teacache() {
  // TeaCache4HunyuanVideo; its README: 0.1 for 1.6x, 0.15 for 2.1x.
  static const TeaCacheModel m{
      {7.33226126e+02, -4.01131952e+02, 6.75869174e+01, -3.14987800e+00, 9.61237896e-02}, 0.1};
  return m;
}

double poly1d(const std::vector<double>& coefficients, double x) {
  double y = 0.0;  // numpy.poly1d: highest power first (Horner)
  for (double c : coefficients) y = y * x + c;
  return y;
}

std::vector<double> interpolate_mag_ratios(const std::vector<double>& ratios, int steps) {
  XF_CHECK(!ratios.empty() && steps >= 1, "MagCache ratios: ", ratios.size(), " ratios for ", steps,
           " steps");
  // torch.tensor(list of floats) holds float32 values.
  std::vector<double> src;
  for (double r : ratios) src.push_back(static_cast<float>(r));
  if (static_cast<int>(src.size()) == steps) return src;
  if (steps == 1) return {src.back()};
  const double scale = static_cast<double>(src.size() - 1) / (steps - 1);
  // grid (float32) * scale, rounded half to even, as torch.round.
  at::Tensor idx = at::round(at::arange(steps, at::kFloat) * scale).to(at::kLong);
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) out.push_back(src.at(idx[i].item<int64_t>()));
  return out;
}

struct StepCache::BranchState {
  int calls = 0;  // evaluations so far
  // fbcache
  at::Tensor head_residual;  // the first block's image residual at the last computed step
  at::Tensor tail_residual;  // the other blocks' image residual at the last computed step
  // magcache
  at::Tensor previous_residual;
  float accumulated_ratio = 1.0f;  // float32, as diffusers' tensor arithmetic
  float accumulated_err = 0.0f;
  int accumulated_steps = 0;
  int step_index = 0;
  std::vector<double> calibration;
  // teacache
  int tea_count = 0;  // the reference's cnt: evaluations since the run's start, modulo steps
  double tea_accumulated = 0.0;
  at::Tensor tea_previous_input;
  at::Tensor tea_residual;
  // taylorseer
  int current_step = -1;
  int last_update_step = -1;  // -1: never updated
  std::vector<at::Tensor> factors;
  c10::ScalarType output_dtype = at::kFloat;
};

namespace {

// fbcache: the first block decides whether the others run.
class FirstBlockCall : public BlockCacheCall {
 public:
  FirstBlockCall(StepCache::BranchState& st, const CacheScope& scope, double threshold)
      : st_(st), scope_(scope), threshold_(threshold) {}

  void run_blocks(const DiTTransformer& model, DiTActivations& a) override {
    const int64_t blocks = model.num_blocks();
    XF_CHECK(blocks >= 2, model.class_name(), " has ", blocks,
             " block(s): First-Block Cache needs a first block and at least one more");
    at::Tensor before = image_stream(model, a);
    model.run_blocks(a, 0, 1);
    at::Tensor head = image_stream(model, a);
    at::Tensor residual = head - before;
    if (st_.head_residual.defined()) {
      std::tie(local_metric, metric) =
          relative_change(residual, st_.head_residual, valid_image_rows, scope_);
      computed = metric > threshold_;
    }
    if (!computed) {
      // The other blocks' residual of the last computed step on this step's first block.
      a.hidden = st_.tail_residual + head;
      a.joined = false;
      return;
    }
    st_.head_residual = residual;
    model.run_blocks(a, 1, blocks);
    st_.tail_residual = image_stream(model, a) - head;
  }

  bool computed = true;
  double metric = kNaN;
  double local_metric = kNaN;

 private:
  StepCache::BranchState& st_;
  const CacheScope& scope_;
  double threshold_;
};

// magcache: the calibrated magnitude ratios decide; a skipped step reuses the blocks' residual.
class MagCacheCall : public BlockCacheCall {
 public:
  MagCacheCall(StepCache::BranchState& st, const CacheScope& scope, const StepCacheConfig& config,
               const std::vector<double>& ratios, int steps)
      : st_(st), scope_(scope), config_(config), ratios_(ratios), steps_(steps) {}

  void run_blocks(const DiTTransformer& model, DiTActivations& a) override {
    at::Tensor before = image_stream(model, a);
    if (!config_.calibrate) {
      const int step = st_.step_index;
      const float scale = step < static_cast<int>(ratios_.size())
                              ? static_cast<float>(ratios_[static_cast<size_t>(step)])
                              : 1.0f;
      const int retention =
          static_cast<int>(config_.retention_ratio * static_cast<double>(steps_) + 0.5);
      if (step >= retention) {
        st_.accumulated_ratio *= scale;
        st_.accumulated_steps += 1;
        st_.accumulated_err += std::fabs(1.0f - st_.accumulated_ratio);
        metric = st_.accumulated_err;
        if (st_.previous_residual.defined() &&
            st_.accumulated_err <= static_cast<float>(threshold()) &&
            st_.accumulated_steps <= config_.max_skip_steps) {
          computed = false;
        } else {
          st_.accumulated_ratio = 1.0f;
          st_.accumulated_steps = 0;
          st_.accumulated_err = 0.0f;
        }
      }
    }
    if (!computed) {
      a.hidden = before + st_.previous_residual;
      a.joined = false;
      advance();
      return;
    }
    model.run_blocks(a, 0, model.num_blocks());
    at::Tensor residual = image_stream(model, a) - before;
    if (config_.calibrate) calibrate(residual);
    st_.previous_residual = residual;
    advance();
  }

  bool computed = true;
  double metric = kNaN;
  bool finished = false;  // the state reached the run's last step and was reset

 private:
  double threshold() const {
    return config_.threshold.value_or(default_cache_threshold(CacheMethod::kMagCache));
  }

  // diffusers: mean over tokens of |res| / (|prev| + 1e-8), norms over the last dimension.
  void calibrate(const at::Tensor& residual) {
    if (!st_.previous_residual.defined()) {
      st_.calibration.push_back(1.0);
      return;
    }
    at::Tensor cur = at::norm(residual.to(at::kFloat), 2, {-1});  // [B, n]
    at::Tensor prev = at::norm(st_.previous_residual.to(at::kFloat), 2, {-1});
    at::Tensor ratio = cur / (prev + 1e-8);  // [B, n]
    ratio = valid_image_rows < 0 || valid_image_rows >= ratio.size(1)
                ? ratio
                : ratio.narrow(1, 0, valid_image_rows);
    at::Tensor sums = summed(at::stack({ratio.sum(c10::ScalarType::Double),
                                        at::full({}, static_cast<double>(ratio.numel()),
                                                 ratio.options().dtype(at::kDouble))}),
                             scope_);
    st_.calibration.push_back(sums[0].item<double>() / sums[1].item<double>());
  }

  void advance() {
    st_.step_index += 1;
    if (st_.step_index < steps_) return;
    finished = true;
    st_.step_index = 0;
    st_.accumulated_ratio = 1.0f;
    st_.accumulated_steps = 0;
    st_.accumulated_err = 0.0f;
    st_.previous_residual = at::Tensor();
  }

  StepCache::BranchState& st_;
  const CacheScope& scope_;
  const StepCacheConfig& config_;
  const std::vector<double>& ratios_;
  int steps_;
};

// teacache: the first block's modulated input decides, through the model's polynomial; a skipped
// step reuses the blocks' residual (TeaCache4FLUX's teacache_forward, per guidance branch).
class TeaCacheCall : public BlockCacheCall {
 public:
  TeaCacheCall(StepCache::BranchState& st, const CacheScope& scope, const TeaCacheModel& model,
               int steps)
      : st_(st), scope_(scope), model_(model), steps_(steps) {}

  void run_blocks(const DiTTransformer& model, DiTActivations& a) override {
    at::Tensor before = image_stream(model, a);
    at::Tensor signal = model.teacache_input(a);  // [B, n, D]
    if (st_.tea_count == 0 || st_.tea_count == steps_ - 1) {
      st_.tea_accumulated = 0.0;
    } else {
      const auto [local, all] =
          relative_change(signal, st_.tea_previous_input, valid_image_rows, scope_);
      local_metric = poly1d(model_.coefficients, local);
      st_.tea_accumulated += poly1d(model_.coefficients, all);
      metric = st_.tea_accumulated;
      if (st_.tea_accumulated < model_.threshold) {
        computed = false;
      } else {
        st_.tea_accumulated = 0.0;
      }
    }
    st_.tea_previous_input = signal;
    st_.tea_count += 1;
    if (st_.tea_count == steps_) st_.tea_count = 0;
    if (!computed) {
      a.hidden = before + st_.tea_residual;
      a.joined = false;
      return;
    }
    model.run_blocks(a, 0, model.num_blocks());
    st_.tea_residual = image_stream(model, a) - before;
  }

  bool computed = true;
  double metric = kNaN;
  double local_metric = kNaN;

 private:
  StepCache::BranchState& st_;
  const CacheScope& scope_;
  const TeaCacheModel& model_;
  int steps_;
};

// Clears the model's block cache when the evaluation ends (also by an exception).
struct BlockCacheGuard {
  DiTTransformer& model;
  BlockCacheGuard(DiTTransformer& m, BlockCacheCall* call) : model(m) {
    model.set_block_cache(call);
  }
  ~BlockCacheGuard() { model.set_block_cache(nullptr); }
};

}  // namespace

StepCache::StepCache(const StepCacheConfig& config, int steps, c10::ScalarType dtype,
                     StepCacheReport* report)
    : config_(config), steps_(steps), dtype_(dtype), report_(report) {
  XF_CHECK(report_ != nullptr, "StepCache: no report");
  report_->method = config_.method;
  if (config_.method == CacheMethod::kMagCache && !config_.calibrate) {
    XF_CHECK(!config_.mag_ratios.empty(),
             "--cache magcache needs the model's magnitude ratios (--cache_mag_ratios), or "
             "--cache_calibrate to measure them");
    mag_ratios_ = interpolate_mag_ratios(config_.mag_ratios, steps_);
  }
  if (config_.method == CacheMethod::kTeaCache) {
    XF_CHECK(!config_.teacache_coefficients.empty() && config_.threshold.has_value(),
             "--cache teacache needs the model's polynomial (--cache_teacache_coefficients) and a "
             "threshold (--cache_threshold)");
    teacache_ = {config_.teacache_coefficients, *config_.threshold};
  }
}

StepCache::~StepCache() = default;

StepCache::BranchState& StepCache::state(const std::string& model_name, const std::string& branch) {
  auto key = std::make_pair(model_name, branch);
  auto it = states_.find(key);
  if (it == states_.end()) {
    it = states_.emplace(key, std::make_unique<BranchState>()).first;
    order_.push_back(key);
  }
  return *it->second;
}

void StepCache::finish() {
  for (const auto& key : order_) {
    BranchState& st = *states_.at(key);
    if (st.calibration.empty()) continue;
    report_->calibration.emplace_back(key.first + "/" + key.second, st.calibration);
    st.calibration.clear();
  }
}

void StepCache::record(const CacheDecision& d) {
  report_->decisions.push_back(d);
  (d.computed ? report_->computed : report_->skipped) += 1;
}

at::Tensor StepCache::evaluate(DiTTransformer& model, const std::string& model_name,
                               const std::string& branch, int step, const CacheScope& scope,
                               const std::function<at::Tensor()>& run) {
  BranchState& st = state(model_name, branch);
  st.calls += 1;
  CacheDecision d;
  d.step = step;
  d.model = model_name;
  d.branch = branch;
  d.metric = kNaN;
  d.local_metric = kNaN;
  switch (config_.method) {
    case CacheMethod::kNone: {
      at::Tensor out = run();
      record(d);
      return out;
    }
    case CacheMethod::kTaylorSeer: {
      // diffusers' TaylorSeerCacheHook: the step counter advances on every call.
      st.current_step += 1;
      const int s = st.current_step;
      const int before = config_.disable_cache_before_step;
      const bool warmup = s < before;
      const bool interval = py_mod(s - before - 1, config_.cache_interval) == 0;
      const bool cooldown =
          config_.disable_cache_after_step >= 0 && s >= config_.disable_cache_after_step;
      if (warmup || interval || cooldown) {
        at::Tensor out = run();
        // update(): the new factors from the output and the previous factors.
        std::vector<at::Tensor> factors = {out};
        if (st.last_update_step >= 0) {
          const int delta = s - st.last_update_step;
          for (int j = 0; j < config_.max_order; ++j) {
            if (j >= static_cast<int>(st.factors.size()) ||
                st.factors[static_cast<size_t>(j)].sizes() != factors.back().sizes()) {
              break;
            }
            factors.push_back(
                (factors.back() - st.factors[static_cast<size_t>(j)].to(out.scalar_type())) /
                delta);
          }
        }
        const c10::ScalarType keep = config_.factors_dtype.value_or(dtype_);
        st.factors.clear();
        for (const at::Tensor& f : factors) st.factors.push_back(f.to(keep));
        st.output_dtype = out.scalar_type();
        st.last_update_step = s;
        record(d);
        return out;
      }
      XF_CHECK(st.last_update_step >= 0, "TaylorSeer: step ", step,
               " would be predicted before any computed step (--cache_disable_before_step)");
      const int offset = s - st.last_update_step;
      at::Tensor out =
          at::zeros_like(st.factors[0], st.factors[0].options().dtype(st.output_dtype));
      double factorial = 1.0;
      for (size_t order = 0; order < st.factors.size(); ++order) {
        if (order > 0) factorial *= static_cast<double>(order);
        const double coeff =
            std::pow(static_cast<double>(offset), static_cast<double>(order)) / factorial;
        out = out + st.factors[order].to(st.output_dtype) * coeff;
      }
      d.computed = false;
      record(d);
      return out;
    }
    case CacheMethod::kFirstBlock: {
      FirstBlockCall call(st, scope,
                          config_.threshold.value_or(default_cache_threshold(config_.method)));
      BlockCacheGuard guard(model, &call);
      at::Tensor out = run();
      d.computed = call.computed;
      d.metric = call.metric;
      d.local_metric = call.local_metric;
      record(d);
      return out;
    }
    case CacheMethod::kMagCache: {
      MagCacheCall call(st, scope, config_, mag_ratios_, steps_);
      at::Tensor out;
      {
        BlockCacheGuard guard(model, &call);
        out = run();
      }
      d.computed = call.computed;
      d.metric = call.metric;
      record(d);
      if (config_.calibrate && call.finished) {
        report_->calibration.emplace_back(model_name + "/" + branch, st.calibration);
        st.calibration.clear();
      }
      return out;
    }
    case CacheMethod::kTeaCache: {
      TeaCacheCall call(st, scope, teacache_, steps_);
      at::Tensor out;
      {
        BlockCacheGuard guard(model, &call);
        out = run();
      }
      d.computed = call.computed;
      d.metric = call.metric;
      d.local_metric = call.local_metric;
      record(d);
      return out;
    }
  }
  XF_THROW("unknown cache method");
}

}  // namespace xfuser::models::dit
