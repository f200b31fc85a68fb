// Step caching for every DiT family (models/step_cache_config.h has the methods and their
// settings), written once in the generic driver:
//
//   - output level (taylorseer): the parallel driver's whole evaluation of the transformer is
//     either run or replaced by the Taylor extrapolation of its past outputs;
//   - block level (fbcache, magcache, teacache): DiTTransformer::forward asks the cache to run
//     its blocks between embed() and finalize(); the cache runs them all, or only the first
//     (fbcache) or none, and adds a cached residual to the image stream.
//
// State is kept per transformer ("transformer", "transformer_2") and per guidance branch, as
// diffusers' cache contexts do: "cond" and "uncond" when the branches run one after the other
// (or on the two ranks of the cfg group), "batch" when they run as one batch.
//
// Every rank that evaluates one transformer call together (the sequence-parallel group, the
// tensor-parallel group, and the cfg group when the branches are batched) takes the same
// decision, or their collectives would deadlock: a decision on a metric over the tokens sums the
// metric's numerator and denominator over those ranks (CacheScope::sum) and every rank then
// decides on the same totals; decisions on the step index alone need no communication.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/dit/dit.h"
#include "models/step_cache_config.h"

namespace xfuser::models::dit {

// The ranks that share the decisions of one evaluation.
struct CacheScope {
  // Sums a small float64 CPU tensor element-wise over every rank of the decision (in place);
  // empty: this rank decides alone.
  std::function<void(at::Tensor&)> sum;
};

// One evaluation under a block-level method, attached to the model while it runs
// (DiTTransformer::set_block_cache).
class BlockCacheCall {
 public:
  virtual ~BlockCacheCall() = default;
  // Runs blocks [0, num_blocks) on `a` (embedded, not joined), or serves them from the cache:
  // afterwards finalize(a) gives the model's output.
  virtual void run_blocks(const DiTTransformer& model, DiTActivations& a) = 0;
  // Real rows of this rank's image stream: under sequence parallelism the last chunk is padded
  // (sequence_parallel_forward sets it); -1: every row is real.
  int64_t valid_image_rows = -1;
};

// The image stream of `a` [B, n, D] (the image rows of a joined sequence).
at::Tensor image_stream(const DiTTransformer& model, const DiTActivations& a);

// TeaCache's published fit of a model: the polynomial (highest power first) and the default
// threshold.
struct TeaCacheModel {
  std::vector<double> coefficients;
  double threshold = 0.0;
};
const TeaCacheModel& flux_teacache();           // TeaCache4FLUX (FLUX.1-dev)
const TeaCacheModel& flux_kontext_teacache();   // ComfyUI-TeaCache's FLUX.1-Kontext-dev fit
const TeaCacheModel& hunyuan_video_teacache();  // TeaCache4HunyuanVideo
// numpy.poly1d(coefficients)(x).
double poly1d(const std::vector<double>& coefficients, double x);

class StepCache {
 public:
  // `steps`: the generation's denoising steps (magcache interpolates its ratios to them);
  // `dtype`: the compute dtype (taylorseer's factors by default). Decisions are recorded in
  // `report`, which must outlive the cache.
  StepCache(const StepCacheConfig& config, int steps, c10::ScalarType dtype,
            StepCacheReport* report);
  ~StepCache();

  const StepCacheConfig& config() const { return config_; }

  // One evaluation of `model` (named `model_name`) for `branch` at denoising step `step`:
  // `run` evaluates it through the parallel driver (and, under a block-level method, calls
  // model.forward, which consults the cache). Returns the output [B, N, C].
  at::Tensor evaluate(DiTTransformer& model, const std::string& model_name,
                      const std::string& branch, int step, const CacheScope& scope,
                      const std::function<at::Tensor()>& run);

  // At the generation's last step: the magcache calibrations not yet reported (a state that saw
  // fewer evaluations than the run's steps, e.g. one of Wan 2.2's two experts) go to the report.
  void finish();

  struct BranchState;  // per (model, branch): the method's tensors and counters

 private:
  BranchState& state(const std::string& model_name, const std::string& branch);
  void record(const CacheDecision& decision);

  StepCacheConfig config_;
  int steps_;
  c10::ScalarType dtype_;
  StepCacheReport* report_;
  std::vector<double> mag_ratios_;  // magcache: interpolated to steps_
  TeaCacheModel teacache_;          // teacache: the coefficients and threshold in force
  std::map<std::pair<std::string, std::string>, std::unique_ptr<BranchState>> states_;
  std::vector<std::pair<std::string, std::string>> order_;  // states in first-use order
};

// The defaults of the methods' parameters, as diffusers' configs.
double default_cache_threshold(CacheMethod method);

// FLUX.1's published MagCache ratios (diffusers' FLUX_MAG_RATIOS: 28 steps, FLUX.1-dev).
const std::vector<double>& flux_mag_ratios();

// diffusers' nearest_interp: `ratios` resampled to `steps` values (torch.round, half to even,
// of i * (len - 1) / (steps - 1) in float32).
std::vector<double> interpolate_mag_ratios(const std::vector<double>& ratios, int steps);

}  // namespace xfuser::models::dit
