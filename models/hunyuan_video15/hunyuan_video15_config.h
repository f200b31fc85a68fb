// HunyuanVideo15Config: the init arguments of diffusers' HunyuanVideo15Transformer3DModel
// (v0.36.0), read from config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/hunyuan_video/hunyuan_video_config.h"

namespace xfuser::models::hunyuan_video15 {

struct HunyuanVideo15Config {
  // diffusers' defaults (HunyuanVideo15Transformer3DModel.__init__, v0.36.0).
  int64_t in_channels = 65;  // latents | image-condition latents | mask (32 + 32 + 1)
  std::optional<int64_t> out_channels = 32;  // None (or 0) -> in_channels
  int64_t num_attention_heads = 16;
  int64_t attention_head_dim = 128;
  int64_t num_layers = 54;         // dual-stream blocks (there are no single-stream blocks)
  int64_t num_refiner_layers = 2;  // token refiner blocks of context_embedder
  double mlp_ratio = 4.0;
  int64_t patch_size = 1;    // spatial (h, w)
  int64_t patch_size_t = 1;  // temporal
  std::string qk_norm = "rms_norm";
  int64_t text_embed_dim = 3584;    // Qwen2.5-VL hidden states
  int64_t text_embed_2_dim = 1472;  // ByT5 (glyph) hidden states
  int64_t image_embed_dim = 1152;   // SigLIP image embeddings
  double rope_theta = 256.0;
  std::vector<int64_t> rope_axes_dim = {16, 56, 56};  // (t, h, w), summing to attention_head_dim
  int64_t target_size = 640;      // the pipeline's resolution bucket (not used by the model)
  std::string task_type = "i2v";  // informational (the model takes image_embeds either way)
  bool use_meanflow = false;      // time_embed.timestep_embedder_r of timestep_r
  // Width of the ByT5 projector's hidden layers: diffusers hard-codes 2048
  // (HunyuanVideo15ByT5TextProjection(text_embed_2_dim, 2048, inner_dim)). The xfuser-only key
  // "xfuser_byt5_hidden_size" overrides it for small test models (diffusers ignores it).
  int64_t byt5_hidden_size = 2048;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t resolved_out_channels() const {
    return out_channels && *out_channels != 0 ? *out_channels : in_channels;
  }
  int64_t patch_volume() const { return patch_size_t * patch_size * patch_size; }
  // (pt, p, p) as the Conv3d kernel.
  std::vector<int64_t> patch() const { return {patch_size_t, patch_size, patch_size}; }
  // Channels of one input token: a (pt, p, p) patch of in_channels latents.
  int64_t token_channels() const { return in_channels * patch_volume(); }
  // proj_out's output width: out_channels * pt * p * p.
  int64_t output_dim() const { return resolved_out_channels() * patch_volume(); }
  // The HunyuanVideo (1.0) config the shared building blocks are built from (the double block
  // reads inner_dim, heads, head_dim and mlp_ratio).
  hunyuan_video::HunyuanVideoConfig block_config() const;

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static HunyuanVideo15Config from_json(const nlohmann::json& j,
                                        const std::string& source = "config.json");
  // Throws, naming the field and `source`, when the sizes are inconsistent or unsupported.
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::hunyuan_video15
