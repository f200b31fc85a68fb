// WanConfig: the init arguments of diffusers' WanTransformer3DModel (Wan 2.1 T2V / I2V,
// v0.33.1), read from config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xfuser::models::wan {

struct WanConfig {
  // diffusers' defaults (WanTransformer3DModel.__init__, v0.33.1).
  std::vector<int64_t> patch_size = {1, 2, 2};  // (t, h, w)
  int64_t num_attention_heads = 40;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 16;
  std::optional<int64_t> out_channels = 16;  // None (or 0) -> in_channels
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 13824;
  int64_t num_layers = 40;
  bool cross_attn_norm = true;
  std::optional<std::string> qk_norm = std::string("rms_norm_across_heads");
  double eps = 1e-6;
  std::optional<int64_t> image_dim;          // I2V: CLIP image embedding width (1280)
  std::optional<int64_t> added_kv_proj_dim;  // I2V: attn2.add_k_proj / add_v_proj input width
  int64_t rope_max_seq_len = 1024;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t resolved_out_channels() const {
    return out_channels && *out_channels != 0 ? *out_channels : in_channels;
  }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // Channels of one input token: a (pt, ph, pw) patch of in_channels latents.
  int64_t token_channels() const { return in_channels * patch_volume(); }
  // proj_out's output width: out_channels * pt * ph * pw.
  int64_t output_dim() const { return resolved_out_channels() * patch_volume(); }
  // WanRotaryPosEmbed: h_dim = w_dim = 2 * (head_dim // 6), t_dim = the rest.
  std::vector<int64_t> rope_axes_dims() const {
    const int64_t hw = 2 * (attention_head_dim / 6);
    return {attention_head_dim - 2 * hw, hw, hw};
  }

  // Reads the fields present in `j` (others keep the defaults; "_"-prefixed and unknown keys are
  // ignored, as diffusers does). A wrongly typed field is an error naming it and `source`.
  static WanConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  // Throws, naming the field and `source`, when the sizes are inconsistent or unsupported.
  void validate(const std::string& source = "config.json") const;
};

}  // namespace xfuser::models::wan
