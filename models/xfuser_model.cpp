#include "models/xfuser_model.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "backends/error.h"
#include "models/registry.h"
#include "profiling/trace.h"

namespace xfuser::models {
namespace {

using Clock = std::chrono::steady_clock;

// XFUSER_INJECT_FAILURE="RANK:STEP": that rank throws at the start of that denoising step
// (0-based). For testing that a failing rank ends the whole job.
std::optional<std::pair<int, int>> injected_failure() {
  const char* env = std::getenv("XFUSER_INJECT_FAILURE");
  if (!env || !*env) return std::nullopt;
  int rank = -1, step = -1;
  XF_CHECK(std::sscanf(env, "%d:%d", &rank, &step) == 2 && rank >= 0 && step >= 0,
           "XFUSER_INJECT_FAILURE must be RANK:STEP (got '", env, "')");
  return std::make_pair(rank, step);
}

template <typename F>
double timed(F&& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

XFuserModel::XFuserModel(const ModelSpec& spec) : spec_(spec) {}
XFuserModel::~XFuserModel() = default;

void XFuserModel::load(const std::filesystem::path& pipeline_dir, const ModelLoadOptions& options) {
  XF_CONTEXT("loading ", spec_.id, " from ", pipeline_dir.string());
  c10::InferenceMode guard;
  load_components(pipeline_dir, options);
  load_options_ = options;
  loaded_ = true;
}

GenerationOutput XFuserModel::generate(const GenerationRequest& request) {
  XF_CHECK(loaded_, spec_.id, ": generate() called before load()");
  XF_CHECK(!request.prompts.empty(), spec_.id, ": no prompt given");
  XF_CHECK(request.seeds.size() == request.prompts.size(), spec_.id, ": ", request.seeds.size(),
           " seeds for ", request.prompts.size(), " prompts");
  XF_CHECK(
      request.negative_prompts.empty() || request.negative_prompts.size() == request.prompts.size(),
      spec_.id, ": ", request.negative_prompts.size(), " negative prompts for ",
      request.prompts.size(), " prompts (give none, or one per prompt)");
  c10::InferenceMode guard;
  XF_SPAN("stage", "generate");
  GenerationOutput out;
  auto t0 = Clock::now();
  std::unique_ptr<State> state = begin(request);
  {
    XF_CONTEXT("encoding the prompt");
    XF_SPAN("stage", "encode_prompt");
    out.timings.push_back({"encode_prompt", -1, timed([&] { encode_prompt(*state); })});
  }
  {
    XF_CONTEXT("preparing latents");
    XF_SPAN("stage", "prepare_latents");
    out.timings.push_back({"prepare_latents", -1, timed([&] { prepare_latents(*state); })});
  }
  const int steps = num_steps(*state);
  const auto inject = injected_failure();
  for (int i = 0; i < steps; ++i) {
    XF_CONTEXT("denoising step ", i + 1, "/", steps);
    profiling::Span step_span("step", "denoise_step");
    step_span.arg("step", i).arg("steps", steps);
    XF_CHECK(!(inject && inject->first == process_rank() && inject->second == i),
             "injected failure (XFUSER_INJECT_FAILURE) on rank ", process_rank(), " at step ", i);
    out.timings.push_back({"denoise_step", i, timed([&] { denoise_step(*state, i); })});
    if (step_callback_) step_callback_(i + 1, steps);
  }
  {
    XF_CONTEXT("decoding");
    XF_SPAN("stage", "decode");
    out.timings.push_back({"decode", -1, timed([&] { decode(*state); })});
  }
  XF_CHECK(state->images.defined() && state->images.dim() == 4, spec_.id,
           ": decode() produced no images");
  out.images = state->images;
  out.latents = state->latents;
  out.total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace xfuser::models
