// Component: one loadable diffusers/transformers model folder (a transformer, a VAE, a text
// encoder), created by class name from its config.json, loaded strictly, and callable by method
// name with named tensors (the keyword names of diffusers' / transformers' forward()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/module.h"

namespace xfuser::models {

using TensorMap = std::map<std::string, at::Tensor>;

// One call of a component, for the memory plan (xfuser-run --dry_run): its input sizes, the
// dtype it computes in, and where (the CPU's kernels keep buffers a GPU's do not: the columns of a
// 3D convolution, attention scores per query block).
struct ActivationQuery {
  std::string method = "forward";  // "forward" (encoders), "decode" (VAEs)
  int64_t batch = 1;
  int64_t tokens = 0;                         // text encoders: the sequence length
  int64_t frames = 1, height = 0, width = 0;  // VAE decode: the output video or image
  bool tiled = false;                         // VAE decode with --enable_tiling
  int bytes = 4;                              // bytes per element of the compute dtype
  bool cpu = true;
};

class Component : public Module {
 public:
  // The diffusers `_class_name` or transformers `architectures[0]` this implements.
  virtual std::string class_name() const = 0;
  // Methods call() accepts ("forward", and e.g. "decode"/"encode" for a VAE).
  virtual std::vector<std::string> methods() const { return {"forward"}; }
  // Runs `method` on named inputs; absent optional inputs take the library's defaults. An unknown
  // or missing input, or a wrong shape, is an xfuser::Error naming it. Outputs are named as the
  // library names them (e.g. "sample", "last_hidden_state", "pooler_output").
  virtual TensorMap call(const std::string& method, const TensorMap& inputs) = 0;
  // The most bytes the call holds at once beyond the weights (activations, temporaries, kernel
  // buffers): a model of this implementation's allocations, checked against measured peaks
  // (bench/run_plan_check). 0: not modelled (a component too small to matter).
  virtual uint64_t activation_bytes(const ActivationQuery& query) const {
    (void)query;
    return 0;
  }
};

// Builds an unloaded component from its parsed config.json (`config_path` for error messages).
using ComponentFactory = std::function<std::shared_ptr<Component>(const nlohmann::json& config,
                                                                  const std::string& config_path)>;

// Class name -> factory. Families register from register_builtin_components() (explicit calls,
// so static linking never drops a registration).
class ComponentRegistry {
 public:
  static void add(const std::string& class_name, ComponentFactory factory);
  // Throws an error listing the known classes when `class_name` is unknown.
  static std::shared_ptr<Component> create(const std::string& class_name,
                                           const nlohmann::json& config,
                                           const std::string& config_path);
  static std::vector<std::string> known_classes();
};

// Registers every built-in component class once (idempotent).
void register_builtin_components();

}  // namespace xfuser::models
