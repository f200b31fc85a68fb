#include "runner/runner.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backends/error.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/weights/hub_cache.h"
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

Runner::Runner(RunConfig config) : config_(std::move(config)) {}
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
  const int degrees[] = {c.ulysses_degree, c.ring_degree, c.pipefusion_parallel_degree,
                         c.tensor_parallel_degree, c.data_parallel_degree};
  const char* degree_flags[] = {"--ulysses_degree", "--ring_degree", "--pipefusion_parallel_degree",
                                "--tensor_parallel_degree", "--data_parallel_degree"};
  for (int i = 0; i < 5; ++i) {
    XF_CHECK(degrees[i] == 1, degree_flags[i], " ", degrees[i],
             ": parallel execution is not supported yet (this build runs one rank)");
  }

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
  r.prompts = c.prompt;
  if (!c.negative_prompt.empty()) {
    r.negative_prompts = c.negative_prompt.size() == 1
                             ? std::vector<std::string>(c.prompt.size(), c.negative_prompt[0])
                             : c.negative_prompt;
  }
  r.height = *c.height;
  r.width = *c.width;
  r.num_inference_steps = *c.num_inference_steps;
  r.guidance_scale = *c.guidance_scale;
  r.true_cfg_scale = *c.true_cfg_scale;
  r.max_sequence_length = *c.max_sequence_length;
  r.seeds.assign(c.prompt.size(), c.seed);
  return args;
}

void Runner::initialize(const ResolvedArgs& args) {
  const models::ModelSpec& spec = *args.spec;
  ensure_writable_directory(args.config.output_directory);
  if (!args.config.model_path.empty()) {
    model_dir_ = args.config.model_path;
  } else if (spec.maturity == "embedded") {
    model_dir_ = models::flux::ensure_tiny_flux(0);
  } else {
    XF_CHECK(!spec.hf_repo.empty(), "model ", spec.id,
             " has no Hugging Face repo: pass --model_path with its pipeline folder");
    model_dir_ = models::find_in_hub_cache(spec.hf_repo);
  }
  models::check_pipeline_folder(model_dir_);
  spdlog::info("loading {} from {} ({})", spec.id, model_dir_.string(), args.config.dtype);
  model_ = spec.create(spec);
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
  for (int i = 0; i < args.config.warmup_calls; ++i) {
    spdlog::info("warm-up call {}/{}", i + 1, args.config.warmup_calls);
    model_->generate(args.request);
  }
  for (int i = 0; i < args.config.num_iterations; ++i) {
    auto out = model_->generate(args.request);
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
  std::vector<fs::path> written;
  for (int64_t i = 0; i < result.images.size(0); ++i) {
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
    const fs::path path =
        dir / output_file_name(args.spec->id, c.ulysses_degree, c.ring_degree, c.use_torch_compile,
                               args.request.height, args.request.width, i, "png");
    write_png(path, result.images[i], text);
    written.push_back(path);
  }
  nlohmann::json timings = result.iteration_seconds;
  write_file_atomic(dir / "timings.json", timings.dump() + "\n");
  written.push_back(dir / "timings.json");
  return written;
}

void Runner::cleanup() { model_.reset(); }

}  // namespace xfuser::runner
