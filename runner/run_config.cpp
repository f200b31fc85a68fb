#include "runner/run_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <CLI/CLI.hpp>

#include "backends/error.h"
#include "models/schedulers/scheduler_config.h"
#include "models/step_cache_config.h"

namespace xfuser::runner {

void add_run_flags(CLI::App& app, RunConfig& c) {
  const char* kModel = "Model selection";
  app.add_option("--model", c.model,
                 "Model name, alias or Hugging Face repo id (list: `xfuser models`)")
      ->group(kModel);
  app.add_option("--model_path", c.model_path,
                 "A diffusers pipeline folder (model_index.json); overrides the cache lookup")
      ->group(kModel);
  app.add_option("--task", c.task,
                 "Task of a multi-task model (HunyuanVideo-1.5: t2v or i2v); it picks the "
                 "pipeline and joins the output names")
      ->group(kModel);

  const char* kPar = "Parallelization";
  app.add_option("--ulysses_degree", c.ulysses_degree, "Ulysses sequence parallel degree")
      ->group(kPar)
      ->capture_default_str();
  app.add_option("--ring_degree", c.ring_degree, "Ring sequence parallel degree")
      ->group(kPar)
      ->capture_default_str();
  app.add_option("--pipefusion_parallel_degree", c.pipefusion_parallel_degree,
                 "PipeFusion pipeline stages")
      ->group(kPar)
      ->capture_default_str();
  app.add_option("--tensor_parallel_degree", c.tensor_parallel_degree, "Tensor parallel degree")
      ->group(kPar)
      ->capture_default_str();
  app.add_option("--data_parallel_degree", c.data_parallel_degree, "Data parallel degree")
      ->group(kPar)
      ->capture_default_str();
  app.add_flag("--use_cfg_parallel", c.use_cfg_parallel, "Enable CFG parallel")->group(kPar);
  app.add_flag("--use_parallel_vae", c.use_parallel_vae, "Enable parallel VAE")->group(kPar);
  app.add_flag("--use_fsdp", c.use_fsdp,
               "Shard the weights of every component but the VAE over the ranks that run a "
               "generation together (Ulysses x ring x CFG); each block gathered just before it "
               "runs")
      ->group(kPar);
  app.add_flag("--hybrid_fsdp", c.hybrid_fsdp,
               "With --use_fsdp: shard within each host and replicate across hosts (hybrid "
               "sharding, HSDP): the gathers stay on a host's links, each rank holds 1/N of the "
               "weights for the N ranks of its group on its host")
      ->group(kPar);
  app.add_option("--num_pipeline_patch", c.num_pipeline_patch,
                 "PipeFusion patches (default: the pipeline degree)")
      ->group(kPar);
  app.add_option("--pipefusion_warmup_steps", c.pipefusion_warmup_steps,
                 "Synchronous PipeFusion warm-up steps")
      ->group(kPar)
      ->capture_default_str();
  app.add_option("--pipefusion_layers", c.pipefusion_layers,
                 "Transformer blocks per PipeFusion stage, e.g. 10,47 (default: balanced)")
      ->delimiter(',')
      ->group(kPar);
  app.add_flag("--pipefusion_psnr", c.pipefusion_psnr,
               "Also generate the exact (all warm-up) image; report PipeFusion's PSNR against it")
      ->group(kPar);
  app.add_flag("--dry_run", c.dry_run,
               "Print the memory plan of one rank (weights, and the activations of each stage) for "
               "these flags and exit without loading a weight; the pipeline folder may hold its "
               "config files alone; with --device cuda it plans for a GPU on any machine")
      ->group(kPar);
  app.add_option("--device_memory_gib", c.device_memory_gib,
                 "With --dry_run: the memory of one device in GiB; the plan says whether the run "
                 "fits it (exit 1 when it does not)")
      ->group(kPar);
  app.add_option("--comm_timeout", c.comm_timeout,
                 "Seconds a rank waits in any collective before the job is aborted")
      ->group(kPar)
      ->capture_default_str();

  const char* kIn = "Input parameters";
  app.add_option("--prompt", c.prompt, "Text prompt(s) for generation")->group(kIn);
  app.add_option("--negative_prompt", c.negative_prompt, "Negative prompt(s)")->group(kIn);
  app.add_option("--height", c.height, "Output height (model default)")->group(kIn);
  app.add_option("--width", c.width, "Output width (model default)")->group(kIn);
  app.add_option("--num_frames", c.num_frames, "Number of frames for video models")->group(kIn);
  app.add_option("--fps", c.fps, "Frame rate of the output video (model default)")->group(kIn);
  app.add_option("--flow_shift", c.flow_shift,
                 "Flow-matching timestep shift (model default, else the scheduler folder's)")
      ->group(kIn);
  app.add_option("--flow_sigmas", c.flow_sigmas,
                 "UniPC flow sigmas (Wan): from_one (diffusers >= 0.42) or reference (Wan's own "
                 "code, diffusers <= 0.41); default: by the scheduler folder's _diffusers_version")
      ->check(CLI::IsMember({"from_one", "reference"}))
      ->group(kIn);
  app.add_option("--guidance_scale_2", c.guidance_scale_2,
                 "Guidance scale of the low-noise expert (Wan2.2; default: --guidance_scale)")
      ->group(kIn);
  app.add_option("--output_type", c.output_type,
                 "Video models: 'video' writes an MP4, 'frames' the MP4 and a PNG per frame")
      ->check(CLI::IsMember({"video", "frames"}))
      ->group(kIn)
      ->capture_default_str();
  app.add_option("--num_inference_steps", c.num_inference_steps, "Denoising steps")->group(kIn);
  app.add_option("--guidance_scale", c.guidance_scale, "Guidance scale (model default)")
      ->group(kIn);
  app.add_option(
         "--true_cfg_scale", c.true_cfg_scale,
         "True classifier-free guidance scale (FLUX, HunyuanVideo; > 1 with a negative prompt)")
      ->group(kIn);
  app.add_option("--max_sequence_length", c.max_sequence_length, "Maximum text sequence length")
      ->group(kIn);
  app.add_option("--seed", c.seed, "Random seed for reproducibility, in [-2^63, 2^63)")
      ->check(CLI::Validator(check_seed_text, "INT64", "seed"))
      ->group(kIn)
      ->capture_default_str();
  app.add_option("--input_images", c.input_images, "Input image paths for image-to-image/video")
      ->group(kIn);
  app.add_option("--max_input_pixels", c.max_input_pixels,
                 "Largest input picture (width x height) decoded; a file declaring more is refused "
                 "before decoding (PIL's decompression-bomb limit by default)")
      ->group(kIn)
      ->capture_default_str();
  app.add_option("--latents", c.latents,
                 "Initial latents: a safetensors file with tensor 'latents' [prompts, ...] in the "
                 "layout the model's diffusers pipeline takes (what --save_latents writes)")
      ->group(kIn);
  app.add_flag("--save_latents", c.save_latents,
               "Also write <image>.latents.safetensors: the initial latents ('latents', the "
               "--latents format) and the final ones ('final_latents')")
      ->group(kIn);

  const char* kOpt = "Optimization options";
  app.add_flag("--use_torch_compile", c.use_torch_compile,
               "Compile / fused-override path of the backend")
      ->group(kOpt);
  app.add_flag("--use_fp8_gemms", c.use_fp8_gemms,
               "Transformer blocks' linear layers in float8_e4m3fn with per-channel scales, run "
               "as FP8 GEMMs with per-token activation scales (scaled matmul on GPUs with FP8 "
               "tensor cores, emulated elsewhere; docs/fp8.md)")
      ->group(kOpt);
  app.add_option("--fp8_storage", c.fp8_storage,
                 "Store the transformer's weights in this fp8 dtype and upcast each layer to the "
                 "compute dtype as it runs, as diffusers' enable_layerwise_casting "
                 "(float8_e4m3fn or float8_e5m2)")
      ->check(CLI::IsMember({"float8_e4m3fn", "float8_e5m2"}))
      ->group(kOpt);
  app.add_flag("--enable_tiling", c.enable_tiling, "Enable VAE tiling")->group(kOpt);
  app.add_flag("--enable_slicing", c.enable_slicing, "Enable VAE slicing")->group(kOpt);
  app.add_flag("--enable_model_cpu_offload", c.enable_model_cpu_offload, "Enable model CPU offload")
      ->group(kOpt);
  app.add_flag("--enable_sequential_cpu_offload", c.enable_sequential_cpu_offload,
               "Enable sequential CPU offload")
      ->group(kOpt);
  app.add_option("--attention_backend", c.attention_backend,
                 "Attention kernel: auto (CUDA: the one PyTorch's SDPA picks; CPU: xfuser's), "
                 "chunked, or on CUDA flash, efficient, cudnn (default: XFUSER_ATTENTION_KERNEL, "
                 "else auto)")
      ->check(CLI::IsMember({"auto", "chunked", "flash", "efficient", "cudnn"}))
      ->group(kOpt);
  const char* kLora = "LoRA adapters (docs/lora.md)";
  app.add_option("--lora", c.lora,
                 "A LoRA adapter file (.safetensors: diffusers / PEFT, or the family's kohya or "
                 "original layout) and its scale, PATH or PATH:SCALE (default 1.0); repeat for "
                 "several")
      ->group(kLora);
  app.add_option("--lora_2", c.lora_2,
                 "Wan 2.2: an adapter for the second (low-noise) expert, transformer_2, as "
                 "diffusers' load_into_transformer_2; PATH or PATH:SCALE, repeatable")
      ->group(kLora);
  app.add_option("--lora_mode", c.lora_mode,
                 "fused: the adapters are added into the weights at load (no cost per step); "
                 "unfused: they run beside the weights, so a generation can change their scales")
      ->check(CLI::IsMember({"fused", "unfused"}))
      ->group(kLora)
      ->capture_default_str();
  const char* kCache = "Step caching options (docs/caching.md)";
  app.add_option("--cache", c.cache,
                 "Skip work between denoising steps: fbcache (First-Block Cache), taylorseer, "
                 "magcache, teacache or none")
      ->group(kCache)
      ->capture_default_str();
  app.add_option("--cache_threshold", c.cache_threshold,
                 "fbcache: relative change of the first block's residual below which the other "
                 "blocks are skipped (default 0.05); magcache: accumulated error allowed "
                 "(default 0.06); teacache: accumulated rescaled change allowed (default: the "
                 "model's published one)")
      ->group(kCache);
  app.add_option("--cache_max_skip_steps", c.cache_max_skip_steps,
                 "magcache: most consecutive skipped steps (default 3)")
      ->group(kCache);
  app.add_option("--cache_retention_ratio", c.cache_retention_ratio,
                 "magcache: fraction of the first steps never skipped (default 0.2)")
      ->group(kCache);
  app.add_option("--cache_mag_ratios", c.cache_mag_ratios,
                 "magcache: the model's magnitude ratios, one per step of a calibration run "
                 "(comma-separated; default: the model's published ones)")
      ->delimiter(',')
      ->group(kCache);
  app.add_option("--cache_teacache_coefficients", c.cache_teacache_coefficients,
                 "teacache: the model's rescaling polynomial, highest power first "
                 "(comma-separated; default: the model's published one)")
      ->delimiter(',')
      ->group(kCache);
  app.add_flag("--cache_calibrate", c.cache_calibrate,
               "magcache: skip nothing and report this run's magnitude ratios (timings.json: "
               "cache.calibration)")
      ->group(kCache);
  app.add_option("--cache_interval", c.cache_interval,
                 "taylorseer: period of the full steps after the warm-up (default 5)")
      ->group(kCache);
  app.add_option("--cache_disable_before_step", c.cache_disable_before_step,
                 "taylorseer: full steps before the first prediction (default 3)")
      ->group(kCache);
  app.add_option("--cache_disable_after_step", c.cache_disable_after_step,
                 "taylorseer: every step from this one on runs in full (default: none)")
      ->group(kCache);
  app.add_option("--cache_max_order", c.cache_max_order,
                 "taylorseer: order of the Taylor series (default 1)")
      ->group(kCache);
  app.add_option("--cache_factors_dtype", c.cache_factors_dtype,
                 "taylorseer: dtype of the kept Taylor factors (default: the compute dtype)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->group(kCache);
  app.add_option("--dtype", c.dtype, "Compute dtype: fp32, bf16 or fp16 (default: model's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->group(kOpt);
  app.add_option("--device", c.device,
                 "Compute device: auto (cuda when this libtorch has CUDA and a GPU is visible, "
                 "else cpu), cpu or cuda (rank r takes cuda:(local rank % GPUs))")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->group(kOpt)
      ->capture_default_str();
  app.add_option("--comm_backend", c.comm_backend,
                 "Collectives of CUDA tensors in a multi-rank run: nccl (one rank per GPU), mpi "
                 "(through host memory; ranks may share a GPU) or auto (nccl when built in and no "
                 "GPU is shared, else mpi). CPU tensors always use MPI")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))
      ->group(kOpt)
      ->capture_default_str();

  const char* kBench = "Benchmarking";
  app.add_option("--num_iterations", c.num_iterations, "Number of timed iterations")
      ->group(kBench)
      ->capture_default_str();
  app.add_option("--warmup_calls", c.warmup_calls, "Untimed warm-up generations")
      ->group(kBench)
      ->capture_default_str();
  app.add_option("--batch_size", c.batch_size,
                 "Prompts denoised together (a batched run; required with --dataset_path)")
      ->group(kBench);
  app.add_option("--dataset_path", c.dataset_path, "Prompt dataset (.txt, .csv or .jsonl)")
      ->group(kBench);
  app.add_option("--output_directory", c.output_directory, "Output save directory")
      ->group(kBench)
      ->capture_default_str();
  app.add_flag("--resume", c.resume, "Dataset runs: skip prompts whose output is complete")
      ->group(kBench);

  const char* kProf = "Profiling";
  app.add_flag("--profile", c.profile,
               "Write per-rank Chrome traces (profile_trace_rank_{r}.json) instead of outputs")
      ->group(kProf);
  app.add_option("--profile_wait", c.profile_wait, "Profiler wait steps (generations run untraced)")
      ->group(kProf)
      ->capture_default_str();
  app.add_option("--profile_warmup", c.profile_warmup,
                 "Profiler warmup steps (generations traced, then dropped)")
      ->group(kProf)
      ->capture_default_str();
  app.add_option("--profile_active", c.profile_active,
                 "Profiler active steps (generations in the trace)")
      ->group(kProf)
      ->capture_default_str();

  app.add_option("--log_level", c.log_level, "trace, debug, info, warn or error")
      ->group("Logging")
      ->capture_default_str();
}

std::string check_seed_text(const std::string& text) {
  int64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (first == last || ptr != last || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return "--seed must be an integer (got '" + text + "')";
  }
  if (ec == std::errc::result_out_of_range) {
    return "--seed " + text +
           " is out of range: seeds are integers in [-2^63, 2^63) = [-9223372036854775808, "
           "9223372036854775807]";
  }
  return "";
}

namespace {

// The step-cache flags: each parameter belongs to the method chosen, and is in range.
void validate_cache_flags(const RunConfig& c) {
  const models::CacheMethod method = models::parse_cache_method(c.cache);
  using M = models::CacheMethod;
  auto only_for = [&](bool given, const char* flag, std::vector<M> owners) {
    if (!given || std::find(owners.begin(), owners.end(), method) != owners.end()) return;
    std::string names;
    for (size_t i = 0; i < owners.size(); ++i) {
      names += (i == 0 ? "" : i + 1 == owners.size() ? " and " : ", ");
      names += models::cache_method_name(owners[i]);
    }
    XF_THROW(flag, " is a parameter of --cache ", names, ", not of --cache ", c.cache);
  };
  only_for(c.cache_threshold.has_value(), "--cache_threshold",
           {M::kFirstBlock, M::kMagCache, M::kTeaCache});
  only_for(!c.cache_teacache_coefficients.empty(), "--cache_teacache_coefficients", {M::kTeaCache});
  only_for(c.cache_max_skip_steps.has_value(), "--cache_max_skip_steps", {M::kMagCache});
  only_for(c.cache_retention_ratio.has_value(), "--cache_retention_ratio", {M::kMagCache});
  only_for(!c.cache_mag_ratios.empty(), "--cache_mag_ratios", {M::kMagCache});
  only_for(c.cache_calibrate, "--cache_calibrate", {M::kMagCache});
  only_for(c.cache_interval.has_value(), "--cache_interval", {M::kTaylorSeer});
  only_for(c.cache_disable_before_step.has_value(), "--cache_disable_before_step",
           {M::kTaylorSeer});
  only_for(c.cache_disable_after_step.has_value(), "--cache_disable_after_step", {M::kTaylorSeer});
  only_for(c.cache_max_order.has_value(), "--cache_max_order", {M::kTaylorSeer});
  only_for(!c.cache_factors_dtype.empty(), "--cache_factors_dtype", {M::kTaylorSeer});
  if (c.cache_threshold) {
    XF_CHECK(std::isfinite(*c.cache_threshold) && *c.cache_threshold >= 0,
             "--cache_threshold must be a non-negative number (got ", *c.cache_threshold, ")");
  }
  if (c.cache_max_skip_steps) {
    XF_CHECK(*c.cache_max_skip_steps >= 0, "--cache_max_skip_steps must be >= 0 (got ",
             *c.cache_max_skip_steps, ")");
  }
  if (c.cache_retention_ratio) {
    XF_CHECK(std::isfinite(*c.cache_retention_ratio) && *c.cache_retention_ratio >= 0 &&
                 *c.cache_retention_ratio <= 1,
             "--cache_retention_ratio must be in [0, 1] (got ", *c.cache_retention_ratio, ")");
  }
  for (double x : c.cache_teacache_coefficients) {
    XF_CHECK(std::isfinite(x), "--cache_teacache_coefficients: every coefficient must be a finite ",
             "number (got ", x, ")");
  }
  for (double r : c.cache_mag_ratios) {
    XF_CHECK(std::isfinite(r) && r > 0, "--cache_mag_ratios: every ratio must be a positive ",
             "number (got ", r, ")");
  }
  XF_CHECK(!(c.cache_calibrate && !c.cache_mag_ratios.empty()),
           "--cache_calibrate measures the ratios that --cache_mag_ratios gives: give one");
  if (c.cache_interval) {
    XF_CHECK(*c.cache_interval >= 1, "--cache_interval must be >= 1 (got ", *c.cache_interval, ")");
  }
  if (c.cache_disable_before_step) {
    XF_CHECK(*c.cache_disable_before_step >= 1,
             "--cache_disable_before_step must be >= 1: TaylorSeer predicts from a computed step "
             "(got ",
             *c.cache_disable_before_step, ")");
  }
  if (c.cache_disable_after_step) {
    XF_CHECK(*c.cache_disable_after_step >= 0, "--cache_disable_after_step must be >= 0 (got ",
             *c.cache_disable_after_step, ")");
  }
  if (c.cache_max_order) {
    XF_CHECK(*c.cache_max_order >= 0 && *c.cache_max_order <= 8,
             "--cache_max_order must be in [0, 8] (got ", *c.cache_max_order, ")");
  }
  XF_CHECK(method == M::kNone || c.pipefusion_parallel_degree == 1, "--cache ", c.cache,
           " with --pipefusion_parallel_degree ", c.pipefusion_parallel_degree,
           " is not supported: PipeFusion's stages run stale patches of different steps, so a "
           "skip could not be decided for the whole model; use Ulysses, ring, CFG, tensor or "
           "data parallelism with step caching");
}

}  // namespace

void validate_values(const RunConfig& c) {
  auto positive = [](const char* flag, int value) {
    XF_CHECK(value >= 1, flag, " must be >= 1 (got ", value, ")");
  };
  auto at_most = [](const char* flag, int64_t value, int64_t limit) {
    XF_CHECK(value <= limit, flag, " must be at most ", limit, " (got ", value, ")");
  };
  for (auto [flag, value] : {std::pair{"--ulysses_degree", c.ulysses_degree},
                             {"--ring_degree", c.ring_degree},
                             {"--pipefusion_parallel_degree", c.pipefusion_parallel_degree},
                             {"--tensor_parallel_degree", c.tensor_parallel_degree},
                             {"--data_parallel_degree", c.data_parallel_degree},
                             {"--num_pipeline_patch", c.num_pipeline_patch}}) {
    at_most(flag, value, Limits::kMaxDegree);
  }
  at_most("--num_iterations", c.num_iterations, Limits::kMaxIterations);
  at_most("--warmup_calls", c.warmup_calls, Limits::kMaxIterations);
  at_most("--pipefusion_warmup_steps", c.pipefusion_warmup_steps, Limits::kMaxSteps);
  if (c.num_inference_steps) {
    at_most("--num_inference_steps", *c.num_inference_steps, Limits::kMaxSteps);
  }
  if (c.batch_size) at_most("--batch_size", *c.batch_size, Limits::kMaxBatchSize);
  if (c.max_sequence_length) {
    at_most("--max_sequence_length", *c.max_sequence_length, Limits::kMaxSequenceLength);
  }
  at_most("--profile_wait", c.profile_wait, Limits::kMaxIterations);
  at_most("--profile_warmup", c.profile_warmup, Limits::kMaxIterations);
  at_most("--profile_active", c.profile_active, Limits::kMaxIterations);
  XF_CHECK(!std::isfinite(c.comm_timeout) || c.comm_timeout <= 1e7,
           "--comm_timeout must be at most 10000000 seconds (got ", c.comm_timeout, ")");
  positive("--ulysses_degree", c.ulysses_degree);
  positive("--ring_degree", c.ring_degree);
  positive("--pipefusion_parallel_degree", c.pipefusion_parallel_degree);
  positive("--tensor_parallel_degree", c.tensor_parallel_degree);
  positive("--data_parallel_degree", c.data_parallel_degree);
  positive("--num_iterations", c.num_iterations);
  XF_CHECK(c.warmup_calls >= 0, "--warmup_calls must be >= 0 (got ", c.warmup_calls, ")");
  XF_CHECK(c.pipefusion_warmup_steps >= 0, "--pipefusion_warmup_steps must be >= 0 (got ",
           c.pipefusion_warmup_steps, ")");
  XF_CHECK(c.num_pipeline_patch >= 0, "--num_pipeline_patch must be >= 0 (got ",
           c.num_pipeline_patch, ")");
  if (c.pipefusion_parallel_degree == 1) {
    XF_CHECK(c.num_pipeline_patch == 0 && c.pipefusion_layers.empty() && !c.pipefusion_psnr,
             "--num_pipeline_patch, --pipefusion_layers and --pipefusion_psnr need "
             "--pipefusion_parallel_degree > 1");
  } else {
    const int patches =
        c.num_pipeline_patch > 0 ? c.num_pipeline_patch : c.pipefusion_parallel_degree;
    XF_CHECK(patches == 1 || c.pipefusion_warmup_steps >= 1,
             "--pipefusion_warmup_steps must be >= 1 with ", patches,
             " pipeline patches (the warm-up fills the stale K/V buffers)");
    XF_CHECK(c.pipefusion_layers.empty() ||
                 static_cast<int>(c.pipefusion_layers.size()) == c.pipefusion_parallel_degree,
             "--pipefusion_layers gives ", c.pipefusion_layers.size(),
             " stage(s); --pipefusion_parallel_degree is ", c.pipefusion_parallel_degree);
    for (auto n : c.pipefusion_layers) {
      XF_CHECK(n >= 1, "--pipefusion_layers: every stage needs at least one block (got ", n, ")");
    }
  }
  XF_CHECK(std::isfinite(c.device_memory_gib) && c.device_memory_gib >= 0,
           "--device_memory_gib must be a non-negative number of GiB (got ", c.device_memory_gib,
           ")");
  XF_CHECK(c.device_memory_gib == 0 || c.dry_run,
           "--device_memory_gib is read by --dry_run's plan: give --dry_run too");
  XF_CHECK(!c.hybrid_fsdp || c.use_fsdp,
           "--hybrid_fsdp chooses how --use_fsdp shards (within each host): give --use_fsdp too");
  XF_CHECK(std::isfinite(c.comm_timeout) && c.comm_timeout > 0,
           "--comm_timeout must be a positive number of seconds (got ", c.comm_timeout, ")");
  // Collectives count their timeout in whole milliseconds.
  XF_CHECK(c.comm_timeout >= 0.001,
           "--comm_timeout must be at least 0.001 seconds (one "
           "millisecond, the timeouts' unit), got ",
           c.comm_timeout);
  if (c.num_inference_steps) positive("--num_inference_steps", *c.num_inference_steps);
  if (c.batch_size) positive("--batch_size", *c.batch_size);
  validate_cache_flags(c);
  for (auto [flag, value] : {std::pair{"--height", c.height}, std::pair{"--width", c.width}}) {
    if (!value) continue;
    XF_CHECK(*value > 0 && *value % 16 == 0, flag, " must be a positive multiple of 16 (got ",
             *value, ")");
    at_most(flag, *value, Limits::kMaxSide);
  }
  if (c.num_frames) {
    positive("--num_frames", *c.num_frames);
    at_most("--num_frames", *c.num_frames, Limits::kMaxFrames);
  }
  if (c.fps) {
    positive("--fps", *c.fps);
    at_most("--fps", *c.fps, Limits::kMaxFps);
  }
  if (c.flow_shift) models::schedulers::check_flow_shift(*c.flow_shift, "--flow_shift");
  for (auto [flag, value] : {std::pair{"--guidance_scale", c.guidance_scale},
                             std::pair{"--guidance_scale_2", c.guidance_scale_2},
                             std::pair{"--true_cfg_scale", c.true_cfg_scale}}) {
    if (!value) continue;
    XF_CHECK(std::isfinite(*value), flag, " must be a finite number (got ", *value, ")");
    XF_CHECK(*value >= 0, flag, " must be >= 0 (got ", *value, ")");
    XF_CHECK(*value <= Limits::kMaxGuidance, flag, " must be at most ", Limits::kMaxGuidance,
             " (got ", *value, "): larger scales overflow the latents");
  }
  if (c.max_sequence_length) positive("--max_sequence_length", *c.max_sequence_length);
  XF_CHECK(c.profile_wait >= 0 && c.profile_warmup >= 0 && c.profile_active >= 1,
           "--profile_wait and --profile_warmup must be >= 0 and --profile_active >= 1 (got ",
           c.profile_wait, ", ", c.profile_warmup, ", ", c.profile_active, ")");
  XF_CHECK(!c.output_directory.empty(), "--output_directory must not be empty");
}

}  // namespace xfuser::runner
