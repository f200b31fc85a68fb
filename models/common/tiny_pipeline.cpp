#include "models/common/tiny_pipeline.h"

#include <fstream>
#include <map>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/weights/safetensors.h"

namespace xfuser::models {
namespace fs = std::filesystem;

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  XF_CHECK(out.good(), "cannot write ", path.string());
}

void write_json_file(const fs::path& path, const nlohmann::json& j) {
  write_text_file(path, j.dump(2) + "\n");
}

void write_random_component(const fs::path& dir, const nlohmann::json& config,
                            const std::string& weights_name, uint64_t seed,
                            const TensorAdjust& adjust) {
  fs::create_directories(dir);
  write_json_file(dir / "config.json", config);
  const std::string cls = config.contains("_class_name")
                              ? config["_class_name"].get<std::string>()
                              : config["architectures"][0].get<std::string>();
  auto component = ComponentRegistry::create(cls, config, (dir / "config.json").string());
  component->init_random(seed, 0.05);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, slot] : component->named_parameters()) {
    at::Tensor t = slot->tensor.to(at::kFloat);
    const bool is_norm_scale = t.dim() == 1 && name.find("norm") != std::string::npos &&
                               name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (is_norm_scale) t = t + 1.0;
    if (adjust) t = adjust(name, t);
    tensors[name] = t.contiguous();
  }
  save_safetensors((dir / weights_name).string(), tensors, {{"format", "pt"}});
}

}  // namespace xfuser::models
