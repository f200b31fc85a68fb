// The check every DiT pipeline runs before any weight is read (ModelSpec::check_run, used by
// `xfuser validate` and by xfuser-run before loading): the run's degrees and sizes against the
// transformer's config.json (heads, blocks: through the family's own DiT factory, which declares
// shapes only) and the VAE's, and the memory one rank needs from the weight headers
// (memory-mapped, no data read) and the activation sizes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "models/registry.h"

namespace xfuser::models::dit {

// What differs between families.
struct DiTRunTraits {
  std::string family;                   // "FLUX.1", "SD3" (in messages)
  int64_t pixels_per_token = 16;        // one token's side in pixels (VAE scale x patch)
  int64_t text_tokens = 0;              // the joint attention's text length for this run
  bool cfg = false;                     // the run evaluates two branches (classifier-free guidance)
  std::string cfg_parallel_needs;       // the error's remedy when --use_cfg_parallel has no CFG
  int64_t max_grid = 0;                 // the largest token grid side (position table), 0: none
  int max_sequence_length = 512;        // --max_sequence_length's upper bound
  std::vector<std::string> components;  // the folders whose weights count (besides transformer)
  std::string blocks_what;              // PipeFusion's block naming ("double + single")
  // Video: latent frames of the run (the token grid is frames x rows x columns; PipeFusion patches
  // split frames x rows). Images: 1.
  int64_t latent_frames = 1;
  // The VAE's widest level and pixels per latent pixel; 0: read from an AutoencoderKL config.
  int64_t vae_max_channels = 0;
  int64_t vae_scale = 0;
};

MemoryEstimate check_dit_run(const std::filesystem::path& pipeline_dir, const RunLayout& run,
                             const DiTRunTraits& traits);

}  // namespace xfuser::models::dit
