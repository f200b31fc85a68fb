// Flux2Pipeline (FLUX.2 [dev]: text to image, and editing with one or several --input_images) on
// the DiT pipeline base, with diffusers 0.36.0 semantics (pipelines/flux2/pipeline_flux2.py):
//   - the prompt: Mistral's chat text and tokens, hidden_states 10 / 20 / 30 of the Mistral 3
//     language model stacked per token (flux2_prompt.h); text ids (0, 0, 0, l); every token, pads
//     included, goes to the transformer;
//   - latents [B, 4C, H/16, W/16] (the VAE's C latent channels in 2x2 patches, as the pipeline's
//     `latents` argument takes them) drawn in float32, packed to tokens [B, (H/16)(W/16), 4C] in
//     row-major order with ids (0, row, col, 0);
//   - each input picture: capped at 1024 x 1024 pixels (PIL Lanczos to that area, sides
//     truncated), center-cropped to multiples of 16, scaled to [-1, 1], VAE-encoded (the
//     posterior's mode), patchified, normalised by the VAE's batch-norm statistics ((z - mean) /
//     sqrt(var + eps)), packed; picture i's tokens take ids (10 + 10 i, row, col, 0) and follow
//     the generated tokens in the transformer's sequence (their outputs are dropped);
//   - the output size defaults to the first picture's (after the cap and the crop), else
//     1024 x 1024;
//   - FlowMatchEuler with sigmas linspace(1, 1 / n, n) and mu = compute_empirical_mu(tokens, n)
//     (BFL's fit, not the scheduler's calculate_shift); embedded guidance (guidance_scale, the
//     transformer multiplies by 1000), one transformer call a step (no true CFG); timestep
//     sigma in the latents' dtype;
//   - decode: tokens unpacked, de-normalised (x sqrt(var + eps) + mean), unpatchified, VAE
//     decode (--enable_tiling / --enable_slicing as diffusers' enable_tiling / enable_slicing,
//     --use_parallel_vae in bands of latent rows over the replica's ranks), (x / 2 +
//     0.5).clamp(0, 1) x 255 rounded -> uint8 [B, H, W, 3].
// Prompt upsampling (caption_upsample_temperature, generation with the language model) is not
// implemented. The transformer runs through the generic drivers: Ulysses, ring, USP, tensor and
// data parallel and PipeFusion (the pictures' tokens travel with every patch, unpatched).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/registry.h"

namespace xfuser::models {
namespace tokenizers {
class Tokenizer;
}
namespace text_encoders {
class LlamaEncoder;
}
}  // namespace xfuser::models

namespace xfuser::models::flux2 {

class Flux2Transformer2DModel;
class AutoencoderKLFlux2;

// BFL's compute_empirical_mu(image_seq_len, num_steps).
double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps);

// The size (height, width) an input picture of height x width is encoded at: above 1024 x 1024
// pixels scaled to that area (int() of each side), then both sides floored to `multiple`.
std::pair<int64_t, int64_t> reference_size(int64_t height, int64_t width, int64_t multiple);

class Flux2Model : public dit::DiTPipeline {
 public:
  explicit Flux2Model(const ModelSpec& spec);
  ~Flux2Model() override;

  // prompt_embeds [B, max_sequence_length, 3d] in the pipeline dtype.
  at::Tensor embed_prompts(const std::vector<std::string>& prompts, int max_sequence_length) const;

  // [B, C, h, w] <-> [B, h * w, C] (row-major tokens).
  static at::Tensor pack_latents(const at::Tensor& latents);
  static at::Tensor unpack_latents(const at::Tensor& tokens, int64_t rows, int64_t cols);
  // (t, row, col, 0) for a rows x cols grid, float32 [rows * cols, 4].
  static at::Tensor grid_ids(int64_t rows, int64_t cols, double t,
                             const at::TensorOptions& options);

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;

 private:
  struct Flux2State;
  // A picture uint8 [H, W, 3] -> its normalised, packed latents [1, M, 4C] (vae dtype) and
  // rows x cols.
  std::pair<at::Tensor, std::pair<int64_t, int64_t>> encode_picture(
      const at::Tensor& picture) const;

  c10::ScalarType dtype_ = c10::kFloat;
  Flux2Transformer2DModel* flux2_transformer_ = nullptr;  // transformer_, typed
  std::shared_ptr<text_encoders::LlamaEncoder> text_encoder_;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_;
  std::shared_ptr<AutoencoderKLFlux2> flux2_vae_;
  std::filesystem::path scheduler_config_;
  int64_t vae_scale_factor_2_ = 16;  // vae_scale_factor * 2: the pixels of one token
};

// ModelSpec::check_run: the generic DiT check with FLUX.2's tokens and text length.
MemoryEstimate check_flux2_run(const std::filesystem::path& pipeline_dir, const RunLayout& run);

// The registry entries of this family: FLUX.2-dev and the embedded tiny-flux2.
std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::flux2
