#include "models/wan/wan_config.h"

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::wan {
namespace {

// cfg() reads an explicit null as the default; in diffusers null is None, which for these
// fields differs from the default (qk_norm None: no QK norms).
template <class T>
std::optional<T> nullable(const nlohmann::json& j, const std::string& key,
                          std::optional<T> default_value, const std::string& source) {
  auto it = j.find(key);
  if (it != j.end() && it->is_null()) return std::nullopt;
  return cfg<std::optional<T>>(j, key, default_value, source);
}

}  // namespace

WanConfig WanConfig::from_json(const nlohmann::json& j, const std::string& source) {
  XF_CHECK(j.is_object(), source, ": a WanTransformer3DModel config must be a JSON object");
  // Wan2.1 FLF2V's learned position embedding of the image tokens is not ported.
  XF_CHECK(!j.contains("pos_embed_seq_len") || j["pos_embed_seq_len"].is_null(), source,
           ": pos_embed_seq_len (first-last-frame-to-video) is not supported");
  WanConfig c;
  c.patch_size = cfg<std::vector<int64_t>>(j, "patch_size", c.patch_size, source);
  c.num_attention_heads = cfg<int64_t>(j, "num_attention_heads", c.num_attention_heads, source);
  c.attention_head_dim = cfg<int64_t>(j, "attention_head_dim", c.attention_head_dim, source);
  c.in_channels = cfg<int64_t>(j, "in_channels", c.in_channels, source);
  c.out_channels = nullable<int64_t>(j, "out_channels", c.out_channels, source);
  c.text_dim = cfg<int64_t>(j, "text_dim", c.text_dim, source);
  c.freq_dim = cfg<int64_t>(j, "freq_dim", c.freq_dim, source);
  c.ffn_dim = cfg<int64_t>(j, "ffn_dim", c.ffn_dim, source);
  c.num_layers = cfg<int64_t>(j, "num_layers", c.num_layers, source);
  c.cross_attn_norm = cfg<bool>(j, "cross_attn_norm", c.cross_attn_norm, source);
  c.qk_norm = nullable<std::string>(j, "qk_norm", c.qk_norm, source);
  c.eps = cfg<double>(j, "eps", c.eps, source);
  c.image_dim = nullable<int64_t>(j, "image_dim", c.image_dim, source);
  c.added_kv_proj_dim = nullable<int64_t>(j, "added_kv_proj_dim", c.added_kv_proj_dim, source);
  c.rope_max_seq_len = cfg<int64_t>(j, "rope_max_seq_len", c.rope_max_seq_len, source);
  c.validate(source);
  return c;
}

void WanConfig::validate(const std::string& source) const {
  XF_CHECK(patch_size.size() == 3, source, ": patch_size must be [t, h, w], got ",
           patch_size.size(), " values");
  for (auto p : patch_size) {
    XF_CHECK(p >= 1, source, ": patch_size entries must be >= 1, got ", p);
  }
  XF_CHECK(num_attention_heads >= 1 && attention_head_dim >= 1, source, ": num_attention_heads (",
           num_attention_heads, ") and attention_head_dim (", attention_head_dim,
           ") must be positive");
  // Complex RoPE pairs: every axis of WanRotaryPosEmbed needs an even, positive width.
  XF_CHECK(attention_head_dim % 2 == 0 && attention_head_dim >= 6, source,
           ": attention_head_dim must be even and >= 6 for the (t, h, w) rotary split, got ",
           attention_head_dim);
  XF_CHECK(in_channels >= 1, source, ": in_channels must be >= 1, got ", in_channels);
  XF_CHECK(resolved_out_channels() >= 1, source, ": out_channels must be >= 1, got ",
           resolved_out_channels());
  XF_CHECK(text_dim >= 1, source, ": text_dim must be >= 1, got ", text_dim);
  XF_CHECK(freq_dim >= 2 && freq_dim % 2 == 0, source, ": freq_dim must be even and >= 2, got ",
           freq_dim);
  XF_CHECK(ffn_dim >= 1, source, ": ffn_dim must be >= 1, got ", ffn_dim);
  XF_CHECK(num_layers >= 1, source, ": num_layers must be >= 1, got ", num_layers);
  XF_CHECK(eps > 0, source, ": eps must be positive, got ", eps);
  XF_CHECK(rope_max_seq_len >= 1, source, ": rope_max_seq_len must be >= 1, got ",
           rope_max_seq_len);
  XF_CHECK(qk_norm.has_value() && *qk_norm == "rms_norm_across_heads", source, ": qk_norm '",
           qk_norm.value_or("null"),
           "' is not supported (Wan checkpoints use 'rms_norm_across_heads')");
  if (image_dim) {
    XF_CHECK(*image_dim >= 1, source, ": image_dim must be >= 1, got ", *image_dim);
  }
  if (added_kv_proj_dim) {
    // add_k_proj / add_v_proj read the image embedder's output, which is inner_dim wide.
    XF_CHECK(image_dim.has_value(), source,
             ": added_kv_proj_dim is set but image_dim is null (the image attention needs the "
             "image embedder)");
    XF_CHECK(*added_kv_proj_dim == inner_dim(), source, ": added_kv_proj_dim (", *added_kv_proj_dim,
             ") must equal num_attention_heads * attention_head_dim (", inner_dim(),
             "), the image embedder's output width");
  }
}

}  // namespace xfuser::models::wan
