#include "models/hunyuan_video/hunyuan_video_config.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::hunyuan_video {

HunyuanVideoConfig HunyuanVideoConfig::from_json(const nlohmann::json& j,
                                                 const std::string& source) {
  XF_CHECK(j.is_object(), source,
           ": a HunyuanVideoTransformer3DModel config must be a JSON object");
  HunyuanVideoConfig c;
  c.in_channels = cfg<int64_t>(j, "in_channels", c.in_channels, source);
  // cfg() reads null as the default; diffusers' out_channels None means in_channels.
  if (auto it = j.find("out_channels"); it != j.end() && it->is_null()) {
    c.out_channels = std::nullopt;
  } else {
    c.out_channels = cfg<int64_t>(j, "out_channels", *c.out_channels, source);
  }
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, source);
  c.attention_head_dim = cfg<int64_t>(j, "attention_head_dim", c.attention_head_dim, source);
  c.num_layers = cfg<int64_t>(j, "num_layers", c.num_layers, source);
  c.num_single_layers = cfg<int64_t>(j, "num_single_layers", c.num_single_layers, source);
  c.num_refiner_layers = cfg<int64_t>(j, "num_refiner_layers", c.num_refiner_layers, source);
  c.mlp_ratio = cfg<double>(j, "mlp_ratio", c.mlp_ratio, source);
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, source);
  c.patch_size_t = cfg<int64_t>(j, "patch_size_t", c.patch_size_t, source);
  c.qk_norm = cfg<std::string>(j, "qk_norm", c.qk_norm, source);
  c.guidance_embeds = cfg<bool>(j, "guidance_embeds", c.guidance_embeds, source);
  c.text_embed_dim = cfg<int64_t>(j, "text_embed_dim", c.text_embed_dim, source);
  c.pooled_projection_dim =
      cfg<int64_t>(j, "pooled_projection_dim", c.pooled_projection_dim, source);
  c.rope_theta = cfg<double>(j, "rope_theta", c.rope_theta, source);
  c.rope_axes_dim = cfg<std::vector<int64_t>>(j, "rope_axes_dim", c.rope_axes_dim, source);
  if (auto it = j.find("image_condition_type"); it != j.end() && !it->is_null()) {
    c.image_condition_type = cfg<std::string>(j, "image_condition_type", "", source);
  }
  c.validate(source);
  return c;
}

void HunyuanVideoConfig::validate(const std::string& source) const {
  XF_CHECK(num_attention_heads >= 1 && attention_head_dim >= 1, source, ": num_attention_heads (",
           num_attention_heads, ") and attention_head_dim (", attention_head_dim,
           ") must be positive");
  XF_CHECK(in_channels >= 1, source, ": in_channels must be >= 1, got ", in_channels);
  XF_CHECK(resolved_out_channels() >= 1, source, ": out_channels must be >= 1, got ",
           resolved_out_channels());
  XF_CHECK(num_layers >= 0 && num_single_layers >= 0 && num_layers + num_single_layers >= 1, source,
           ": num_layers (", num_layers, ") and num_single_layers (", num_single_layers,
           ") must be >= 0 with at least one block");
  XF_CHECK(num_refiner_layers >= 0, source, ": num_refiner_layers must be >= 0, got ",
           num_refiner_layers);
  XF_CHECK(mlp_ratio > 0 && mlp_dim() >= 1, source, ": mlp_ratio must be positive, got ",
           mlp_ratio);
  XF_CHECK(patch_size >= 1 && patch_size_t >= 1, source, ": patch_size (", patch_size,
           ") and patch_size_t (", patch_size_t, ") must be >= 1");
  XF_CHECK(qk_norm == "rms_norm", source, ": qk_norm '", qk_norm,
           "' is not supported (HunyuanVideo uses 'rms_norm')");
  XF_CHECK(text_embed_dim >= 1, source, ": text_embed_dim must be >= 1, got ", text_embed_dim);
  XF_CHECK(pooled_projection_dim >= 1, source, ": pooled_projection_dim must be >= 1, got ",
           pooled_projection_dim);
  XF_CHECK(rope_theta > 0, source, ": rope_theta must be positive, got ", rope_theta);
  XF_CHECK(rope_axes_dim.size() == 3, source, ": rope_axes_dim must have 3 entries (t, h, w), got ",
           rope_axes_dim.size());
  for (auto d : rope_axes_dim) {
    XF_CHECK(d >= 2 && d % 2 == 0, source, ": rope_axes_dim entries must be even and >= 2, got ",
             d);
  }
  const int64_t rope_sum = std::accumulate(rope_axes_dim.begin(), rope_axes_dim.end(), int64_t{0});
  XF_CHECK(rope_sum == attention_head_dim, source, ": rope_axes_dim sums to ", rope_sum,
           " but the rotary tables must cover attention_head_dim ", attention_head_dim);
  if (image_condition_type) {
    XF_CHECK(*image_condition_type == "latent_concat", source, ": image_condition_type '",
             *image_condition_type,
             "' is not supported (null and 'latent_concat' are; 'token_replace' is not ported)");
  }
}

}  // namespace xfuser::models::hunyuan_video
