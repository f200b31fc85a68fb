#include "models/xfuser_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "backends/backend.h"
#include "backends/device.h"
#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/kernels.h"
#include "models/lora_adapters.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "parallel/process_groups.h"
#include "profiling/trace.h"

namespace xfuser::models {
namespace {

using Clock = std::chrono::steady_clock;

// XFUSER_INJECT_FAILURE="RANK:STEP[:KIND]": that rank fails at the start of that denoising step
// (0-based). KIND: throw (default: an xfuser::Error), segv (raises SIGSEGV), abort (std::abort),
// stall (sleeps for an hour, as a hung rank). For testing that any failing rank ends the job.
struct InjectedFailure {
  int rank = -1;
  int step = -1;
  std::string kind = "throw";
};

std::optional<InjectedFailure> injected_failure() {
  const char* env = std::getenv("XFUSER_INJECT_FAILURE");
  if (!env || !*env) return std::nullopt;
  InjectedFailure f;
  char kind[16] = "throw";
  const int n = std::sscanf(env, "%d:%d:%15s", &f.rank, &f.step, kind);
  f.kind = kind;
  XF_CHECK(n >= 2 && f.rank >= 0 && f.step >= 0 &&
               (f.kind == "throw" || f.kind == "segv" || f.kind == "abort" || f.kind == "stall"),
           "XFUSER_INJECT_FAILURE must be RANK:STEP[:throw|segv|abort|stall] (got '", env, "')");
  return f;
}

void inject(const InjectedFailure& f, int step) {
  if (f.rank != process_rank() || f.step != step) return;
  if (f.kind == "segv") std::raise(SIGSEGV);
  if (f.kind == "abort") std::abort();
  if (f.kind == "stall") {
    std::fprintf(stderr, "[rank %d] injected stall (XFUSER_INJECT_FAILURE) at step %d, pid %d\n",
                 process_rank(), step, static_cast<int>(::getpid()));
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  XF_THROW("injected failure (XFUSER_INJECT_FAILURE) on rank ", process_rank(), " at step ", step);
}

// Seconds `f` takes on `device`: the device is synchronised at the end, so the time covers the
// kernels `f` queued, not only the queueing (the stage before ended synchronised too).
template <typename F>
StageTiming timed(const c10::Device& device, const char* name, int index, F&& f) {
  StageTiming out;
  out.name = name;
  out.index = index;
  backends::reset_tensor_memory_peak(device);
  auto t0 = Clock::now();
  f();
  backends::synchronize_device(device);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const backends::TensorMemory m = backends::tensor_memory(device);
  if (m.available) out.peak_tensor_bytes = m.peak;
  return out;
}

// The VAE is never sharded (as xDiT): it runs once per generation, on every rank.
bool is_vae(const std::string& component) { return component.rfind("vae", 0) == 0; }

}  // namespace

XFuserModel::XFuserModel(const ModelSpec& spec) : spec_(spec) {}
XFuserModel::~XFuserModel() = default;

void XFuserModel::load(const std::filesystem::path& pipeline_dir, const ModelLoadOptions& options) {
  XF_CONTEXT("loading ", spec_.id, " from ", pipeline_dir.string());
  c10::InferenceMode guard;
  offloader_.reset();
  fsdp_.reset();
  components_.clear();
  peak_tensor_bytes_ = -1;
  load_options_ = options;
  if (options.offload != OffloadMode::kNone) {
    offloader_ = std::make_unique<Offloader>(options.offload, options.device);
  }
  if (options.fsdp) {
    XF_CHECK(options.offload == OffloadMode::kNone,
             "--use_fsdp with CPU offload is not supported: each keeps the weights off the "
             "device its own way; use one of them");
    XF_CHECK(groups_ && groups_->fsdp(),
             "--use_fsdp needs the process groups' fsdp group (ProcessGroups::create_fsdp_group) "
             "before load");
    fsdp_ = std::make_unique<FsdpSharder>(*groups_->fsdp(), options.device);
  }
  load_lora_adapters(options);
  load_components(pipeline_dir, options);
  // Every adapted component must have been loaded with its adapters.
  for (const auto& [name, lora] : component_lora_) {
    const bool loaded = std::any_of(components_.begin(), components_.end(),
                                    [&](const auto& c) { return c.first == name; });
    XF_CHECK(loaded, "--lora ", lora->entries.front().adapter->path, ": the adapter adapts '", name,
             "', which ", spec_.id, " (", pipeline_dir.string(), ") does not load");
  }
  // The overridable ops, through the backend contract (compile -> override -> eager).
  backends::Backend& backend = backends::backend_for("cpu");
  const size_t before = backend.timeline().size();
  kernels_ = std::make_unique<KernelTable>(
      KernelTable::resolve(backend, options.compile, options.kernel_overrides));
  const auto all = backend.timeline();
  backend_timeline_.assign(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
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
  set_lora_scales(request);
  c10::InferenceMode guard;
  KernelScope kernel_scope(kernels_.get());
  // Under CPU offload every component leaves the device at the end, also of a failed
  // generation (diffusers' maybe_free_model_hooks).
  // Under FSDP every gathered group returns to shards at the end, and the gathers' identities
  // are checked (on success: a mismatch is an error of its own).
  struct OffloadAll {
    Offloader* offloader;
    FsdpSharder* fsdp;
    ~OffloadAll() {
      try {
        if (offloader) offloader->offload_all();
        if (fsdp) fsdp->release_all();
      } catch (const std::exception&) {
        // A failure here follows the generation's own error, which is the one to report.
      }
    }
  } offload_all{offloader_.get(), fsdp_.get()};
  XF_SPAN("stage", "generate");
  GenerationOutput out;
  const c10::Device device = load_options_.device;
  backends::synchronize_device(device);
  auto t0 = Clock::now();
  std::unique_ptr<State> state = begin(request);
  {
    XF_CONTEXT("encoding the prompt");
    XF_SPAN("stage", "encode_prompt");
    out.timings.push_back(timed(device, "encode_prompt", -1, [&] { encode_prompt(*state); }));
  }
  {
    XF_CONTEXT("preparing latents");
    XF_SPAN("stage", "prepare_latents");
    out.timings.push_back(timed(device, "prepare_latents", -1, [&] { prepare_latents(*state); }));
  }
  const int steps = num_steps(*state);
  const auto injected = injected_failure();
  for (int i = 0; i < steps; ++i) {
    XF_CONTEXT("denoising step ", i + 1, "/", steps);
    profiling::Span step_span("step", "denoise_step");
    step_span.arg("step", i).arg("steps", steps);
    if (injected) inject(*injected, i);
    out.timings.push_back(timed(device, "denoise_step", i, [&] { denoise_step(*state, i); }));
    if (step_callback_) step_callback_(i + 1, steps);
  }
  {
    XF_CONTEXT("decoding");
    XF_SPAN("stage", "decode");
    out.timings.push_back(timed(device, "decode", -1, [&] { decode(*state); }));
  }
  if (fsdp_) fsdp_->release_all();
  for (const StageTiming& st : out.timings) {
    peak_tensor_bytes_ = std::max(peak_tensor_bytes_, st.peak_tensor_bytes);
  }
  // Images [B, H, W, 3]; videos [B, F, H, W, 3].
  const int64_t dims = spec_.defaults.num_frames > 0 ? 5 : 4;
  XF_CHECK(state->images.defined() && state->images.dim() == dims, spec_.id,
           ": decode() produced no ", dims == 5 ? "videos" : "images");
  // Pictures leave the device here: encoders, PNG and video writers read host memory.
  out.images = state->images.to(at::kCPU);
  out.latents = state->latents;
  out.initial_latents = state->initial_latents;
  out.cache = std::move(state->cache_report);
  out.total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

void XFuserModel::register_component(const std::string& name, std::shared_ptr<Module> component,
                                     const std::vector<std::string>& block_prefixes) {
  components_.emplace_back(name, component);
  if (offloader_) offloader_->add_component(name, component, block_prefixes);
  if (fsdp_ && !is_vae(name)) fsdp_->add_component(name, component, block_prefixes);
}

int64_t XFuserModel::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, component] : components_) {
    for (const auto& [param, slot] : std::as_const(*component).named_parameters()) {
      bytes += slot->bytes();
    }
  }
  return bytes;
}

LoadOptions XFuserModel::component_load_options(const std::string& name) const {
  LoadOptions options;
  options.device = load_options_.weights_device();
  if (fsdp_ && !is_vae(name)) fsdp_->configure(options);
  options.lora = component_lora(name);
  return options;
}

std::shared_ptr<const ComponentLora> XFuserModel::component_lora(const std::string& name) const {
  auto it = component_lora_.find(name);
  return it == component_lora_.end() ? nullptr : it->second;
}

void XFuserModel::load_lora_adapters(const ModelLoadOptions& options) {
  RunLora lora = read_run_lora(spec_, options.lora, options.lora_fused, options.device);
  lora_adapters_ = std::move(lora.adapters);
  lora_load_scales_ = std::move(lora.load_scales);
  lora_scales_ = std::move(lora.scales);
  component_lora_ = std::move(lora.components);
}

void XFuserModel::set_lora_scales(const GenerationRequest& request) {
  for (const auto& [name, value] : request.lora_scales) {
    const bool known = std::any_of(lora_adapters_.begin(), lora_adapters_.end(),
                                   [&](const auto& a) { return a->name == name; });
    XF_CHECK(known, spec_.id, ": the request sets the scale of LoRA adapter '", name,
             "', which is not loaded");
    XF_CHECK(std::isfinite(value), "LoRA adapter '", name, "': the scale must be finite");
  }
  for (size_t i = 0; i < lora_adapters_.size(); ++i) {
    auto it = request.lora_scales.find(lora_adapters_[i]->name);
    const double want = it == request.lora_scales.end() ? lora_load_scales_[i] : it->second;
    XF_CHECK(!load_options_.lora_fused || want == lora_load_scales_[i], "LoRA adapter '",
             lora_adapters_[i]->name, "' is fused into the weights at scale ", lora_load_scales_[i],
             "; a generation at scale ", want, " needs the adapters unfused (--lora_mode unfused)");
    *lora_scales_[i] = want;
  }
}

std::shared_ptr<Component> XFuserModel::load_pipeline_component(
    const std::filesystem::path& pipeline_dir, const std::string& name, c10::ScalarType dtype) {
  auto component =
      load_component((pipeline_dir / name).string(), dtype, component_load_options(name));
  register_component(name, component);
  return component;
}

}  // namespace xfuser::models
