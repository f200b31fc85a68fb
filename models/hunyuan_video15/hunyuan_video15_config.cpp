#include "models/hunyuan_video15/hunyuan_video15_config.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::hunyuan_video15 {

HunyuanVideo15Config HunyuanVideo15Config::from_json(const nlohmann::json& j,
                                                     const std::string& source) {
  XF_CHECK(j.is_object(), source,
           ": a HunyuanVideo15Transformer3DModel config must be a JSON object");
  HunyuanVideo15Config c;
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
  c.num_refiner_layers = cfg<int64_t>(j, "num_refiner_layers", c.num_refiner_layers, source);
  c.mlp_ratio = cfg<double>(j, "mlp_ratio", c.mlp_ratio, source);
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, source);
  c.patch_size_t = cfg<int64_t>(j, "patch_size_t", c.patch_size_t, source);
  c.qk_norm = cfg<std::string>(j, "qk_norm", c.qk_norm, source);
  c.text_embed_dim = cfg<int64_t>(j, "text_embed_dim", c.text_embed_dim, source);
  c.text_embed_2_dim = cfg<int64_t>(j, "text_embed_2_dim", c.text_embed_2_dim, source);
  c.image_embed_dim = cfg<int64_t>(j, "image_embed_dim", c.image_embed_dim, source);
  c.rope_theta = cfg<double>(j, "rope_theta", c.rope_theta, source);
  c.rope_axes_dim = cfg<std::vector<int64_t>>(j, "rope_axes_dim", c.rope_axes_dim, source);
  c.target_size = cfg<int64_t>(j, "target_size", c.target_size, source);
  c.task_type = cfg<std::string>(j, "task_type", c.task_type, source);
  c.use_meanflow = cfg<bool>(j, "use_meanflow", c.use_meanflow, source);
  c.byt5_hidden_size = cfg<int64_t>(j, "xfuser_byt5_hidden_size", c.byt5_hidden_size, source);
  c.validate(source);
  return c;
}

void HunyuanVideo15Config::validate(const std::string& source) const {
  XF_CHECK(num_attention_heads >= 1 && attention_head_dim >= 1, source, ": num_attention_heads (",
           num_attention_heads, ") and attention_head_dim (", attention_head_dim,
           ") must be positive");
  XF_CHECK(in_channels >= 1, source, ": in_channels must be >= 1, got ", in_channels);
  XF_CHECK(resolved_out_channels() >= 1, source, ": out_channels must be >= 1, got ",
           resolved_out_channels());
  XF_CHECK(num_layers >= 1, source, ": num_layers must be >= 1, got ", num_layers);
  XF_CHECK(num_refiner_layers >= 0, source, ": num_refiner_layers must be >= 0, got ",
           num_refiner_layers);
  XF_CHECK(mlp_ratio > 0 && static_cast<int64_t>(inner_dim() * mlp_ratio) >= 1, source,
           ": mlp_ratio must be positive, got ", mlp_ratio);
  XF_CHECK(patch_size >= 1 && patch_size_t >= 1, source, ": patch_size (", patch_size,
           ") and patch_size_t (", patch_size_t, ") must be >= 1");
  XF_CHECK(qk_norm == "rms_norm", source, ": qk_norm '", qk_norm,
           "' is not supported (HunyuanVideo-1.5 uses 'rms_norm')");
  XF_CHECK(text_embed_dim >= 1 && text_embed_2_dim >= 1 && image_embed_dim >= 1, source,
           ": text_embed_dim (", text_embed_dim, "), text_embed_2_dim (", text_embed_2_dim,
           ") and image_embed_dim (", image_embed_dim, ") must be >= 1");
  XF_CHECK(byt5_hidden_size >= 1, source, ": xfuser_byt5_hidden_size must be >= 1, got ",
           byt5_hidden_size);
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
}

hunyuan_video::HunyuanVideoConfig HunyuanVideo15Config::block_config() const {
  hunyuan_video::HunyuanVideoConfig c;
  c.in_channels = in_channels;
  c.out_channels = resolved_out_channels();
  c.num_attention_heads = num_attention_heads;
  c.attention_head_dim = attention_head_dim;
  c.num_layers = num_layers;
  c.num_single_layers = 0;
  c.num_refiner_layers = num_refiner_layers;
  c.mlp_ratio = mlp_ratio;
  c.patch_size = patch_size;
  c.patch_size_t = patch_size_t;
  c.qk_norm = qk_norm;
  c.guidance_embeds = false;
  c.text_embed_dim = text_embed_dim;
  c.rope_theta = rope_theta;
  c.rope_axes_dim = rope_axes_dim;
  return c;
}

}  // namespace xfuser::models::hunyuan_video15
