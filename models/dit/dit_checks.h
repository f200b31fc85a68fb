// The check every DiT pipeline runs before any weight is read (ModelSpec::check_run, used by
// `xfuser validate` and by xfuser-run before loading): the run's degrees and sizes against the
// transformer's config.json (heads, blocks: through the family's own DiT factory, which declares
// shapes only) and the VAE's, and the memory one rank needs from the weight headers
// (memory-mapped, no data read) and the activation sizes.
#pragma once

#include <filesystem>
#include <set>
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
  // The text (and image) encoders the prompt goes through, with their sequence lengths.
  std::vector<std::pair<std::string, int64_t>> encoders;
  // Folders loaded in float32 whatever --dtype (Wan's VAE and image encoder).
  std::set<std::string> float32_components;
  // [B, S, D]-sized tensors a transformer block holds at its peak (measured per family).
  int live_hidden_tensors = 16;
  // With a half dtype, the float32 [B, S, D] copies a block adds (norms computed in fp32).
  int half_fp32_tensors = 0;
  // Rows of one model batch whose text lengths differ take a key mask (padded text): the CPU's
  // chunked kernel.
  bool masked_attention = false;
  // The CFG branches run as one batch [negative; positive] (SD3), not one after the other.
  bool cfg_batched = false;
  // The VAE encodes an input picture (editing) or video (image-to-video) of this size; 0: none.
  int64_t encode_frames = 1, encode_height = 0, encode_width = 0;
  // Cross-attention (Wan): the text keys each block attends, besides its own tokens.
  int64_t cross_attention_tokens = 0;
};

MemoryEstimate check_dit_run(const std::filesystem::path& pipeline_dir, const RunLayout& run,
                             const DiTRunTraits& traits);

}  // namespace xfuser::models::dit
