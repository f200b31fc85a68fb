#include "models/flux/flux_config.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::flux {

FluxConfig FluxConfig::from_json(const nlohmann::json& j, const std::string& source) {
  XF_CHECK(j.is_object(), source, ": a FluxTransformer2DModel config must be a JSON object");
  FluxConfig c;
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, source);
  c.in_channels = cfg<int64_t>(j, "in_channels", c.in_channels, source);
  c.out_channels = cfg<std::optional<int64_t>>(j, "out_channels", c.out_channels, source);
  c.num_layers = cfg<int64_t>(j, "num_layers", c.num_layers, source);
  c.num_single_layers = cfg<int64_t>(j, "num_single_layers", c.num_single_layers, source);
  c.attention_head_dim = cfg<int64_t>(j, "attention_head_dim", c.attention_head_dim, source);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, source);
  c.joint_attention_dim = cfg<int64_t>(j, "joint_attention_dim", c.joint_attention_dim, source);
  c.pooled_projection_dim =
      cfg<int64_t>(j, "pooled_projection_dim", c.pooled_projection_dim, source);
  c.guidance_embeds = cfg<bool>(j, "guidance_embeds", c.guidance_embeds, source);
  c.axes_dims_rope = cfg<std::vector<int64_t>>(j, "axes_dims_rope", c.axes_dims_rope, source);
  c.validate(source);
  return c;
}

void FluxConfig::validate(const std::string& source) const {
  XF_CHECK(patch_size >= 1, source, ": patch_size must be >= 1, got ", patch_size);
  XF_CHECK(in_channels >= 1, source, ": in_channels must be >= 1, got ", in_channels);
  XF_CHECK(resolved_out_channels() >= 1, source, ": out_channels must be >= 1, got ",
           resolved_out_channels());
  XF_CHECK(num_layers >= 0 && num_single_layers >= 0, source,
           ": num_layers and num_single_layers must be >= 0, got ", num_layers, " and ",
           num_single_layers);
  XF_CHECK(attention_head_dim >= 2 && num_attention_heads >= 1, source, ": attention_head_dim (",
           attention_head_dim, ") and num_attention_heads (", num_attention_heads,
           ") must be positive");
  XF_CHECK(joint_attention_dim >= 1 && pooled_projection_dim >= 1, source,
           ": joint_attention_dim and pooled_projection_dim must be >= 1");
  XF_CHECK(!axes_dims_rope.empty(), source, ": axes_dims_rope must not be empty");
  for (auto d : axes_dims_rope) {
    XF_CHECK(d > 0 && d % 2 == 0, source,
             ": every axes_dims_rope entry must be even and positive, got ", d);
  }
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  XF_CHECK(sum == attention_head_dim, source, ": sum(axes_dims_rope) = ", sum,
           " must equal attention_head_dim = ", attention_head_dim);
}

}  // namespace xfuser::models::flux
