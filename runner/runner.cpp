#include "runner/runner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "backends/error.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"
#include "profiling/trace.h"
#include "runner/outputs.h"

namespace xfuser::runner {
namespace fs = std::filesystem;

namespace {

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32") return c10::kFloat;
  if (name == "bf16") return c10::kBFloat16;
  if (name == "fp16") return c10::kHalf;
  XF_THROW("unknown --dtype '", name, "' (expected fp32, bf16 or fp16)");
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "fp32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "fp16";
    default:
      return c10::toString(t);
  }
}

bool cpu_has_avx512_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" avx512_bf16") != std::string::npos;
  }
  return false;
}

std::string format_double(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

}  // namespace

c10::ScalarType default_cpu_dtype() {
  static const c10::ScalarType t = cpu_has_avx512_bf16() ? c10::kBFloat16 : c10::kFloat;
  return t;
}

Runner::Runner(RunConfig config, std::shared_ptr<parallel::ProcessGroups> groups)
    : config_(std::move(config)), groups_(std::move(groups)) {}
Runner::~Runner() = default;

ResolvedArgs Runner::preprocess_args() const {
  XF_CHECK(!config_.model.empty(), "--model is required (see `xfuser models` for the list)");
  validate_values(config_);
  ResolvedArgs args;
  args.config = config_;
  RunConfig& c = args.config;
  args.spec = &models::ModelRegistry::find(c.model);
  const models::ModelSpec& spec = *args.spec;

  // Flags this model does not honour are errors, never silently ignored.
  auto require = [&](bool given, const std::string& flag) {
    XF_CHECK(!given || spec.options.count(flag), flag, " is not supported by model ", spec.id);
  };
  require(!c.negative_prompt.empty(), "--negative_prompt");
  require(c.true_cfg_scale.has_value(), "--true_cfg_scale");
  require(c.guidance_scale.has_value(), "--guidance_scale");
  require(c.max_sequence_length.has_value(), "--max_sequence_length");
  require(c.enable_tiling, "--enable_tiling");
  require(c.enable_slicing, "--enable_slicing");
  // Parallel strategies the model does not support are errors naming the flag and the model.
  const auto& par = spec.parallelism;
  auto require_par = [&](bool used, bool supported, const std::string& flag) {
    XF_CHECK(!used || supported, flag, " is not supported by model ", spec.id);
  };
  require_par(c.ulysses_degree > 1, par.ulysses, "--ulysses_degree");
  require_par(c.ring_degree > 1, par.ring, "--ring_degree");
  require_par(c.pipefusion_parallel_degree > 1, par.pipefusion, "--pipefusion_parallel_degree");
  require_par(c.tensor_parallel_degree > 1, par.tensor_parallel, "--tensor_parallel_degree");
  require_par(c.data_parallel_degree > 1, par.data_parallel, "--data_parallel_degree");
  require_par(c.use_cfg_parallel, par.cfg_parallel, "--use_cfg_parallel");
  require_par(c.use_parallel_vae, par.parallel_vae, "--use_parallel_vae");

  XF_CHECK(!c.prompt.empty(), "--prompt is required");
  for (size_t i = 0; i < c.prompt.size(); ++i) {
    XF_CHECK(!c.prompt[i].empty(), "--prompt ", i, " is empty");
  }
  XF_CHECK(c.negative_prompt.empty() || c.negative_prompt.size() == 1 ||
               c.negative_prompt.size() == c.prompt.size(),
           "--negative_prompt: give one, or one per --prompt (", c.prompt.size(), "), got ",
           c.negative_prompt.size());

  const auto& d = spec.defaults;
  c.height = c.height.value_or(d.height);
  c.width = c.width.value_or(d.width);
  c.num_inference_steps = c.num_inference_steps.value_or(d.num_inference_steps);
  c.guidance_scale = c.guidance_scale.value_or(d.guidance_scale);
  c.true_cfg_scale = c.true_cfg_scale.value_or(1.0);
  c.max_sequence_length = c.max_sequence_length.value_or(d.max_sequence_length);
  if (c.dtype.empty()) c.dtype = dtype_name(default_cpu_dtype());
  args.dtype = parse_dtype(c.dtype);

  auto& r = args.request;
  std::vector<std::string> negatives;
  if (!c.negative_prompt.empty()) {
    negatives = c.negative_prompt.size() == 1
                    ? std::vector<std::string>(c.prompt.size(), c.negative_prompt[0])
                    : c.negative_prompt;
  }
  // Data parallel: prompts strided over the dp groups (prompts[dp_rank::dp], as xDiT); each
  // keeps its global index for its file name, so the union equals a one-rank run.
  const int dp = groups_ ? groups_->config().dp() : 1;
  const int dp_rank = groups_ ? groups_->coords().dp : 0;
  for (size_t i = dp_rank; i < c.prompt.size(); i += dp) {
    r.prompts.push_back(c.prompt[i]);
    if (!negatives.empty()) r.negative_prompts.push_back(negatives[i]);
    args.prompt_indices.push_back(static_cast<int64_t>(i));
  }
  r.height = *c.height;
  r.width = *c.width;
  r.num_inference_steps = *c.num_inference_steps;
  r.guidance_scale = *c.guidance_scale;
  r.true_cfg_scale = *c.true_cfg_scale;
  r.max_sequence_length = *c.max_sequence_length;
  r.seeds.assign(r.prompts.size(), c.seed);
  return args;
}

fs::path resolve_model_dir(const ResolvedArgs& args) {
  const models::ModelSpec& spec = *args.spec;
  fs::path dir;
  if (!args.config.model_path.empty()) {
    dir = args.config.model_path;
  } else if (spec.maturity == "embedded") {
    dir = models::flux::ensure_tiny_flux(0);
  } else {
    XF_CHECK(!spec.hf_repo.empty(), "model ", spec.id,
             " has no Hugging Face repo: pass --model_path with its pipeline folder");
    dir = models::find_in_hub_cache(spec.hf_repo);
  }
  models::check_pipeline_folder(dir);
  return dir;
}

void Runner::initialize(const ResolvedArgs& args) {
  const models::ModelSpec& spec = *args.spec;
  ensure_writable_directory(args.config.output_directory);
  model_dir_ = resolve_model_dir(args);
  spdlog::info("loading {} from {} ({})", spec.id, model_dir_.string(), args.config.dtype);
  model_ = spec.create(spec);
  model_->set_process_groups(groups_);
  models::ModelLoadOptions options;
  options.dtype = args.dtype;
  options.enable_tiling = args.config.enable_tiling;
  options.enable_slicing = args.config.enable_slicing;
  model_->load(model_dir_, options);
  if (isatty(STDERR_FILENO)) {
    model_->set_step_callback([](int step, int total) {
      std::fprintf(stderr, "\rdenoising step %d/%d", step, total);
      if (step == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    });
  }
}

RunResult Runner::run(const ResolvedArgs& args) {
  XF_CHECK(model_ != nullptr, "Runner::run called before initialize");
  RunResult result;
  if (args.request.prompts.empty()) {
    // More data-parallel groups than prompts: this group has nothing to generate.
    spdlog::info("no prompt for this data-parallel group");
    return result;
  }
  for (int i = 0; i < args.config.warmup_calls; ++i) {
    spdlog::info("warm-up call {}/{}", i + 1, args.config.warmup_calls);
    model_->generate(args.request);
  }
  for (int i = 0; i < args.config.num_iterations; ++i) {
    if (groups_) groups_->reset_stats();  // count each timed iteration on its own
    auto out = model_->generate(args.request);
    if (groups_) result.comm.push_back(groups_->stats());
    spdlog::info("iteration {}/{}: {:.3f} s", i + 1, args.config.num_iterations, out.total_seconds);
    result.iteration_seconds.push_back(out.total_seconds);
    result.images = out.images;
    result.iterations.push_back(std::move(out));
  }
  return result;
}

std::vector<fs::path> Runner::save(const ResolvedArgs& args, const RunResult& result) {
  const RunConfig& c = args.config;
  const fs::path dir = c.output_directory;
  const auto save_start = std::chrono::steady_clock::now();
  std::vector<fs::path> written;
  const int64_t images = writes_images() && result.images.defined() ? result.images.size(0) : 0;
  for (int64_t i = 0; i < images; ++i) {
    std::map<std::string, std::string> text = {
        {"Software", "xfuser"},
        {"model", args.spec->id},
        {"prompt", args.request.prompts[i]},
        {"seed", std::to_string(args.request.seeds[i])},
        {"num_inference_steps", std::to_string(args.request.num_inference_steps)},
        {"guidance_scale", format_double(args.request.guidance_scale)},
        {"size", std::to_string(args.request.height) + "x" + std::to_string(args.request.width)},
        {"dtype", c.dtype},
        {"parallel",
         "ulysses=" + std::to_string(c.ulysses_degree) + " ring=" + std::to_string(c.ring_degree) +
             " pipefusion=" + std::to_string(c.pipefusion_parallel_degree) +
             " tensor=" + std::to_string(c.tensor_parallel_degree) + " data=" +
             std::to_string(c.data_parallel_degree) + " cfg=" + (c.use_cfg_parallel ? "2" : "1")}};
    if (!args.request.negative_prompts.empty()) {
      text["negative_prompt"] = args.request.negative_prompts[i];
      text["true_cfg_scale"] = format_double(args.request.true_cfg_scale);
    }
    const fs::path path = dir / output_file_name(args.spec->id, c.ulysses_degree, c.ring_degree,
                                                 c.use_torch_compile, args.request.height,
                                                 args.request.width, args.prompt_indices[i], "png");
    write_png(path, result.images[i], text);
    written.push_back(path);
  }
  // Every rank: its own run report.
  {
    nlohmann::json report;
    report["schema"] = "xfuser.timings_rank";
    report["version"] = kRunReportSchemaVersion;
    report["rank"] = rank();
    report["world_size"] = groups_ ? groups_->config().world_size() : 1;
    report["model"] = args.spec->id;
    report["config"] = {{"height", args.request.height},
                        {"width", args.request.width},
                        {"num_inference_steps", args.request.num_inference_steps},
                        {"guidance_scale", args.request.guidance_scale},
                        {"true_cfg_scale", args.request.true_cfg_scale},
                        {"max_sequence_length", args.request.max_sequence_length},
                        {"seed", c.seed},
                        {"dtype", c.dtype},
                        {"prompts", args.request.prompts.size()},
                        {"prompt_indices", args.prompt_indices},
                        {"ulysses_degree", c.ulysses_degree},
                        {"ring_degree", c.ring_degree},
                        {"pipefusion_parallel_degree", c.pipefusion_parallel_degree},
                        {"tensor_parallel_degree", c.tensor_parallel_degree},
                        {"data_parallel_degree", c.data_parallel_degree},
                        {"use_cfg_parallel", c.use_cfg_parallel},
                        {"warmup_calls", c.warmup_calls},
                        {"num_iterations", c.num_iterations},
                        {"threads", at::get_num_threads()}};
    nlohmann::json iterations = nlohmann::json::array();
    for (size_t i = 0; i < result.iterations.size(); ++i) {
      const auto& it = result.iterations[i];
      nlohmann::json stages = nlohmann::json::array();
      double stage_sum = 0;
      for (const auto& st : it.timings) {
        nlohmann::json e = {{"name", st.name}, {"seconds", st.seconds}};
        if (st.index >= 0) e["step"] = st.index;
        stages.push_back(e);
        stage_sum += st.seconds;
      }
      nlohmann::json comm = nlohmann::json::object();
      if (i < result.comm.size()) {
        for (const auto& [group, ops] : result.comm[i]) {
          for (const auto& [op, st] : ops) {
            comm[group][op] = {{"calls", st.calls}, {"bytes", st.bytes}, {"seconds", st.seconds}};
          }
        }
      }
      iterations.push_back({{"total_seconds", it.total_seconds},
                            {"stages_seconds", stage_sum},
                            {"stages", stages},
                            {"comm", comm}});
    }
    report["iterations"] = iterations;
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    report["memory"] = {{"peak_rss_bytes", static_cast<int64_t>(usage.ru_maxrss) * 1024},
                        {"device", "cpu"}};
    // Writing this rank's images (saving happens once, after the timed iterations).
    report["save_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
    const fs::path path = dir / ("timings_rank" + std::to_string(rank()) + ".json");
    write_file_atomic(path, report.dump(2) + "\n");
    written.push_back(path);
  }
  if (writes_timings()) {
    nlohmann::json timings = result.iteration_seconds;
    write_file_atomic(dir / "timings.json", timings.dump() + "\n");
    written.push_back(dir / "timings.json");
  }
  return written;
}

fs::path Runner::profile(const ResolvedArgs& args) {
  XF_CHECK(model_ != nullptr, "Runner::profile called before initialize");
  const RunConfig& c = args.config;
  auto& recorder = profiling::TraceRecorder::instance();
  // A common clock: every rank leaves the barrier together and notes its own steady clock.
  if (groups_) groups_->world().barrier();
  profiling::TraceProcess process;
  process.clock_sync_us = profiling::now_us();
  process.rank = rank();
  process.world_size = groups_ ? groups_->config().world_size() : 1;
  recorder.set_process(process);
  profiling::TraceRecorder::set_thread_name("main");
  struct StopGuard {  // never leave the recorder on after an error
    ~StopGuard() { profiling::TraceRecorder::instance().stop(); }
  } stop_guard;
  const int total = c.profile_wait + c.profile_warmup + c.profile_active;
  for (int i = 0; i < total; ++i) {
    if (i == c.profile_wait) recorder.start({/*torch_ops=*/true});
    if (i == c.profile_wait + c.profile_warmup) recorder.clear();
    const char* phase = i < c.profile_wait                      ? "wait"
                        : i < c.profile_wait + c.profile_warmup ? "warmup"
                                                                : "active";
    spdlog::info("profile generation {}/{} ({})", i + 1, total, phase);
    profiling::Span span("run", "generation");
    span.arg("index", i).arg("phase", phase);
    if (!args.request.prompts.empty()) model_->generate(args.request);
  }
  recorder.stop();
  const fs::path path = fs::path(c.output_directory) /
                        ("profile_trace_rank_" + std::to_string(rank()) + ".json");
  write_file_atomic(path, recorder.to_json().dump() + "\n");
  return path;
}

bool Runner::writes_images() const {
  if (!groups_) return true;
  const auto& w = groups_->config();
  const auto& r = groups_->coords();
  return r.tp == w.tp() - 1 && r.sp == w.sp() - 1 && r.pp == w.pp() - 1 && r.cfg == w.cfg() - 1;
}

int Runner::rank() const { return groups_ ? groups_->rank() : 0; }

bool Runner::writes_timings() const {
  return !groups_ || groups_->rank() == groups_->config().world_size() - 1;
}

void Runner::cleanup() { model_.reset(); }

}  // namespace xfuser::runner
