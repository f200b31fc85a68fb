// RunConfig: every xfuser-run flag, with xDiT's names and groups (../shared/seeds/
// xdit-unified-runner.md). Parsed once, then immutable; model defaults are applied by
// Runner::preprocess_args from the model's registry entry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/image_input.h"

namespace CLI {
class App;
}

namespace xfuser::runner {

struct RunConfig {
  // Model selection
  std::string model;  // registry id or alias, or a Hugging Face repo id
  std::string model_path;
  std::string task;

  // Parallelization
  int ulysses_degree = 1;
  int ring_degree = 1;
  int pipefusion_parallel_degree = 1;
  int tensor_parallel_degree = 1;
  int data_parallel_degree = 1;
  bool use_cfg_parallel = false;
  bool use_parallel_vae = false;
  bool use_fsdp = false;
  // --hybrid_fsdp: FSDP shards within each host and replicates across hosts (HSDP).
  bool hybrid_fsdp = false;
  // --dry_run: print the memory plan per rank and exit without loading any weight.
  bool dry_run = false;
  double device_memory_gib = 0.0;  // --device_memory_gib: what the plan is checked against
  int num_pipeline_patch = 0;      // 0: the pp degree
  int pipefusion_warmup_steps = 1;
  std::vector<int64_t> pipefusion_layers;  // blocks per stage; empty: balanced
  bool pipefusion_psnr = false;            // also generate the exact image and report the PSNR
  double comm_timeout = 600.0;             // seconds, every blocking collective

  // Input parameters (unset optionals take the model's defaults)
  std::vector<std::string> prompt;
  std::vector<std::string> negative_prompt;
  std::optional<int> height;
  std::optional<int> width;
  std::optional<int> num_frames;
  std::optional<int> fps;            // video models: the MP4's frame rate (model default)
  std::optional<double> flow_shift;  // flow-matching shift (model default, else the folder's)
  // UniPC's flow sigmas before the shift (Wan): "from_one" (diffusers >= 0.42) or "reference"
  // (Wan's own code, diffusers <= 0.41); unset: by the scheduler config's _diffusers_version.
  std::optional<std::string> flow_sigmas;
  std::optional<double> guidance_scale_2;  // Wan2.2's low-noise expert guidance
  // "video" (MP4) or "frames" (MP4 and one PNG per frame) for video models.
  std::string output_type = "video";
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> true_cfg_scale;
  std::optional<int> max_sequence_length;
  int64_t seed = 42;
  std::vector<std::string> input_images;
  // The largest input picture (width x height) decoded; image_input.h's kDefaultMaxImagePixels.
  int64_t max_input_pixels = kDefaultMaxImagePixels;
  // --latents: a safetensors file whose tensor "latents" holds the initial latents of every
  // prompt ([P, ...] in the layout of the model's diffusers pipeline `latents` argument).
  std::string latents;
  // --save_latents: next to every image, <image>.latents.safetensors with its initial
  // ("latents", the --latents format) and final ("final_latents") latents.
  bool save_latents = false;

  // Optimization
  bool use_torch_compile = false;
  bool use_fp8_gemms = false;
  std::string fp8_storage;  // "" (weights as loaded), float8_e4m3fn or float8_e5m2
  bool enable_tiling = false;
  bool enable_slicing = false;
  bool enable_model_cpu_offload = false;
  bool enable_sequential_cpu_offload = false;
  std::string attention_backend;
  // Step caching (models/step_cache_config.h): --cache fbcache|taylorseer|magcache|teacache|none
  // and its parameters; a parameter of another method than the one chosen is an error.
  std::string cache = "none";
  std::optional<double> cache_threshold;            // fbcache, magcache, teacache
  std::vector<double> cache_teacache_coefficients;  // teacache
  std::optional<int> cache_max_skip_steps;          // magcache
  std::optional<double> cache_retention_ratio;      // magcache
  std::vector<double> cache_mag_ratios;             // magcache
  bool cache_calibrate = false;                     // magcache
  std::optional<int> cache_interval;                // taylorseer
  std::optional<int> cache_disable_before_step;     // taylorseer
  std::optional<int> cache_disable_after_step;      // taylorseer
  std::optional<int> cache_max_order;               // taylorseer
  std::string cache_factors_dtype;                  // taylorseer: fp32, bf16, fp16
  // LoRA adapters (models/common/lora.h): --lora PATH[:SCALE] (the transformer and, where the
  // file has them, the text encoders) and --lora_2 PATH[:SCALE] (Wan 2.2's transformer_2);
  // --lora_mode fused (into the weights at load) or unfused (beside them).
  std::vector<std::string> lora;
  std::vector<std::string> lora_2;
  std::string lora_mode = "fused";
  std::string dtype;  // "", fp32, bf16, fp16 ("" = model default for the device)
  // auto (CUDA when this libtorch has it and a GPU is visible), cpu or cuda (backends/device.h).
  std::string device = "auto";
  // Device-tensor plane of a multi-rank CUDA run: auto, nccl or mpi
  // (parallel/two_plane_communicator.h: make_world_communicator).
  std::string comm_backend = "auto";

  // Benchmarking
  int num_iterations = 1;
  int warmup_calls = 0;
  std::optional<int> batch_size;
  std::string dataset_path;
  std::string output_directory = ".";
  bool resume = false;

  // Profiling
  bool profile = false;
  int profile_wait = 2;
  int profile_warmup = 2;
  int profile_active = 1;

  // Logging
  std::string log_level = "info";
};

// Declares every flag on `app`, bound to `config`, grouped like xDiT's tables.
void add_run_flags(CLI::App& app, RunConfig& config);

// Upper bounds of values no run needs more of (the error gives the limit). Memory is estimated
// per model before loading (runner::check_before_loading); these catch absurd values first.
struct Limits {
  static constexpr int kMaxSteps = 10000;
  static constexpr int kMaxSide = 16384;  // --height / --width
  static constexpr int kMaxFrames = 4096;
  static constexpr int kMaxFps = 1000;
  static constexpr double kMaxGuidance = 1000.0;
  static constexpr int kMaxSequenceLength = 65536;
  static constexpr int kMaxBatchSize = 4096;
  static constexpr int kMaxDegree = 65536;
  static constexpr int kMaxIterations = 1000000;
};

// Checks values that are wrong for any model (zero steps, sizes not multiples of 16, NaN/inf
// guidance, degrees < 1, values over Limits, ...). Throws xfuser::Error naming the flag, the
// value and what is expected.
void validate_values(const RunConfig& config);

// The --seed range: an integer in [-2^63, 2^63) (torch.manual_seed's signed range; a negative
// seed seeds the generator with its two's-complement value). Larger values are errors, never
// clamped. Returns "" when `text` is valid, else the reason.
std::string check_seed_text(const std::string& text);

}  // namespace xfuser::runner
