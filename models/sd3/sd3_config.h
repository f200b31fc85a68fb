// SD3Config: the init arguments of diffusers' SD3Transformer2DModel (SD3 and SD3.5), read from
// config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xfuser::models::sd3 {

struct SD3Config {
  // diffusers' defaults (SD3Transformer2DModel.__init__, v0.33.1).
  int64_t sample_size = 128;
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 18;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 18;
  int64_t joint_attention_dim = 4096;
  int64_t caption_projection_dim = 1152;
  int64_t pooled_projection_dim = 2048;
  std::optional<int64_t> out_channels = 16;  // None -> in_channels
  // The side M of the stored M x M position table (pos_embed.pos_embed [1, M^2, D]). diffusers
  // accepts None (a table computed for sample_size, not stored); no released checkpoint uses it
  // and it is rejected here.
  std::optional<int64_t> pos_embed_max_size = 96;
  std::vector<int64_t> dual_attention_layers;  // SD3.5-medium: 0..12
  std::optional<std::string> qk_norm;          // None or "rms_norm" (SD3.5)

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t resolved_out_channels() const { return out_channels.value_or(in_channels); }
  // Channels of one input token: a p x p patch of in_channels latents.
  int64_t token_channels() const { return patch_size * patch_size * in_channels; }
  // proj_out's output width: patch_size^2 * out_channels.
  int64_t output_dim() const { return patch_size * patch_size * resolved_out_channels(); }
  int64_t max_grid() const { return pos_embed_max_size.value_or(0); }
  // diffusers' PatchEmbed base_size: the grid of the training resolution.
  int64_t base_size() const { return sample_size / patch_size; }
  bool is_dual(int64_t layer) const;
  bool has_qk_norm() const { return qk_norm.has_value(); }

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static SD3Config from_json(const nlohmann::json& j, const std::string& source = "config.json");
  // Throws, naming the field and `source`, when the sizes are inconsistent.
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::sd3
