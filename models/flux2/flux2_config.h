// Flux2Config: the init arguments of diffusers' Flux2Transformer2DModel (FLUX.2), read from
// config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xfuser::models::flux2 {

struct Flux2Config {
  // diffusers' defaults (Flux2Transformer2DModel.__init__, diffusers 0.36.0): FLUX.2-dev.
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  std::optional<int64_t> out_channels;  // None -> in_channels
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000.0;
  double eps = 1e-6;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // The feed-forwards' hidden width: int(inner_dim * mlp_ratio), as Python truncates it.
  int64_t mlp_hidden_dim() const {
    return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio);
  }
  int64_t resolved_out_channels() const { return out_channels.value_or(in_channels); }
  // proj_out's output width: patch_size^2 * out_channels.
  int64_t output_dim() const { return patch_size * patch_size * resolved_out_channels(); }
  int64_t rope_axes() const { return static_cast<int64_t>(axes_dims_rope.size()); }

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static Flux2Config from_json(const nlohmann::json& j, const std::string& source = "config.json");
  // Throws when the sizes are inconsistent (e.g. sum(axes_dims_rope) != attention_head_dim).
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::flux2
