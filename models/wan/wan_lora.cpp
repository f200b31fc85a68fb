#include "models/wan/wan_lora.h"

#include <map>
#include <regex>
#include <string>

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::models::wan {
namespace {

// A Wan module name in the original checkpoint's terms ("blocks.3.self_attn.q", "head.head") ->
// WanTransformer3DModel's ("blocks.3.attn1.to_q", "proj_out"); empty when unknown.
std::string diffusers_module(const std::string& name) {
  static const std::regex attn(
      "blocks\\.([0-9]+)\\.(self_attn|cross_attn)\\.(q|k|v|o|k_img|v_img)");
  static const std::regex ffn("blocks\\.([0-9]+)\\.ffn\\.(0|2)");
  std::smatch m;
  if (std::regex_match(name, m, attn)) {
    static const std::map<std::string, std::string> proj = {
        {"q", "to_q"},     {"k", "to_k"},           {"v", "to_v"},
        {"o", "to_out.0"}, {"k_img", "add_k_proj"}, {"v_img", "add_v_proj"}};
    if (m[2] == "self_attn" && (m[3] == "k_img" || m[3] == "v_img")) return "";
    return "blocks." + m[1].str() + (m[2] == "self_attn" ? ".attn1." : ".attn2.") +
           proj.at(m[3].str());
  }
  if (std::regex_match(name, m, ffn)) {
    return "blocks." + m[1].str() + (m[2] == "0" ? ".ffn.net.0.proj" : ".ffn.net.2");
  }
  static const std::map<std::string, std::string> others = {
      {"time_projection.1", "condition_embedder.time_proj"},
      {"head.head", "proj_out"},
      {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
      {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
      {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
      {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
      {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"},
      {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"},
  };
  auto it = others.find(name);
  return it == others.end() ? "" : it->second;
}

bool lora_key_ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

void convert_original(const LoraFile& file, LoraAdapter& adapter) {
  LoraKeys keys(file);
  const std::string root = "diffusion_model.";
  for (const auto& [key, t] : file.tensors) {
    for (const char* down : {"lora_A", "lora_down"}) {
      const std::string suffix = std::string(".") + down + ".weight";
      if (!lora_key_ends_with(key, suffix) || key.rfind(root, 0) != 0) continue;
      const std::string base = key.substr(0, key.size() - suffix.size());
      const std::string name = base.substr(root.size());
      const std::string module = diffusers_module(name);
      XF_CHECK(!module.empty(), file.path, ": key '", key,
               "' names no Wan module xfuser knows (original Wan layout)");
      const bool peft_names = std::string(down) == "lora_A";
      keys.take_pair(adapter, "transformer", base, {module}, down,
                     peft_names ? "lora_B" : "lora_up", base + ".diff_b");
    }
  }
  // Full-weight differences (`.diff`) and biases without a low-rank part: the norms' are zero in
  // the published adapters and are dropped when they are; anything else is refused by name.
  for (const auto& key : keys.remaining()) {
    if (!lora_key_ends_with(key, ".diff") && !lora_key_ends_with(key, ".diff_b")) continue;
    const bool norm = key.find("norm") != std::string::npos;
    at::Tensor t = keys.take(key);
    XF_CHECK(norm && t.abs().max().item<double>() == 0.0, file.path, ": key '", key,
             "' is a full-weight difference, not a low-rank update; xfuser applies LoRA "
             "updates only (a zero norm difference is the one kind it drops)");
  }
  keys.finish("original Wan");
}

void convert_musubi(const LoraFile& file, LoraAdapter& adapter) {
  LoraKeys keys(file);
  static const std::regex block(
      "lora_unet_blocks_([0-9]+)_(self_attn|cross_attn)_(q|k|v|o|k_img|v_img)");
  static const std::regex ffn("lora_unet_blocks_([0-9]+)_ffn_(0|2)");
  const std::string suffix = ".lora_down.weight";
  for (const auto& [key, t] : file.tensors) {
    if (!lora_key_ends_with(key, suffix)) continue;
    const std::string base = key.substr(0, key.size() - suffix.size());
    std::smatch m;
    std::string name;
    if (std::regex_match(base, m, block)) {
      name = "blocks." + m[1].str() + "." + m[2].str() + "." + m[3].str();
    } else if (std::regex_match(base, m, ffn)) {
      name = "blocks." + m[1].str() + ".ffn." + m[2].str();
    }
    const std::string module = name.empty() ? "" : diffusers_module(name);
    XF_CHECK(!module.empty(), file.path, ": key '", key,
             "' names no Wan module xfuser knows (musubi-tuner / kohya layout)");
    keys.take_pair(adapter, "transformer", base, {module});
  }
  keys.finish("musubi-tuner / kohya (Wan)");
}

}  // namespace

std::vector<LoraLayout> wan_lora_layouts() {
  LoraLayout original;
  original.name = "original Wan (diffusion_model.blocks....)";
  original.matches = [](const LoraFile& f) { return f.has_key_prefix("diffusion_model."); };
  original.convert = convert_original;
  LoraLayout musubi;
  musubi.name = "musubi-tuner / kohya (lora_unet_blocks_...)";
  musubi.matches = [](const LoraFile& f) { return f.has_key_prefix("lora_unet_"); };
  musubi.convert = convert_musubi;
  return {original, musubi};
}

}  // namespace xfuser::models::wan
