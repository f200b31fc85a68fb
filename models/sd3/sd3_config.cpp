#include "models/sd3/sd3_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::sd3 {
namespace {

// cfg() reads an explicit null as the default; in diffusers null is None, which here differs
// from the default (out_channels None -> in_channels; pos_embed_max_size None -> no table).
std::optional<int64_t> nullable_int(const nlohmann::json& j, const std::string& key,
                                    std::optional<int64_t> default_value,
                                    const std::string& source) {
  auto it = j.find(key);
  if (it != j.end() && it->is_null()) return std::nullopt;
  return cfg<std::optional<int64_t>>(j, key, default_value, source);
}

}  // namespace

bool SD3Config::is_dual(int64_t layer) const {
  return std::find(dual_attention_layers.begin(), dual_attention_layers.end(), layer) !=
         dual_attention_layers.end();
}

SD3Config SD3Config::from_json(const nlohmann::json& j, const std::string& source) {
  XF_CHECK(j.is_object(), source, ": an SD3Transformer2DModel config must be a JSON object");
  SD3Config c;
  c.sample_size = cfg<int64_t>(j, "sample_size", c.sample_size, source);
  c.patch_size = cfg<int64_t>(j, "patch_size", c.patch_size, source);
  c.in_channels = cfg<int64_t>(j, "in_channels", c.in_channels, source);
  c.num_layers = cfg<int64_t>(j, "num_layers", c.num_layers, source);
  c.attention_head_dim = cfg<int64_t>(j, "attention_head_dim", c.attention_head_dim, source);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, source);
  c.joint_attention_dim = cfg<int64_t>(j, "joint_attention_dim", c.joint_attention_dim, source);
  c.caption_projection_dim =
      cfg<int64_t>(j, "caption_projection_dim", c.caption_projection_dim, source);
  c.pooled_projection_dim =
      cfg<int64_t>(j, "pooled_projection_dim", c.pooled_projection_dim, source);
  c.out_channels = nullable_int(j, "out_channels", c.out_channels, source);
  c.pos_embed_max_size = nullable_int(j, "pos_embed_max_size", c.pos_embed_max_size, source);
  c.dual_attention_layers =
      cfg<std::vector<int64_t>>(j, "dual_attention_layers", c.dual_attention_layers, source);
  c.qk_norm = cfg<std::optional<std::string>>(j, "qk_norm", c.qk_norm, source);
  c.validate(source);
  return c;
}

void SD3Config::validate(const std::string& source) const {
  XF_CHECK(sample_size >= 1, source, ": sample_size must be >= 1, got ", sample_size);
  XF_CHECK(patch_size >= 1, source, ": patch_size must be >= 1, got ", patch_size);
  XF_CHECK(sample_size >= patch_size, source, ": sample_size (", sample_size,
           ") must be at least patch_size (", patch_size, ")");
  XF_CHECK(in_channels >= 1, source, ": in_channels must be >= 1, got ", in_channels);
  XF_CHECK(resolved_out_channels() >= 1, source, ": out_channels must be >= 1, got ",
           resolved_out_channels());
  XF_CHECK(num_layers >= 1, source, ": num_layers must be >= 1, got ", num_layers);
  XF_CHECK(attention_head_dim >= 1 && num_attention_heads >= 1, source, ": attention_head_dim (",
           attention_head_dim, ") and num_attention_heads (", num_attention_heads,
           ") must be positive");
  XF_CHECK(joint_attention_dim >= 1 && pooled_projection_dim >= 1, source,
           ": joint_attention_dim and pooled_projection_dim must be >= 1");
  // context_embedder's output feeds the blocks, which are inner_dim wide.
  XF_CHECK(caption_projection_dim == inner_dim(), source, ": caption_projection_dim (",
           caption_projection_dim, ") must equal num_attention_heads * attention_head_dim (",
           inner_dim(), ")");
  XF_CHECK(inner_dim() % 4 == 0, source,
           ": num_attention_heads * attention_head_dim must divide by 4 for the 2-D sin-cos "
           "position table, got ",
           inner_dim());
  XF_CHECK(pos_embed_max_size.has_value(), source,
           ": pos_embed_max_size null (a position table computed per resolution, not stored) is "
           "not supported; SD3 checkpoints store an M x M table");
  XF_CHECK(*pos_embed_max_size >= 1, source, ": pos_embed_max_size must be >= 1, got ",
           *pos_embed_max_size);
  for (auto layer : dual_attention_layers) {
    XF_CHECK(0 <= layer && layer < num_layers, source, ": dual_attention_layers entry ", layer,
             " is outside the ", num_layers, " layers");
  }
  if (qk_norm) {
    XF_CHECK(*qk_norm == "rms_norm", source, ": qk_norm '", *qk_norm,
             "' is not supported (SD3 uses null, SD3.5 'rms_norm')");
  }
}

}  // namespace xfuser::models::sd3
