#include "models/flux2/flux2_config.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::flux2 {

Flux2Config Flux2Config::from_json(const nlohmann::json& j, const std::string& source) {
  XF_CHECK(j.is_object(), source, ": a Flux2Transformer2DModel config must be a JSON object");
  Flux2Config c;
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, source);
  c.in_channels = cfg<int64_t>(j, "in_channels", c.in_channels, source);
  c.out_channels = cfg<std::optional<int64_t>>(j, "out_channels", c.out_channels, source);
  c.num_layers = cfg<int64_t>(j, "num_layers", c.num_layers, source);
  c.num_single_layers = cfg<int64_t>(j, "num_single_layers", c.num_single_layers, source);
  c.attention_head_dim = cfg<int64_t>(j, "attention_head_dim", c.attention_head_dim, source);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, source);
  c.joint_attention_dim = cfg<int64_t>(j, "joint_attention_dim", c.joint_attention_dim, source);
  c.timestep_guidance_channels =
      cfg<int64_t>(j, "timestep_guidance_channels", c.timestep_guidance_channels, source);
  c.mlp_ratio = cfg<double>(j, "mlp_ratio", c.mlp_ratio, source);
  c.axes_dims_rope = cfg<std::vector<int64_t>>(j, "axes_dims_rope", c.axes_dims_rope, source);
  c.rope_theta = cfg<double>(j, "rope_theta", c.rope_theta, source);
  c.eps = cfg<double>(j, "eps", c.eps, source);
  // FLUX.1's flag: FLUX.2 always embeds the guidance; a config that turns it off is not FLUX.2's.
  if (j.contains("guidance_embeds")) {
    XF_CHECK(cfg<bool>(j, "guidance_embeds", true, source), source,
             ": guidance_embeds false is not supported: Flux2Transformer2DModel always has "
             "time_guidance_embed.guidance_embedder");
  }
  c.validate(source);
  return c;
}

void Flux2Config::validate(const std::string& source) const {
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
  XF_CHECK(joint_attention_dim >= 1, source, ": joint_attention_dim must be >= 1, got ",
           joint_attention_dim);
  XF_CHECK(timestep_guidance_channels >= 2 && timestep_guidance_channels % 2 == 0, source,
           ": timestep_guidance_channels must be even and >= 2, got ", timestep_guidance_channels);
  XF_CHECK(mlp_ratio > 0 && mlp_hidden_dim() >= 1, source, ": mlp_ratio ", mlp_ratio,
           " gives a feed-forward width of ", mlp_hidden_dim(), " (must be >= 1)");
  XF_CHECK(rope_theta > 0, source, ": rope_theta must be positive, got ", rope_theta);
  XF_CHECK(eps > 0, source, ": eps must be positive, got ", eps);
  XF_CHECK(!axes_dims_rope.empty(), source, ": axes_dims_rope must not be empty");
  for (auto d : axes_dims_rope) {
    XF_CHECK(d > 0 && d % 2 == 0, source,
             ": every axes_dims_rope entry must be even and positive, got ", d);
  }
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  XF_CHECK(sum == attention_head_dim, source, ": sum(axes_dims_rope) = ", sum,
           " must equal attention_head_dim = ", attention_head_dim);
}

}  // namespace xfuser::models::flux2
