// FLUX.1's ModelSpec::check_run: a run's degrees, sizes and guidance checked against the
// pipeline folder's config.json files and weight headers before any tensor data is read, and the
// memory one rank needs (used by `xfuser validate` and by xfuser-run before loading).
#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/flux/flux_config.h"
#include "models/flux/flux_pipefusion.h"
#include "models/registry.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::flux {
namespace fs = std::filesystem;

namespace {

// Parameters of a component folder, from its weight headers (memory-mapped, no data read).
uint64_t parameter_count(const fs::path& dir) {
  const ComponentFolder folder = open_component_folder(dir.string());
  uint64_t count = 0;
  for (const auto& name : folder.weights->names()) {
    uint64_t n = 1;
    for (int64_t d : folder.weights->info(name).shape) n *= static_cast<uint64_t>(d);
    count += n;
  }
  return count;
}

}  // namespace

MemoryEstimate check_flux_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder transformer = open_component_folder((dir / "transformer").string());
  const FluxConfig config = FluxConfig::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_folder((dir / "vae").string());
  const auto vae = vae::AutoencoderKLConfig::from_json(vae_folder.config, vae_folder.config_path);

  XF_CHECK(run.cfg == 1 || run.true_cfg,
           "--use_cfg_parallel needs true CFG: give --negative_prompt (every prompt) and "
           "--true_cfg_scale > 1 (FLUX.1's --guidance_scale is distilled guidance, one forward per "
           "step, nothing to split over two ranks)");
  XF_CHECK(config.num_attention_heads % run.tensor == 0, "--tensor_parallel_degree ", run.tensor,
           " does not divide the ", config.num_attention_heads, " attention heads of ",
           transformer.config_path, ": every rank must hold whole heads");
  XF_CHECK(run.pipefusion == 1 || run.tensor == 1,
           "--pipefusion_parallel_degree with --tensor_parallel_degree is not supported yet: use "
           "one of them");
  const int multiple = (1 << (vae.block_out_channels.size() - 1)) * 2;
  XF_CHECK(run.height % multiple == 0, "--height ", run.height, " must be a multiple of ", multiple,
           " for this FLUX pipeline (", vae_folder.config_path, ")");
  XF_CHECK(run.width % multiple == 0, "--width ", run.width, " must be a multiple of ", multiple,
           " for this FLUX pipeline (", vae_folder.config_path, ")");
  XF_CHECK(run.max_sequence_length >= 1 && run.max_sequence_length <= 512,
           "--max_sequence_length must be in [1, 512] for FLUX.1 (got ", run.max_sequence_length,
           ")");
  if (run.pipefusion > 1) {
    pipefusion_stage_layers(config, run.pipefusion, run.pipefusion_layers);
    const int patches = run.num_pipeline_patch > 0 ? run.num_pipeline_patch : run.pipefusion;
    pipefusion_patch_rows(run.height / multiple, patches);
  }

  // Memory of one rank. Weights in the compute dtype; the transformer split over tp ranks or pp
  // stages.
  const uint64_t bytes = static_cast<uint64_t>(run.bytes_per_element);
  MemoryEstimate m;
  uint64_t params = parameter_count(dir / "transformer") / (run.tensor * run.pipefusion);
  for (const char* part : {"text_encoder", "text_encoder_2", "vae"}) {
    params += parameter_count(dir / part);
  }
  m.weights = params * bytes;
  // Transformer activations: the hidden states of the rank's tokens (sequence parallel splits
  // them, true CFG without CFG parallel doubles the batch) times ~16 live [B, S, D]-sized tensors
  // in a block (residual, norms, q/k/v, attention output, the 4x MLP).
  const uint64_t batch =
      static_cast<uint64_t>(run.batch_size) * (run.true_cfg && run.cfg == 1 ? 2 : 1);
  const uint64_t image_tokens =
      static_cast<uint64_t>(run.height / multiple) * (run.width / multiple);
  const uint64_t tokens = (image_tokens + run.max_sequence_length) / (run.ulysses * run.ring);
  const uint64_t dim = static_cast<uint64_t>(config.inner_dim());
  const uint64_t transformer_act = batch * tokens * dim * bytes * 16;
  // VAE decode: ~4 live feature maps of the widest decoder level at full resolution (a tile with
  // --enable_tiling).
  const uint64_t c0 = static_cast<uint64_t>(
      *std::max_element(vae.block_out_channels.begin(), vae.block_out_channels.end()));
  uint64_t h = run.height, w = run.width;
  if (run.enable_tiling) {
    h = std::min<uint64_t>(h, vae.sample_size);
    w = std::min<uint64_t>(w, vae.sample_size);
  }
  const uint64_t vae_act = static_cast<uint64_t>(run.batch_size) * c0 * h * w * bytes * 4;
  m.activations = std::max(transformer_act, vae_act);
  // Attention scratch: per thread, fp32 scores and probabilities of a query block (>= 16 rows,
  // ~1 MiB) against every key, for the transformer's joint sequence and the VAE's mid-block.
  auto scratch = [&](uint64_t keys) {
    const uint64_t rows =
        std::max<uint64_t>(16, (uint64_t{1} << 20) / (4 * std::max<uint64_t>(keys, 1)));
    return 3 * rows * keys * 4 * static_cast<uint64_t>(std::max(run.threads, 1));
  };
  const uint64_t vae_tokens = (h / (multiple / 2)) * (w / (multiple / 2));
  m.attention = std::max(scratch(image_tokens + run.max_sequence_length), scratch(vae_tokens));
  return m;
}

}  // namespace xfuser::models::flux
