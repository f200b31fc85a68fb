// FluxConfig: the init arguments of diffusers' FluxTransformer2DModel, read from config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xfuser::models::flux {

struct FluxConfig {
  // diffusers' defaults (FluxTransformer2DModel.__init__).
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  std::optional<int64_t> out_channels;  // None -> in_channels
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t resolved_out_channels() const { return out_channels.value_or(in_channels); }
  // proj_out's output width: patch_size^2 * out_channels.
  int64_t output_dim() const { return patch_size * patch_size * resolved_out_channels(); }

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static FluxConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  // Throws when the sizes are inconsistent (e.g. sum(axes_dims_rope) != attention_head_dim).
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::flux
