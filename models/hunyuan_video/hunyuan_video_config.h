// HunyuanVideoConfig: the init arguments of diffusers' HunyuanVideoTransformer3DModel (v0.33.1),
// read from config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xfuser::models::hunyuan_video {

struct HunyuanVideoConfig {
  // diffusers' defaults (HunyuanVideoTransformer3DModel.__init__, v0.33.1).
  int64_t in_channels = 16;
  std::optional<int64_t> out_channels = 16;  // None (or 0) -> in_channels
  int64_t num_attention_heads = 24;
  int64_t attention_head_dim = 128;
  int64_t num_layers = 20;         // double-stream blocks
  int64_t num_single_layers = 40;  // single-stream blocks
  int64_t num_refiner_layers = 2;  // token refiner blocks of context_embedder
  double mlp_ratio = 4.0;
  int64_t patch_size = 2;    // spatial (h, w)
  int64_t patch_size_t = 1;  // temporal
  std::string qk_norm = "rms_norm";
  bool guidance_embeds = true;
  int64_t text_embed_dim = 4096;
  int64_t pooled_projection_dim = 768;
  double rope_theta = 256.0;
  std::vector<int64_t> rope_axes_dim = {16, 56, 56};  // (t, h, w), summing to attention_head_dim
  // null or "latent_concat" (the image latents concatenated on the channels: only in_channels
  // differs); "token_replace" (HunyuanVideo-I2V's first-frame modulation) is not ported.
  std::optional<std::string> image_condition_type;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t resolved_out_channels() const {
    return out_channels && *out_channels != 0 ? *out_channels : in_channels;
  }
  // int(inner_dim * mlp_ratio): the single blocks' proj_mlp width.
  int64_t mlp_dim() const { return static_cast<int64_t>(inner_dim() * mlp_ratio); }
  int64_t patch_volume() const { return patch_size_t * patch_size * patch_size; }
  // (pt, p, p) as the Conv3d kernel.
  std::vector<int64_t> patch() const { return {patch_size_t, patch_size, patch_size}; }
  // Channels of one input token: a (pt, p, p) patch of in_channels latents.
  int64_t token_channels() const { return in_channels * patch_volume(); }
  // proj_out's output width: out_channels * pt * p * p.
  int64_t output_dim() const { return resolved_out_channels() * patch_volume(); }

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static HunyuanVideoConfig from_json(const nlohmann::json& j,
                                      const std::string& source = "config.json");
  // Throws, naming the field and `source`, when the sizes are inconsistent or unsupported.
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::hunyuan_video
