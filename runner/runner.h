// xfuser::Runner: the life cycle of xfuser-run, usable from C++ (../shared/seeds/
// xdit-unified-runner.md "Programmatic Usage"):
//
//   xfuser::runner::Runner runner(config);
//   auto args = runner.preprocess_args();   // model defaults applied, flags checked
//   runner.initialize(args);                // weights found and loaded
//   auto result = runner.run(args);         // warm-up calls, then timed iterations
//   runner.save(result);                    // images + timings.json
//   (or, with --profile: runner.profile(args) writes profile_trace_rank_{r}.json, nothing else)
//   runner.cleanup();
//
// Batched runs (--batch_size B, with --dataset_path or --prompt): each data-parallel group
// denoises its prompts B at a time, and run() writes every batch's images as soon as they are
// decoded (an interrupted run keeps its finished outputs; --resume skips them next time).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/attention.h"
#include "models/registry.h"
#include "models/xfuser_model.h"
#include "parallel/communicator.h"
#include "runner/outputs.h"
#include "runner/run_config.h"

namespace xfuser::parallel {
class ProcessGroups;
}

namespace xfuser::runner {

// The effective arguments of a run: the flags with the model's defaults applied.
struct ResolvedArgs {
  RunConfig config;                         // every optional filled in
  RunConfig given;                          // the flags as given, before the model's defaults
  const models::ModelSpec* spec = nullptr;  // the registry entry
  models::GenerationRequest request;        // this data-parallel group's prompts
  std::vector<int64_t> prompt_indices;      // their global indices (output file names)
  std::vector<bool> has_negative;           // per prompt: true CFG with negative_prompts[i]
  int batch_size = 0;                       // > 0: batched run (run() writes the images)
  int64_t total_prompts = 0;                // in the whole run, over every dp group
  int64_t skipped_prompts = 0;              // --resume: outputs already complete
  // file_digest of each --input_images file and of the --latents file: recorded in every output
  // and compared by --resume, as the other inputs that change the output.
  std::vector<std::string> input_image_digests;
  std::string latents_digest;
  c10::ScalarType dtype = c10::kFloat;
  // --device on this rank (backends::select_device: made the current CUDA device when CUDA).
  c10::Device device = c10::Device(c10::kCPU);
  // --attention_backend, else XFUSER_ATTENTION_KERNEL, else automatic; initialize() makes it the
  // process default (backends::set_default_attention_kernel).
  backends::AttentionKernel attention_kernel = backends::AttentionKernel::automatic;
  // --use_fp8_gemms / --fp8_storage: how the transformers hold their weights.
  models::WeightFormat transformer_weights;
  // --enable_model_cpu_offload / --enable_sequential_cpu_offload.
  models::OffloadMode offload = models::OffloadMode::kNone;
  // --cache and its parameters, defaults filled in.
  models::StepCacheConfig cache;
  // --lora / --lora_2 (each adapter named after its file, made unique) and --lora_mode; the
  // files' digests, recorded in every output and compared by --resume.
  std::vector<models::LoraSpec> lora;
  std::vector<std::string> lora_digests;
  bool lora_fused = true;
};

// What one request of a long-lived process sets (`xfuser serve`): its prompts and the inputs
// that differ between requests. Unset values take the process's flags, then the model's
// defaults, as a run's would. Everything else (model, layout, device, dtype, kernels, weights,
// adapters) is fixed by the plan (Runner::resolve_plan) for the life of the process.
struct RequestInputs {
  std::vector<std::string> prompts;
  std::vector<std::optional<std::string>> negative_prompts;  // one per prompt
  std::vector<int64_t> seeds;                                // one per prompt
  std::optional<int> height;
  std::optional<int> width;
  std::optional<int> num_frames;
  std::optional<int> fps;
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> true_cfg_scale;
  std::optional<double> guidance_scale_2;
  std::optional<int> max_sequence_length;
  std::vector<std::string> input_images;  // picture files (PNG or JPEG)
  // LoRA scales of this request by adapter name (--lora_mode unfused; a fused adapter takes
  // only its load scale). Adapters not named run at their load scale.
  std::map<std::string, double> lora_scales;
};

// Communication per group name, then per operation, of one timed iteration.
using CommReport = std::map<std::string, std::map<std::string, parallel::OpStats>>;

struct RunResult {
  at::Tensor images;                      // uint8 [B, H, W, 3] of the last timed iteration
  std::vector<double> iteration_seconds;  // one per timed iteration (batched: one per batch)
  std::vector<models::GenerationOutput> iterations;     // stage timings per generate() call
  std::vector<std::vector<int64_t>> iteration_prompts;  // global prompt indices per call
  std::vector<CommReport> comm;                         // per generate() call (empty on one rank)
  std::vector<std::filesystem::path> written;           // batched runs: images run() wrote
  // --pipefusion_psnr: PSNR (dB, +inf when identical) of the last timed image against the
  // exact PipeFusion image (all steps synchronous).
  std::optional<double> pipefusion_psnr;
};

// The per-rank run report, timings_rank{r}.json (schema in docs/timings.md).
constexpr int kRunReportSchemaVersion = 1;

class Runner {
 public:
  // `groups`: the process-group mesh of a parallel run (null: one rank).
  explicit Runner(RunConfig config, std::shared_ptr<parallel::ProcessGroups> groups = nullptr);
  ~Runner();

  // Resolves the model, applies its defaults, and checks every flag against its capabilities:
  // an unsupported flag is an error naming the flag and the model. Reads --dataset_path, and
  // with --resume checks which outputs are already complete (world rank 0 decides, every rank
  // agrees) and removes the temporary files an interrupted run left; writes nothing.
  ResolvedArgs preprocess_args() const;
  // The part of preprocess_args fixed for the life of a process: the model and its flag checks,
  // the layout, device, dtype, attention kernel, weight format, offload, cache and adapters,
  // resolved and checked once. Its request is empty; resolve_request fills one per request.
  ResolvedArgs resolve_plan() const;
  // A plan with one request's inputs: checked as a run's flags would be (errors name the flag),
  // sizes and defaults filled as a run's, every prompt in one generation (no data-parallel
  // split). Every rank given the same plan and inputs resolves the same request.
  ResolvedArgs resolve_request(const ResolvedArgs& plan, const RequestInputs& inputs) const;
  // Finds the weights (--model_path, the embedded tiny model, or the Hugging Face cache), checks
  // the output folder, and loads the model.
  void initialize(const ResolvedArgs& args);
  // warmup_calls untimed generations, then num_iterations timed ones. Batched runs: the
  // warm-up calls use the first batch; each timed iteration goes over every batch, and the
  // first writes the images.
  RunResult run(const ResolvedArgs& args);
  // Writes the images (xDiT's names, parameters as PNG text) and timings.json, atomically.
  // Under parallelism the last rank of each model replica writes its prompts' images (no pixels
  // travel between replicas) and the last world rank writes timings.json, as xDiT.
  std::vector<std::filesystem::path> save(const ResolvedArgs& args, const RunResult& result);
  // --profile (xDiT's schedule): profile_wait untraced generations, profile_warmup traced and
  // discarded, profile_active traced; then every rank writes output_directory/
  // profile_trace_rank_{r}.json (Chrome trace, docs/profiling.md). Writes no images or timings.
  // All ranks start together (world barrier) and record their clock there for `xfuser trace merge`.
  std::filesystem::path profile(const ResolvedArgs& args);
  void cleanup();

  // One generation of args.request (after initialize), checked to be finite: what run() times.
  // Every rank of the job calls it together.
  models::GenerationOutput generate(const ResolvedArgs& args);
  // The text chunks xfuser-run records in the output of prompt `index` of args.request.
  std::map<std::string, std::string> output_text(const ResolvedArgs& args, size_t index) const;
  // Writes output `index` of args.request (a picture [H, W, 3]: PNG; a video [F, H, W, 3]: MP4,
  // and with --output_type frames one PNG per frame) to `path`, atomically, with output_text.
  void write_output(const ResolvedArgs& args, size_t index, const at::Tensor& image,
                    const std::filesystem::path& path) const;
  // Whether this rank holds the decoded pictures of its model replica (the rank that writes
  // them in a run).
  bool writes_images() const;
  // The loaded model (after initialize): for a caller's own step callback.
  models::XFuserModel& model();

  // The pipeline folder initialize() loaded from.
  const std::filesystem::path& model_dir() const { return model_dir_; }

 private:
  // preprocess_args / resolve_request: the pictures, the output size and the model's defaults
  // of args.config's inputs.
  void resolve_inputs(ResolvedArgs& args) const;
  // The request of `pending` rows of (prompts, negatives, seeds), strided over the
  // data-parallel groups.
  void fill_request(ResolvedArgs& args, const std::vector<std::string>& prompts,
                    const std::vector<std::optional<std::string>>& negatives,
                    const std::vector<int64_t>& seeds, const std::vector<int64_t>& pending) const;
  // Takes the output folder's lock (world rank 0; once): a second run into it is refused.
  void lock_output_directory() const;
  // Fails naming the step range and the likely cause when a generation's latents are not finite.
  void check_finite(const ResolvedArgs& args, const models::GenerationOutput& out) const;
  // Upper bound of the bytes this rank writes to --output_directory (checked before loading).
  uint64_t estimated_output_bytes(const ResolvedArgs& args) const;
  RunResult run_batched(const ResolvedArgs& args);
  std::filesystem::path write_image(const ResolvedArgs& args, size_t local_index,
                                    const at::Tensor& image) const;
  // --save_latents: row `row` of a generation's initial and final latents beside the image of
  // prompt `local_index`.
  std::filesystem::path write_latents(const ResolvedArgs& args, size_t local_index,
                                      const models::GenerationOutput& out, int64_t row) const;
  std::vector<double> gather_batch_seconds(const ResolvedArgs& args,
                                           const std::vector<double>& mine) const;
  int rank() const;
  bool writes_timings() const;
  // Each of this rank's groups: (name, world ranks of its members).
  std::vector<std::pair<std::string, std::vector<int>>> layout_groups() const;

  RunConfig config_;
  std::shared_ptr<parallel::ProcessGroups> groups_;
  std::unique_ptr<models::XFuserModel> model_;
  std::filesystem::path model_dir_;
  std::optional<models::MemoryEstimate> plan_;  // the pre-load estimate, for the report
  // The tensor bytes of the run's device after loading, and their peak while loading: the
  // generations' peak is measured from there (backends::tensor_memory).
  int64_t loaded_tensor_bytes_ = 0;
  int64_t load_peak_tensor_bytes_ = 0;
  std::vector<std::string> hosts_;  // every world rank's host name
  mutable std::unique_ptr<OutputDirectoryLock> lock_;
};

// --dry_run: resolves the flags and the pipeline folder (configs alone are enough), prints the
// memory plan of one rank for the flags' layout and returns the exit code: 1 when
// --device_memory_gib is given and the plan does not fit it, else 0. Loads no weight.
int print_memory_plan(const RunConfig& config);

// The layout a model checks (ModelSpec::check_run) for these arguments.
models::RunLayout run_layout(const ResolvedArgs& args);

// The one validation run before any weight is read, by xfuser-run (Runner::initialize) and
// `xfuser validate`: the model's layout check against `model_dir`'s configs and weight headers
// (degrees, sizes, guidance), then its memory estimate against this machine's available memory
// (times the ranks on this node). Returns the estimate (nullopt: the model has no check).
// `layout`: run_layout(args), with what only the mesh knows (hybrid FSDP's ranks per host).
std::optional<models::MemoryEstimate> check_before_loading(const ResolvedArgs& args,
                                                           const std::filesystem::path& model_dir,
                                                           const models::RunLayout& layout);
// The run's layout as the memory plan reads it (degrees, sizes, dtype, device).
models::RunLayout run_layout(const ResolvedArgs& args);

// The pipeline folder of a run: --model_path, the embedded tiny model (built on first use), or
// the model's repo in the Hugging Face cache; checked to hold model_index.json.
std::filesystem::path resolve_model_dir(const ResolvedArgs& args);

// The output file of global prompt `index` (xDiT's name, in --output_directory).
std::filesystem::path output_path(const ResolvedArgs& args, int64_t index);

// The default compute dtype on this host: bf16 when the CPU multiplies bf16 natively
// (backends::cpu_has_native_bf16: AVX512-BF16 gives about 2x the fp32 matmul rate through
// oneDNN), else fp32.
c10::ScalarType default_cpu_dtype();

}  // namespace xfuser::runner
