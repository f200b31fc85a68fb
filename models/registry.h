// The model registry: every model xfuser runs, with its ids and aliases, task, default inputs
// (as xDiT's runner sets them), the parallelism and options it supports, and its factory.
// A flag the chosen model does not support is an error naming the flag and the model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/lora.h"

namespace xfuser::models {

class XFuserModel;

enum class Task { kTextToImage, kImageToImage, kTextToVideo, kImageToVideo };
std::string to_string(Task task);

struct ModelDefaults {
  int height = 1024;
  int width = 1024;
  int num_inference_steps = 50;
  double guidance_scale = 3.5;
  int max_sequence_length = 512;
  int num_frames = 0;  // 0 for image models
  int fps = 0;         // video models: the output's frame rate (--fps)
  // Flow-matching models whose runner default overrides the scheduler folder's shift
  // (--flow_shift); 0: the folder's.
  double flow_shift = 0.0;
};

// Parallel strategies, named by the flag that enables them.
struct Parallelism {
  bool ulysses = false;
  bool ring = false;
  bool pipefusion = false;
  bool tensor_parallel = false;
  bool data_parallel = false;
  bool cfg_parallel = false;
  bool parallel_vae = false;
};

// A run as a model checks it before any weight is read: degrees, sizes and guidance.
struct RunLayout {
  int ulysses = 1, ring = 1, pipefusion = 1, tensor = 1, cfg = 1, data = 1;
  std::vector<int64_t> pipefusion_layers;  // empty: balanced
  int num_pipeline_patch = 0;              // 0: the pp degree
  int height = 0, width = 0;
  int num_frames = 0;  // video models (defaults applied); 0 for image models
  int max_sequence_length = 0;
  int input_images = 0;  // --input_images given (editing models count their tokens)
  // (height, width) of each --input_images picture, where the run has read them (not --dry_run
  // without pictures).
  std::vector<std::pair<int64_t, int64_t>> input_image_sizes;
  int batch_size = 1;           // prompts per generate() call
  bool true_cfg = false;        // every prompt has a negative prompt and true_cfg_scale > 1
  double guidance_scale = 0.0;  // the run's --guidance_scale (model default applied)
  bool enable_tiling = false;
  int bytes_per_element = 4;  // the compute dtype's
  // Bytes per transformer parameter: the compute dtype's, or 1 with fp8 weights (--use_fp8_gemms,
  // --fp8_storage: the layers they convert hold nearly all of a full-size transformer).
  int transformer_bytes_per_element = 4;
  int threads = 1;
  // --use_fsdp: the ranks that shard the weights (ulysses x ring x cfg); 1: no FSDP.
  int fsdp = 1;
  // The run computes on the CPU (its kernels' buffers count), else on a GPU.
  bool cpu = true;
};

// What a run needs on one rank, estimated from the configs alone (xfuser-run --dry_run).
struct MemoryEstimate {
  uint64_t weights = 0;  // parameters (each component's load dtype; fp8 transformer weights: 1)
  // The most each stage holds beyond the weights (activations, temporaries, kernel buffers); the
  // stages run one after another, so the run's peak is the largest of them.
  uint64_t text_encoders = 0;  // encoding the prompt: the largest text or image encoder call
  uint64_t image_encode = 0;   // encoding an input picture or video with the VAE (editing, I2V)
  uint64_t transformer = 0;    // one denoising step, its communication buffers included
  uint64_t comm = 0;           // of `transformer`: the sequence-parallel exchange buffers
  uint64_t vae = 0;            // decoding the latents
  uint64_t activations() const { return std::max({text_encoders, image_encode, transformer, vae}); }
  uint64_t total() const { return weights + activations(); }
};

struct ModelSpec {
  std::string id;                    // "FLUX.1-dev"
  std::vector<std::string> aliases;  // "black-forest-labs/FLUX.1-dev"
  std::string hf_repo;               // repo id looked up in the Hugging Face cache ("" if none)
  Task task = Task::kTextToImage;
  ModelDefaults defaults;
  Parallelism parallelism;
  // Optional xfuser-run flags this model honours ("--negative_prompt", "--true_cfg_scale", ...).
  std::set<std::string> options;
  std::string maturity;  // "stable", "experimental"
  // The diffusers / transformers releases whose saved folders and outputs the family's tests
  // check this model's pipeline against (docs/models.md).
  std::string checked_against;
  std::string description;
  std::function<std::unique_ptr<XFuserModel>(const ModelSpec&)> create;
  // Checks a layout against the pipeline folder's configs and weight headers (no tensor data is
  // read), throwing an error naming the flag; returns the memory one rank needs. Null: none.
  std::function<MemoryEstimate(const std::filesystem::path& pipeline_dir, const RunLayout&)>
      check_run;
  // --task values (xDiT's runner's `valid_tasks` of a multi-task model) -> the model that runs the
  // task ("i2v" -> "HunyuanVideo-1.5-I2V"). Empty: a model of one task, which refuses --task.
  std::map<std::string, std::string> tasks;
  // The diffusers classes the weight components' config.json `_class_name` must hold
  // ("transformer" -> {"FluxTransformer2DModel"}): a folder holding another family's transformer
  // or VAE is refused by check_component_classes before anything is parsed or loaded.
  std::map<std::string, std::vector<std::string>> component_classes;
  // The family (models/<family>/) that registered this model.
  std::string family;
  // diffusers pipeline classes (model_index.json `_class_name`) this model runs: `--model_path
  // DIR` without --model picks the first model listing the folder's class.
  std::vector<std::string> pipeline_classes;
  // With several models of one pipeline class (Wan 2.1 and 2.2 are both WanPipeline): true when
  // a folder's model_index.json is this model's. Null: every folder of the class.
  std::function<bool(const nlohmann::json& model_index)> folder_match;
  // Embedded models (no download, no cache): builds the pipeline folder if needed, returns it.
  std::function<std::filesystem::path()> embedded_dir;
  // Models whose output size follows the first --input_images picture (FLUX.2: the picture's
  // size, capped at 1 MP and floored to multiples of 16; HunyuanVideo-1.5 I2V: the folder's
  // aspect-ratio bucket): (height, width) from the pipeline folder and the picture's (height,
  // width); each of --height / --width not given takes its value. Null with
  // Task::kImageToImage: the default area at the picture's aspect ratio (FLUX.1 Kontext).
  std::function<std::pair<int, int>(const std::filesystem::path& pipeline_dir, int64_t height,
                                    int64_t width)>
      size_from_picture;
  // Defaults the pipeline folder sets, applied over `defaults` before the flags, which still
  // win (HunyuanVideo-1.5: its guider's guidance_scale, which diffusers' pipeline uses). Null:
  // none.
  std::function<void(const std::filesystem::path& pipeline_dir, ModelDefaults& defaults)>
      folder_defaults;
  // What folder_defaults sets, in words, for `xfuser models` and docs/models.md.
  std::string folder_defaults_note;
};

// A tiny pipeline layout `xfuser make-tiny --arch NAME` writes (seeded random weights).
struct TinyArch {
  std::string name;         // "flux", "sd3"
  std::string description;  // one line
  std::function<void(const std::filesystem::path& dir, uint64_t seed)> write;
};

// A model family registers itself from its folder: models/<family>/family.cpp defines
// xfuser::models::<family>::register_family(), which calls FamilyRegistry::add. The build
// generates the list of those functions from the folders (models/CMakeLists.txt), so adding a
// family needs no edit outside its folder.
struct Family {
  std::string name;               // the folder: "flux", "sd3"
  std::vector<ModelSpec> models;  // in listing order
  // Registers the family's component classes (its transformer, ...) with the ComponentRegistry
  // and the DiTRegistry; called once by register_builtin_components().
  std::function<void()> register_components;
  std::vector<TinyArch> tiny_archs;
  // LoRA adapters (models/common/lora.h): the components diffusers' loader for the family adapts
  // ("transformer", "text_encoder", ...), and the layouts other than diffusers' own that the
  // family converts (kohya's, the original checkpoint's names).
  std::vector<std::string> lora_components = {"transformer"};
  std::vector<LoraLayout> lora_layouts;
};

// The family `spec` belongs to (by Family::name == spec.family).
const Family& family_of(const ModelSpec& spec);

// For each of spec.component_classes present in the pipeline folder (a config.json), throws
// naming the file, the class it holds, the model and the classes it needs, when they differ. Part
// of the check before loading that xfuser-run and `xfuser validate` share.
void check_component_classes(const ModelSpec& spec, const std::filesystem::path& pipeline_dir);

class FamilyRegistry {
 public:
  static void add(Family family);
  // Every family, registering them on first use.
  static const std::vector<Family>& all();
  // Every tiny architecture of every family; `find_tiny_arch` errors list the known ones.
  static std::vector<TinyArch> tiny_archs();
  static const TinyArch& find_tiny_arch(const std::string& name);
};

class ModelRegistry {
 public:
  // Every registered model, in registration order (family by family).
  static const std::vector<ModelSpec>& all();
  // By id or alias, case-insensitively; the error lists the known ids and says when the name is
  // one of the contract's models that is planned but not built yet.
  static const ModelSpec& find(const std::string& name);
  static const ModelSpec* find_or_null(const std::string& name);
  // The model that runs the pipeline folder `dir` (model_index.json `_class_name`); the error
  // names the folder, its class and the classes xfuser runs.
  static const ModelSpec& for_pipeline_folder(const std::filesystem::path& dir);
};

}  // namespace xfuser::models
