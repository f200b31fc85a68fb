// The model registry: every model xfuser runs, with its ids and aliases, task, default inputs
// (as xDiT's runner sets them), the parallelism and options it supports, and its factory.
// A flag the chosen model does not support is an error naming the flag and the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

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
  int max_sequence_length = 0;
  int batch_size = 1;     // prompts per generate() call
  bool true_cfg = false;  // every prompt has a negative prompt and true_cfg_scale > 1
  bool enable_tiling = false;
  int bytes_per_element = 4;  // the compute dtype's
  int threads = 1;
};

// What a run needs on one rank, estimated from the configs and the weight headers.
struct MemoryEstimate {
  uint64_t weights = 0;      // parameters in the compute dtype
  uint64_t activations = 0;  // transformer and VAE activations
  uint64_t attention = 0;    // attention scratch (scores per query block and thread)
  uint64_t total() const { return weights + activations + attention; }
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
  std::string description;
  std::function<std::unique_ptr<XFuserModel>(const ModelSpec&)> create;
  // Checks a layout against the pipeline folder's configs and weight headers (no tensor data is
  // read), throwing an error naming the flag; returns the memory one rank needs. Null: none.
  std::function<MemoryEstimate(const std::filesystem::path& pipeline_dir, const RunLayout&)>
      check_run;
};

class ModelRegistry {
 public:
  // Every registered model, in registration order.
  static const std::vector<ModelSpec>& all();
  // By id or alias (case-sensitive, as xDiT); error lists the known ids.
  static const ModelSpec& find(const std::string& name);
  static const ModelSpec* find_or_null(const std::string& name);
};

}  // namespace xfuser::models
