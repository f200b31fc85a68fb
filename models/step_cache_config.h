// Step caching: the settings of a run (--cache and its parameters) and what one generation
// reports of it. The methods skip work between denoising steps, trading a small, measured loss
// of fidelity for speed:
//
//   fbcache     First-Block Cache (diffusers' FirstBlockCacheConfig, ParaAttention): runs the
//               first block; when its output residual changed by less than `threshold`
//               (relative mean absolute difference to the last computed step) the remaining
//               blocks are replaced by their cached residual.
//   taylorseer  TaylorSeer (diffusers' TaylorSeerCacheConfig in lite mode): the transformer's
//               output is computed on a fixed schedule and extrapolated between with a Taylor
//               series of order `max_order` in the step index.
//   magcache    MagCache (diffusers' MagCacheConfig): a step is skipped while the accumulated
//               error of the model's calibrated magnitude ratios stays within `threshold`; a
//               skipped step reuses the last residual of all the blocks.
//   teacache    TeaCache (its reference implementation's formula): the relative L1 change of the
//               first block's modulated image input, rescaled by the model's published
//               polynomial and accumulated over skipped steps, decides; a skipped step reuses the
//               blocks' last residual. The first and last steps always run.
//
// The implementation (models/dit/step_cache.h) is one mechanism for every DiT family, in the
// generic driver; every rank of a generation takes the same decisions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace xfuser::models {

enum class CacheMethod { kNone, kFirstBlock, kTaylorSeer, kMagCache, kTeaCache };

// "none", "fbcache", "taylorseer", "magcache", "teacache".
const char* cache_method_name(CacheMethod method);
// The inverse; an error naming `flag` and the known names.
CacheMethod parse_cache_method(const std::string& name, const std::string& flag = "--cache");

struct StepCacheConfig {
  CacheMethod method = CacheMethod::kNone;
  // fbcache, magcache, teacache: the decision threshold; unset: the method's default (fbcache
  // 0.05 and magcache 0.06, as diffusers; teacache the model's published one).
  std::optional<double> threshold;
  // magcache: the most consecutive skipped steps (K) and the fraction of the first steps that
  // are never skipped.
  int max_skip_steps = 3;
  double retention_ratio = 0.2;
  // magcache: the model's magnitude ratios (one per step of the calibration run; interpolated
  // to the run's steps); empty: the model's published ones. `calibrate` computes no skip and
  // reports the ratios of this run instead.
  std::vector<double> mag_ratios;
  bool calibrate = false;
  // teacache: the rescaling polynomial's coefficients, highest power first (numpy.poly1d's
  // order); empty: the model's published ones.
  std::vector<double> teacache_coefficients;
  // taylorseer: full steps before the first prediction (disable_cache_before_step), the period
  // of the full steps after it (cache_interval), the step from which every step is full again
  // (disable_cache_after_step; -1: never) and the Taylor order.
  int cache_interval = 5;
  int disable_cache_before_step = 3;
  int disable_cache_after_step = -1;
  int max_order = 1;
  // taylorseer: the dtype the Taylor factors are kept in; unset: the run's compute dtype
  // (diffusers defaults to bf16 to save memory per hooked module; here the factors are one
  // output-sized tensor per order).
  std::optional<c10::ScalarType> factors_dtype;

  bool enabled() const { return method != CacheMethod::kNone; }
};

// One decision of one generation: denoising step `step` of `branch` ("cond", "uncond", or
// "batch" when the guidance branches run as one batch) of transformer `model` (its folder name:
// "transformer", "transformer_2").
struct CacheDecision {
  int step = 0;
  std::string model;
  std::string branch;
  bool computed = true;
  // The quantity the method decided on (fbcache: the relative change of the first block's
  // residual over all the ranks that share the decision; magcache: the accumulated error;
  // teacache: the accumulated rescaled change, over all the ranks); NaN where the step was computed
  // without a comparison (the first steps, a schedule).
  double metric = 0.0;
  // The same quantity over this rank's own tokens only (fbcache; teacache: the rescaled change of
  // this step alone): what a rank would
  // have decided on alone under sequence parallelism; NaN where not measured.
  double local_metric = 0.0;
};

// What a generation reports of its step cache.
struct StepCacheReport {
  CacheMethod method = CacheMethod::kNone;
  int computed = 0;  // transformer evaluations run in full
  int skipped = 0;   // evaluations served from the cache
  std::vector<CacheDecision> decisions;
  // magcache --cache_calibrate: the magnitude ratios measured, per model and branch in the
  // order they were first used ("transformer/cond" -> ratios).
  std::vector<std::pair<std::string, std::vector<double>>> calibration;
};

}  // namespace xfuser::models
