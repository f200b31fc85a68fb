#include "models/flux/flux_lora.h"

#include <map>
#include <regex>
#include <string>

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::models::flux {
namespace {

// BFL's module name (after "lora_unet_") -> diffusers' module(s) in FluxTransformer2DModel. A fused
// BFL projection lists the diffusers modules its output rows split into, in order (qkv: to_q,
// to_k, to_v; a single block's linear1: to_q, to_k, to_v, proj_mlp).
std::vector<std::string> bfl_modules(const std::string& name) {
  static const std::regex dbl(
      "double_blocks_([0-9]+)_(img|txt)_(attn_qkv|attn_proj|mlp_0|mlp_2|mod_lin)");
  static const std::regex sgl("single_blocks_([0-9]+)_(linear1|linear2|modulation_lin)");
  std::smatch m;
  if (std::regex_match(name, m, dbl)) {
    const std::string b = "transformer_blocks." + m[1].str() + ".";
    const bool img = m[2] == "img";
    const std::string part = m[3];
    if (part == "attn_qkv") {
      return img ? std::vector<std::string>{b + "attn.to_q", b + "attn.to_k", b + "attn.to_v"}
                 : std::vector<std::string>{b + "attn.add_q_proj", b + "attn.add_k_proj",
                                            b + "attn.add_v_proj"};
    }
    if (part == "attn_proj") return {b + (img ? "attn.to_out.0" : "attn.to_add_out")};
    if (part == "mlp_0") return {b + (img ? "ff.net.0.proj" : "ff_context.net.0.proj")};
    if (part == "mlp_2") return {b + (img ? "ff.net.2" : "ff_context.net.2")};
    return {b + (img ? "norm1.linear" : "norm1_context.linear")};
  }
  if (std::regex_match(name, m, sgl)) {
    const std::string b = "single_transformer_blocks." + m[1].str() + ".";
    if (m[2] == "linear1") {
      return {b + "attn.to_q", b + "attn.to_k", b + "attn.to_v", b + "proj_mlp"};
    }
    return {b + (m[2] == "linear2" ? "proj_out" : "norm.linear")};
  }
  static const std::map<std::string, std::string> others = {
      {"guidance_in_in_layer", "time_text_embed.guidance_embedder.linear_1"},
      {"guidance_in_out_layer", "time_text_embed.guidance_embedder.linear_2"},
      {"time_in_in_layer", "time_text_embed.timestep_embedder.linear_1"},
      {"time_in_out_layer", "time_text_embed.timestep_embedder.linear_2"},
      {"vector_in_in_layer", "time_text_embed.text_embedder.linear_1"},
      {"vector_in_out_layer", "time_text_embed.text_embedder.linear_2"},
      {"img_in", "x_embedder"},
      {"txt_in", "context_embedder"},
      {"final_layer_linear", "proj_out"},
  };
  auto it = others.find(name);
  if (it != others.end()) return {it->second};
  return {};
}

// "text_model_encoder_layers_0_self_attn_q_proj" -> "text_model.encoder.layers.0.self_attn.q_proj".
std::string clip_module(const std::string& name) {
  static const std::regex layer("text_model_encoder_layers_([0-9]+)_(self_attn|mlp)_(.+)");
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return "";
  return "text_model.encoder.layers." + m[1].str() + "." + m[2].str() + "." + m[3].str();
}

void convert_kohya(const LoraFile& file, LoraAdapter& adapter) {
  LoraKeys keys(file);
  for (const auto& [key, t] : file.tensors) {
    const std::string suffix = ".lora_down.weight";
    if (key.size() <= suffix.size() ||
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string base = key.substr(0, key.size() - suffix.size());
    if (base.rfind("lora_unet_", 0) == 0) {
      const std::string name = base.substr(10);
      if (name == "final_layer_adaLN_modulation_1") {
        // BFL's final modulation is (shift, scale); diffusers' norm_out.linear is (scale,
        // shift): the up rows swap halves.
        XF_CHECK(keys.take_pair(adapter, "transformer", base, {"norm_out.linear"}), file.path, ": ",
                 key);
        at::Tensor& up = adapter.components["transformer"].back().up;
        const auto halves = up.chunk(2, 0);
        up = at::cat({halves[1], halves[0]}, 0);
        continue;
      }
      const auto modules = bfl_modules(name);
      XF_CHECK(!modules.empty(), file.path, ": key '", key,
               "' names no FLUX.1 module xfuser knows (kohya layout)");
      keys.take_pair(adapter, "transformer", base, modules);
    } else if (base.rfind("lora_te1_", 0) == 0 || base.rfind("lora_te_", 0) == 0) {
      const std::string name = base.substr(base.find('_', 5) + 1);
      const std::string module = clip_module(name);
      XF_CHECK(!module.empty(), file.path, ": key '", key,
               "' names no CLIP text-encoder layer xfuser knows (kohya layout)");
      keys.take_pair(adapter, "text_encoder", base, {module});
    }
  }
  keys.finish("kohya (FLUX.1)");
}

}  // namespace

std::vector<LoraLayout> flux_lora_layouts() {
  LoraLayout kohya;
  kohya.name = "kohya (lora_unet_double_blocks_..., lora_te1_...)";
  kohya.matches = [](const LoraFile& f) {
    return f.has_key_prefix("lora_unet_") || f.has_key_prefix("lora_te1_") ||
           f.has_key_prefix("lora_te_");
  };
  kohya.convert = convert_kohya;
  return {kohya};
}

}  // namespace xfuser::models::flux
