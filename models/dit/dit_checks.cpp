#include "models/dit/dit_checks.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/fsdp.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::dit {
namespace fs = std::filesystem;

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every tensor of a component folder: from its weight headers (memory-mapped, no data read), or,
// for a folder with its config.json alone, from the module the config builds (a transformer
// through the family's DiT factory).
Shapes folder_shapes(const fs::path& dir, bool transformer) {
  if (!transformer) return component_tensor_shapes(dir.string());
  return component_tensor_shapes(dir.string(), [&](const ComponentFolder&) {
    return std::static_pointer_cast<Module>(describe_dit_transformer(dir.string()));
  });
}

uint64_t parameter_count(const Shapes& shapes) {
  uint64_t count = 0;
  for (const auto& [name, shape] : shapes) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    count += n;
  }
  return count;
}

uint64_t parameter_count(const fs::path& dir, bool transformer = false) {
  return parameter_count(folder_shapes(dir, transformer));
}

// Under FSDP: a component's parameters, and the most of them it gathers at once (two blocks, or
// its parameters outside the blocks and one block; models/common/fsdp.h).
struct ShardedCount {
  uint64_t total = 0;
  uint64_t gathered = 0;
};

ShardedCount sharded_count(const fs::path& dir, bool transformer,
                           std::vector<std::string> block_prefixes) {
  const Shapes shapes = folder_shapes(dir, transformer);
  if (block_prefixes.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, shape] : shapes) names.push_back(name);
    block_prefixes = FsdpSharder::find_block_prefixes(names);
  }
  std::map<std::pair<int, int64_t>, uint64_t> blocks;
  uint64_t rest = 0;
  ShardedCount c;
  for (const auto& [name, shape] : shapes) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    c.total += n;
    const auto key = block_list_key(name, block_prefixes);
    (key.first >= 0 ? blocks[key] : rest) += n;
  }
  uint64_t largest = 0, second = 0;
  for (const auto& [key, n] : blocks) {
    if (n > largest) {
      second = largest;
      largest = n;
    } else {
      second = std::max(second, n);
    }
  }
  c.gathered = std::max(largest + second, rest + largest);
  return c;
}

}  // namespace

MemoryEstimate check_dit_run(const fs::path& dir, const RunLayout& run, const DiTRunTraits& t) {
  const auto model = describe_dit_transformer((dir / "transformer").string());
  const std::string config_path = (dir / "transformer" / "config.json").string();
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  // The VAE's widest level, pixels per latent pixel and tile size (the caller's for other VAEs).
  int64_t vae_channels = t.vae_max_channels, vae_scale = t.vae_scale, vae_sample_size = 0;
  if (vae_channels == 0) {
    const auto vae = vae::AutoencoderKLConfig::from_json(vae_folder.config, vae_folder.config_path);
    vae_channels = *std::max_element(vae.block_out_channels.begin(), vae.block_out_channels.end());
    vae_scale = int64_t{1} << (vae.block_out_channels.size() - 1);
    vae_sample_size = vae.sample_size;
  }

  XF_CHECK(run.cfg == 1 || t.cfg, "--use_cfg_parallel needs ", t.cfg_parallel_needs);
  XF_CHECK(model->num_heads() % run.tensor == 0, "--tensor_parallel_degree ", run.tensor,
           " does not divide the ", model->num_heads(), " attention heads of ", config_path,
           ": every rank must hold whole heads");
  XF_CHECK(run.pipefusion == 1 || run.tensor == 1,
           "--pipefusion_parallel_degree with --tensor_parallel_degree is not supported yet: use "
           "one of them");
  const int64_t multiple = t.pixels_per_token;
  XF_CHECK(run.height % multiple == 0, "--height ", run.height, " must be a multiple of ", multiple,
           " for this ", t.family, " pipeline (", vae_folder.config_path, ", ", config_path, ")");
  XF_CHECK(run.width % multiple == 0, "--width ", run.width, " must be a multiple of ", multiple,
           " for this ", t.family, " pipeline (", vae_folder.config_path, ", ", config_path, ")");
  XF_CHECK(t.max_grid == 0 ||
               (run.height / multiple <= t.max_grid && run.width / multiple <= t.max_grid),
           "--height ", run.height, " x --width ", run.width, " exceeds the ",
           t.max_grid * multiple, " pixels a side that the transformer's position table holds (",
           config_path, ")");
  XF_CHECK(run.max_sequence_length >= 1 && run.max_sequence_length <= t.max_sequence_length,
           "--max_sequence_length must be in [1, ", t.max_sequence_length, "] for ", t.family,
           " (got ", run.max_sequence_length, ")");
  if (run.pipefusion > 1) {
    pipefusion_stage_layers(*model, run.pipefusion, run.pipefusion_layers, t.blocks_what);
    const int patches = run.num_pipeline_patch > 0 ? run.num_pipeline_patch : run.pipefusion;
    pipefusion_patch_rows(t.latent_frames * (run.height / multiple), patches);
  }

  // Memory of one rank. Weights in the compute dtype; the transformer split over tp ranks or pp
  // stages.
  const uint64_t bytes = static_cast<uint64_t>(run.bytes_per_element);
  MemoryEstimate m;
  const uint64_t transformer_params =
      parameter_count(dir / "transformer", true) / (run.tensor * run.pipefusion);
  uint64_t params = 0;
  for (const auto& part : t.components) {
    params += parameter_count(dir / part, part == "transformer_2");
  }
  m.weights = params * bytes +
              transformer_params * static_cast<uint64_t>(run.transformer_bytes_per_element);
  if (run.fsdp > 1) {
    // FSDP: 1/N of every component but the VAE, plus what one component gathers at once.
    const uint64_t n = static_cast<uint64_t>(run.fsdp);
    const uint64_t tbytes = static_cast<uint64_t>(run.transformer_bytes_per_element);
    const ShardedCount tr = sharded_count(dir / "transformer", true, model->block_list_prefixes());
    uint64_t shards = (tr.total + n - 1) / n * tbytes;
    uint64_t gathered = tr.gathered * tbytes;
    for (const auto& part : t.components) {
      if (part.rfind("vae", 0) == 0) {
        shards += parameter_count(dir / part) * bytes;
        continue;
      }
      const bool expert = part == "transformer_2";
      const ShardedCount c = sharded_count(
          dir / part, expert, expert ? model->block_list_prefixes() : std::vector<std::string>{});
      const uint64_t b = expert ? tbytes : bytes;
      shards += (c.total + n - 1) / n * b;
      gathered = std::max(gathered, c.gathered * b);
    }
    m.weights = shards + gathered;
  }
  // Transformer activations: the hidden states of the rank's tokens (sequence parallel splits
  // them, CFG without CFG parallel doubles the batch) times ~16 live [B, S, D]-sized tensors in a
  // block (residual, norms, q/k/v, attention output, the 4x MLP).
  const uint64_t batch = static_cast<uint64_t>(run.batch_size) * (t.cfg && run.cfg == 1 ? 2 : 1);
  const uint64_t image_tokens = static_cast<uint64_t>(t.latent_frames) *
                                static_cast<uint64_t>(run.height / multiple) *
                                static_cast<uint64_t>(run.width / multiple);
  const uint64_t tokens =
      (image_tokens + static_cast<uint64_t>(t.text_tokens)) / (run.ulysses * run.ring);
  const uint64_t dim = static_cast<uint64_t>(model->hidden_size());
  const uint64_t transformer_act = batch * tokens * dim * bytes * 16;
  // VAE decode: ~4 live feature maps of the widest decoder level at full resolution (a tile with
  // --enable_tiling).
  const uint64_t c0 = static_cast<uint64_t>(vae_channels);
  uint64_t h = run.height, w = run.width;
  if (run.enable_tiling && vae_sample_size > 0) {
    h = std::min<uint64_t>(h, static_cast<uint64_t>(vae_sample_size));
    w = std::min<uint64_t>(w, static_cast<uint64_t>(vae_sample_size));
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
  const uint64_t vae_tokens =
      (h / static_cast<uint64_t>(vae_scale)) * (w / static_cast<uint64_t>(vae_scale));
  m.attention =
      std::max(scratch(image_tokens + static_cast<uint64_t>(t.text_tokens)), scratch(vae_tokens));
  return m;
}

}  // namespace xfuser::models::dit
