// The model registry: every model xfuser runs, with its ids and aliases, task, default inputs
// (as xDiT's runner sets them), the parallelism and options it supports, and its factory.
// A flag the chosen model does not support is an error naming the flag and the model.
#pragma once

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
