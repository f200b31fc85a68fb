// WanPipeline (Wan 2.1 text-to-video) on the DiT pipeline base, with diffusers v0.33.1 semantics
// (pipeline_wan.py):
//   - prompts cleaned as prompt_clean (wan_prompt.h), tokenised by the UMT5 tokenizer at
//     max_sequence_length (padding "max_length", truncation, attention mask), encoded by the
//     UMT5EncoderModel with that mask, and every position past a prompt's length set to zero
//     (the pipeline's u[:seq_len] and new_zeros padding);
//   - classifier-free guidance when guidance_scale > 1, with the negative prompt ("" when none is
//     given), the two branches as separate transformer calls (conditional, then unconditional),
//     noise = uncond + scale * (cond - uncond);
//   - latents [B, 16, (F - 1) / 4 + 1, H / 8, W / 8] in float32 (the pipeline's prepare_latents
//     dtype), cast to the transformer's dtype for every call; UniPCMultistepScheduler (flow
//     prediction, flow sigmas) from the folder, --flow_shift overriding its flow_shift; the
//     timestep t (0..1000) to the transformer;
//   - decode: latents * latents_std + latents_mean (the VAE config's), AutoencoderKLWan.decode
//     (float32, as the Wan model cards load the VAE), then VideoProcessor.postprocess_video:
//     (x / 2 + 0.5).clamp(0, 1) x 255, rounded -> uint8 [B, F, H, W, 3].
// WanImageToVideoPipeline (Wan 2.1 image-to-video, pipeline_wan_i2v.py) is the same class with the
// folder's image_encoder (CLIPVisionModel) and image_processor (CLIPImageProcessor):
//   - the one --input_images picture through CLIPImageProcessor and the CLIP vision tower
//     (float32, as the Wan model cards load it); its hidden_states[-2] [1, 257, 1280] are the
//     transformer's image context for every prompt and both CFG branches;
//   - the picture resized to --height x --width as VideoProcessor.preprocess does (PIL Lanczos,
//     x / 255 * 2 - 1), as the first frame of a video of zeros, VAE-encoded (the posterior mean),
//     normalised ((z - latents_mean) / latents_std), after a 4-channel mask (1 on the latent frame
//     of the first picture frame): a condition [B, 20, f, h, w] concatenated to the latents along
//     the channels at every step (in_channels 36).
// The transformer runs on tokens (WanTransformer3DModel::patchify): every DiT parallel driver
// (Ulysses, ring, CFG parallel, tensor parallel, PipeFusion over frame-rows of tokens) applies
// unchanged; the text is whole on every rank (cross-attention). Image-to-video does not run under
// PipeFusion yet (its patches carry only the latents, not the condition channels).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/image/clip_image_processor.h"
#include "models/registry.h"

namespace xfuser::models {
class Component;
namespace tokenizers {
class Tokenizer;
}
}  // namespace xfuser::models

namespace xfuser::models::wan {

class WanTransformer3DModel;
class AutoencoderKLWan;

class WanModel : public dit::DiTPipeline {
 public:
  explicit WanModel(const ModelSpec& spec);
  ~WanModel() override;
  int64_t transformer_parameter_bytes() const override;  // both experts of Wan 2.2 A14B

  WanTransformer3DModel& transformer() { return *wan_transformer_; }
  // 2 ** sum(temperal_downsample) and 2 ** len(temperal_downsample) (after load).
  int64_t vae_scale_temporal() const { return vae_scale_temporal_; }
  int64_t vae_scale_spatial() const { return vae_scale_spatial_; }

  // The UMT5 prompt embeddings [B, max_sequence_length, text_dim] of `prompts` as
  // WanPipeline._get_t5_prompt_embeds (cleaned, masked, zero past each prompt's length), in the
  // transformer's dtype.
  at::Tensor embed_prompts(const std::vector<std::string>& prompts, int max_sequence_length) const;

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;

 private:
  struct WanState;
  // Latent tokens (patchify layout) back to latents [B, C, f, h, w].
  at::Tensor tokens_to_latents(const WanState& s) const;
  // Image-to-video: the CLIP image context [1, 257, d] and the condition tokens of `image`.
  at::Tensor encode_image(const at::Tensor& image) const;
  at::Tensor condition_tokens(const WanState& s, const at::Tensor& image) const;

  c10::ScalarType dtype_ = c10::kFloat;
  WanTransformer3DModel* wan_transformer_ = nullptr;  // transformer_ (DiTPipeline), typed
  std::shared_ptr<Component> text_encoder_;           // UMT5EncoderModel
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_;
  std::shared_ptr<AutoencoderKLWan> wan_vae_;
  // Image-to-video (WanImageToVideoPipeline): the first frame as a VAE-encoded condition; with
  // Wan 2.1 also as CLIP image context (the folder has an image_encoder: clip_).
  bool i2v_ = false;
  bool clip_ = false;
  // Wan 2.2 A14B: transformer (high noise) and transformer_2 (low noise) with their typed views,
  // switched at boundary_ratio * num_train_timesteps; one expert otherwise.
  bool two_experts_ = false;
  std::optional<double> boundary_ratio_;
  std::vector<std::pair<std::shared_ptr<dit::DiTTransformer>, WanTransformer3DModel*>> experts_;
  std::shared_ptr<Component> image_encoder_;
  image::ClipImageProcessorConfig image_processor_;
  std::filesystem::path scheduler_config_;
  int64_t vae_scale_temporal_ = 4, vae_scale_spatial_ = 8;
};

// ModelSpec::check_run: the generic DiT check with Wan's video tokens (latent frames x rows x
// columns), UMT5 text length, CFG rule (guidance_scale > 1) and frame count (4k + 1).
MemoryEstimate check_wan_run(const std::filesystem::path& pipeline_dir, const RunLayout& run);

// The registry entries of this family: Wan2.1-T2V, Wan2.1-I2V and the embedded tiny-wan and
// tiny-wan-i2v.
std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::wan
