// FLUX.1's ModelSpec::check_run: the generic DiT check (models/dit/dit_checks.h) with FLUX's
// token size (2x2 packing of the VAE latents), text length, true-CFG rule and components.
#include "models/flux/flux_checks.h"

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/dit_checks.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"

namespace xfuser::models::flux {
namespace fs = std::filesystem;

MemoryEstimate check_flux_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const auto vae = vae::AutoencoderKLConfig::from_json(vae_folder.config, vae_folder.config_path);
  dit::DiTRunTraits t;
  t.family = "FLUX";
  t.pixels_per_token = (int64_t{1} << (vae.block_out_channels.size() - 1)) * 2;
  t.text_tokens = run.max_sequence_length;
  t.cfg = run.true_cfg;
  t.cfg_parallel_needs =
      "true CFG: give --negative_prompt (every prompt) and --true_cfg_scale > 1 (FLUX.1's "
      "--guidance_scale is distilled guidance, one forward per step, nothing to split over two "
      "ranks)";
  t.components = {"text_encoder", "text_encoder_2", "vae"};
  t.encoders = {{"text_encoder", 77}, {"text_encoder_2", run.max_sequence_length}};
  t.blocks_what = "double + single";
  if (read_model_index(dir).value("_class_name", "") == "FluxKontextPipeline") {
    // The reference picture, resized to a preferred resolution of ~1 MP, is encoded by the VAE
    // and its tokens join the sequence (16 pixels a token).
    t.text_tokens += (1024 / 16) * (1024 / 16);
    t.encode_height = t.encode_width = 1024;
  }
  return dit::check_dit_run(dir, run, t);
}

}  // namespace xfuser::models::flux
