// xFuserModel: the base every pipeline (FLUX.1, ...) derives from. The base owns loading,
// warm-up, timing of every stage and step, and the step loop; a model implements its stages.
//
//   load(folder, options)            model-specific load_components()
//   generate(request):
//     state = begin(request)
//     encode_prompt(state)           "encode_prompt"
//     prepare_latents(state)         "prepare_latents"
//     for i < num_steps(state):      "denoise_step"  (one timing per step)
//       denoise_step(state, i)
//     decode(state)                  "decode"
//     -> images [B, H, W, 3] uint8 and the stage timings
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "backends/backend.h"
#include "models/common/fsdp.h"
#include "models/common/module.h"
#include "models/common/offload.h"
#include "models/step_cache_config.h"

namespace xfuser::parallel {
class ProcessGroups;
}

namespace xfuser::models {

struct ModelSpec;
struct KernelTable;
class Component;

// Fully resolved inputs of one generation (model defaults already applied).
struct GenerationRequest {
  std::vector<std::string> prompts;           // batch B >= 1
  std::vector<std::string> negative_prompts;  // empty, or one per prompt
  int height = 0;
  int width = 0;
  int num_inference_steps = 0;
  double guidance_scale = 0.0;
  double true_cfg_scale = 1.0;
  int max_sequence_length = 0;
  std::vector<int64_t> seeds;  // one per prompt
  // PipeFusion (pp > 1): image patches (0: the pp degree) and synchronous warm-up steps.
  int num_pipeline_patch = 0;
  int pipefusion_warmup_steps = 1;
  // Video models: frames to generate (--num_frames; 0 for image models).
  int num_frames = 0;
  // --flow_shift: the scheduler's flow shift (Wan); unset keeps the pipeline folder's.
  std::optional<double> flow_shift;
  // --flow_sigmas: "from_one" or "reference" (UniPC, Wan); unset: by the folder's diffusers
  // version.
  std::optional<std::string> flow_sigmas;
  // --guidance_scale_2: the guidance of Wan2.2's low-noise expert; unset: guidance_scale.
  std::optional<double> guidance_scale_2;
  // --input_images, decoded: uint8 [H, W, 3] each (image-to-video, image editing).
  std::vector<at::Tensor> input_images;
  // --latents: the initial latents in the layout the family's diffusers pipeline takes as its
  // `latents` argument (FLUX: packed [B, N, 64]; SD3: [B, 16, h, w]); undefined: drawn from the
  // seeds.
  at::Tensor latents;
  // LoRA scales for this generation by adapter name (unfused adapters only; an adapter not named
  // runs at its load scale).
  std::map<std::string, double> lora_scales;
};

struct StageTiming {
  std::string name;  // encode_prompt, prepare_latents, denoise_step, decode
  int index = -1;    // step index for denoise_step, else -1
  double seconds = 0.0;
  // The most bytes the device's tensors held during the stage (backends::tensor_memory: the
  // loaded weights that were copied included); -1 where not counted.
  int64_t peak_tensor_bytes = -1;
};

struct GenerationOutput {
  at::Tensor images;   // uint8 [B, H, W, 3]; video models: [B, F, H, W, 3]
  at::Tensor latents;  // the final latents before decoding (model layout), for checks
  // The initial latents the run started from, in GenerationRequest::latents' layout (so a run
  // can be repeated, here or in diffusers, on the same noise).
  at::Tensor initial_latents;
  std::vector<StageTiming> timings;
  double total_seconds = 0.0;
  // What the step cache skipped (--cache; method kNone without it).
  StepCacheReport cache;
};

struct ModelLoadOptions {
  c10::ScalarType dtype = c10::kFloat;  // compute dtype of the transformer and text encoders
  // Where the pipelines make their tensors (latents, ids, timesteps, guidance) and the weights
  // live (--device, backends/device.h).
  c10::Device device = c10::Device(c10::kCPU);
  bool enable_tiling = false;
  bool enable_slicing = false;
  // --use_torch_compile: try the backend's compile path for every overridable op.
  bool compile = false;
  // Hand-written kernels registered by the backend (backends/kernels.h); false runs the eager
  // reference ops (XFUSER_KERNEL_OVERRIDES=0).
  bool kernel_overrides = true;
  // PipeFusion: transformer blocks per stage (--pipefusion_layers); empty = balanced.
  std::vector<int64_t> pipefusion_layers;
  // Patch-parallel VAE decode over the process groups' replica (--use_parallel_vae).
  bool parallel_vae = false;
  // How the transformer's layer weights are held: as loaded, fp8 storage (--fp8_storage) or fp8
  // with per-channel scales and FP8 GEMMs (--use_fp8_gemms). Only kind and format are read; the
  // model selects its parameters (dit::dit_weight_format).
  WeightFormat transformer_weights;
  // --enable_model_cpu_offload / --enable_sequential_cpu_offload (models/common/offload.h): the
  // weights load into host memory and `device` computes, each component (sequential: each
  // transformer block) copied there while it is used.
  OffloadMode offload = OffloadMode::kNone;
  // --use_fsdp (models/common/fsdp.h): every component but the VAE is sharded over the process
  // groups' fsdp group (created before load), each rank reading only its rows.
  bool fsdp = false;
  // --cache and its parameters: step caching in the denoising loop (models/step_cache_config.h).
  StepCacheConfig cache;
  // --lora / --lora_2: LoRA adapters (models/common/lora.h), fused into the weights at load
  // (--lora_mode fused) or kept beside them so that a request can change their scales.
  std::vector<LoraSpec> lora;
  bool lora_fused = true;
  // Where the weights are read to: the host under offload, else `device`.
  c10::Device weights_device() const {
    return offload == OffloadMode::kNone ? device : c10::Device(c10::kCPU);
  }
};

class XFuserModel {
 public:
  explicit XFuserModel(const ModelSpec& spec);
  virtual ~XFuserModel();
  XFuserModel(const XFuserModel&) = delete;
  XFuserModel& operator=(const XFuserModel&) = delete;

  const ModelSpec& spec() const { return spec_; }

  // Loads every component from a diffusers pipeline folder (model_index.json).
  void load(const std::filesystem::path& pipeline_dir, const ModelLoadOptions& options);
  bool loaded() const { return loaded_; }
  // Bytes the loaded transformer(s) hold in their parameters (this rank's part; fp8 weights
  // count their values and scales); 0 for a model without one.
  virtual int64_t transformer_parameter_bytes() const { return 0; }
  // Bytes every loaded component's parameters hold on this rank (its shards under FSDP; fp8
  // values and scales), where they are held (host memory under CPU offload).
  int64_t parameter_bytes() const;
  // The most bytes the device's tensors held during any stage of any generate() since load()
  // (-1 where not counted: backends::tensor_memory).
  int64_t peak_tensor_bytes() const { return peak_tensor_bytes_; }
  const ModelLoadOptions& load_options() const { return load_options_; }
  // The offloader of a run with CPU offload (null without).
  const Offloader* offloader() const { return offloader_.get(); }
  // The sharder of a run with FSDP (null without).
  const FsdpSharder* fsdp() const { return fsdp_.get(); }
  // The LoRA adapters load() read, in the order given.
  const std::vector<std::shared_ptr<const LoraAdapter>>& lora_adapters() const {
    return lora_adapters_;
  }
  // What load() chose for every overridable op and why (compile -> override -> eager).
  const std::vector<backends::BackendTimelineEntry>& backend_timeline() const {
    return backend_timeline_;
  }

  // Runs the stages in order, timing each; the request must be fully resolved.
  GenerationOutput generate(const GenerationRequest& request);

  // The process groups of a parallel run (null: one rank). Set before generate(); the model
  // splits its work over them (sequence parallel attention, CFG branches, ...).
  void set_process_groups(std::shared_ptr<parallel::ProcessGroups> groups) {
    groups_ = std::move(groups);
  }
  const std::shared_ptr<parallel::ProcessGroups>& process_groups() const { return groups_; }

  // Called after every denoising step (progress display, cancellation): (step, total).
  void set_step_callback(std::function<void(int, int)> callback) {
    step_callback_ = std::move(callback);
  }

 protected:
  // Per-generation state a model extends with its tensors.
  struct State {
    virtual ~State() = default;
    GenerationRequest request;
    at::Tensor images;             // uint8 [B, H, W, 3] (video [B, F, H, W, 3]), set by decode()
    at::Tensor latents;            // final latents, set by decode()
    at::Tensor initial_latents;    // set by prepare_latents()
    StepCacheReport cache_report;  // filled by the step cache, if the run has one
  };

  virtual void load_components(const std::filesystem::path& pipeline_dir,
                               const ModelLoadOptions& options) = 0;
  // Checks the request against the model (sizes, batch) and creates the state.
  virtual std::unique_ptr<State> begin(const GenerationRequest& request) = 0;
  virtual void encode_prompt(State& state) = 0;
  virtual void prepare_latents(State& state) = 0;
  virtual int num_steps(const State& state) const = 0;
  virtual void denoise_step(State& state, int index) = 0;
  virtual void decode(State& state) = 0;

  // Every component a model loads is registered here (load_pipeline_component does it), under
  // its folder name ("text_encoder", "transformer_2"), so that whatever the pipeline does with
  // its weights (CPU offload) is done once for all families. `block_prefixes`: the block lists
  // of a transformer ("transformer_blocks.", ...), streamed one block at a time under
  // sequential offload.
  void register_component(const std::string& name, std::shared_ptr<Module> component,
                          const std::vector<std::string>& block_prefixes = {});
  // The loader options of component `name` (its folder name): the weights device, and FSDP's
  // row sharding for every component but the VAE.
  LoadOptions component_load_options(const std::string& name) const;
  // The LoRA adapters' updates of component `name` (null: none).
  std::shared_ptr<const ComponentLora> component_lora(const std::string& name) const;
  // load_component(pipeline_dir / name) in `dtype` with component_load_options(name), and
  // registered.
  std::shared_ptr<Component> load_pipeline_component(const std::filesystem::path& pipeline_dir,
                                                     const std::string& name,
                                                     c10::ScalarType dtype);

 private:
  const ModelSpec& spec_;
  bool loaded_ = false;
  int64_t peak_tensor_bytes_ = -1;
  ModelLoadOptions load_options_;
  std::function<void(int, int)> step_callback_;
  std::shared_ptr<parallel::ProcessGroups> groups_;
  std::unique_ptr<KernelTable> kernels_;
  std::unique_ptr<Offloader> offloader_;
  std::unique_ptr<FsdpSharder> fsdp_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> components_;
  std::vector<backends::BackendTimelineEntry> backend_timeline_;
  // LoRA: the adapters, their load scales, the scales the layers read (set per generation), and
  // what each component applies.
  std::vector<std::shared_ptr<const LoraAdapter>> lora_adapters_;
  std::vector<double> lora_load_scales_;
  std::vector<std::shared_ptr<double>> lora_scales_;
  std::map<std::string, std::shared_ptr<const ComponentLora>> component_lora_;
  void load_lora_adapters(const ModelLoadOptions& options);
  void set_lora_scales(const GenerationRequest& request);
};

}  // namespace xfuser::models
