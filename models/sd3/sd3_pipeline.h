// StableDiffusion3Pipeline (SD3, SD3.5) on the DiT pipeline base, with diffusers v0.33.1
// semantics (../shared/reference/model-architectures.md section 2):
//   - prompt embeddings: CLIP-L and CLIP-G (CLIPTextModelWithProjection) penultimate hidden
//     states [B, 77, 768 + 1280] zero-padded to the T5 width and followed by T5's last hidden
//     state at max_sequence_length ([B, 77 + L, 4096]); without text_encoder_3 in the folder the
//     T5 part is zeros [B, 77, joint_attention_dim]; pooled = [CLIP-L text_embeds, CLIP-G
//     text_embeds];
//   - classifier-free guidance when guidance_scale > 1, with the negative prompt ("" when none
//     is given), the branches batched [negative, positive] and combined as
//     uncond + scale * (text - uncond);
//   - latents [B, in_channels, H/8, W/8] seeded per prompt; FlowMatchEulerDiscrete with the
//     folder's shift (dynamic shifting from the token count when the scheduler config asks for
//     it); timestep = t (0..1000) to the transformer;
//   - VAE decode of latents / scaling_factor + shift_factor.
// The transformer runs on tokens: the latents cut into p x p patches (SD3Transformer2DModel::
// patchify) with their position-table ids, so every parallel driver applies unchanged.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/registry.h"

namespace xfuser::models {
class Component;
namespace tokenizers {
class Tokenizer;
}
namespace vae {
class AutoencoderKL;
}
}  // namespace xfuser::models

namespace xfuser::models::sd3 {

class SD3Transformer2DModel;

class SD3Model : public dit::DiTPipeline {
 public:
  explicit SD3Model(const ModelSpec& spec);
  ~SD3Model() override;

  SD3Transformer2DModel& transformer() { return *sd3_transformer_; }

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;

 private:
  struct SD3State;
  // (prompt_embeds [B, 77 + L, D], pooled [B, P]) for `prompts`, as encode_prompt does.
  std::pair<at::Tensor, at::Tensor> embed_prompts(const std::vector<std::string>& prompts,
                                                  int max_sequence_length) const;
  // [B, 77, hidden] penultimate hidden states and [B, proj] text_embeds of one CLIP encoder.
  std::pair<at::Tensor, at::Tensor> clip_embeds(const tokenizers::Tokenizer& tokenizer,
                                                Component& encoder,
                                                const std::vector<std::string>& prompts) const;

  c10::ScalarType dtype_ = c10::kFloat;
  SD3Transformer2DModel* sd3_transformer_ = nullptr;  // transformer_ (DiTPipeline), typed
  std::shared_ptr<Component> text_encoder_;           // CLIPTextModelWithProjection (CLIP-L)
  std::shared_ptr<Component> text_encoder_2_;         // CLIPTextModelWithProjection (CLIP-G)
  std::shared_ptr<Component> text_encoder_3_;         // T5EncoderModel, or null
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_, tokenizer_2_, tokenizer_3_;
  std::filesystem::path scheduler_config_;
  int tokenizer_max_length_ = 77;
  // Without T5: zeros as long as max_sequence_length (model_index.json from diffusers >= 0.36),
  // else tokenizer_max_length.
  bool zeros_for_max_sequence_length_ = true;
};

// ModelSpec::check_run: the generic DiT check with SD3's patch tokens, CLIP + T5 text length,
// CFG rule (guidance_scale > 1) and position-table limit.
MemoryEstimate check_sd3_run(const std::filesystem::path& pipeline_dir, const RunLayout& run);

// The registry entries of this family: SD3.5 (large), SD3.5-medium and SD3-medium.
std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::sd3
