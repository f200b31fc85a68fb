// Shared by the tiny pipeline writers of every family (`xfuser make-tiny --arch`): files written
// whole, and a component folder (config.json + seeded random weights) as diffusers lays it out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace xfuser::models {

// Writes `text` to `path` (errors name the file).
void write_text_file(const std::filesystem::path& path, const std::string& text);
// `j` pretty-printed (indent 2) and a newline.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& j);

// Per-tensor hook of write_random_component: (name, fp32 tensor) -> the tensor to store.
using TensorAdjust = std::function<at::Tensor(const std::string& name, const at::Tensor& t)>;

// Writes dir/config.json and dir/`weights_name`: the component of `config`'s class (diffusers'
// `_class_name` or transformers' `architectures[0]`) with seeded random weights N(0, 0.05),
// norm scales (1-D "...norm....weight") shifted to ~1, then `adjust` (if given); fp32
// safetensors with {"format": "pt"}. Deterministic in `seed`.
void write_random_component(const std::filesystem::path& dir, const nlohmann::json& config,
                            const std::string& weights_name, uint64_t seed,
                            const TensorAdjust& adjust = {});

}  // namespace xfuser::models
