// The LoRA adapters of a run (--lora, --lora_2), read once for one model: each adapter file in
// the layouts its family reads, and what each component of the model applies
// (models/common/lora.h). XFuserModel::load and `xfuser validate` share it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "models/common/lora.h"

namespace xfuser::models {

struct ModelSpec;

struct RunLora {
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;  // in the order given
  std::vector<double> load_scales;                           // one per adapter
  std::vector<std::shared_ptr<double>> scales;  // the scales the layers read, one per adapter
  std::map<std::string, std::shared_ptr<const ComponentLora>> components;  // by component name
};

// Reads `specs` for `spec`'s family: names made unique (the file's stem, then "_2", ...), every
// adapter part sent to a component the family adapts (Family::lora_components; `--lora_2` sends
// the transformer part to transformer_2), or an error naming the file, the key and the components
// the family adapts.
RunLora read_run_lora(const ModelSpec& spec, const std::vector<LoraSpec>& specs, bool fused,
                      c10::Device device);

}  // namespace xfuser::models
