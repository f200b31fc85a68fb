// HunyuanVideoPipeline (text-to-video) on the DiT pipeline base, with diffusers v0.33.1 semantics
// (pipeline_hunyuan_video.py):
//   - the Llama prompt: each prompt in the pipeline's default template (the system description of
//     a video, then the user turn), tokenised by the folder's tokenizer (tokenizer.json, Llama 3)
//     at max_sequence_length + crop_start (padding "max_length", truncation, attention mask),
//     encoded by the LlamaModel with that mask; hidden_states[-3] (num_hidden_layers_to_skip 2)
//     and the mask, both cropped by crop_start (the template's tokens before the prompt: its
//     tokenisation minus the "{}" and the closing <|eot_id|>, as diffusers computes it for
//     crop_start None; 95 for Llama 3, the default template's value);
//   - the CLIP prompt: tokenizer_2 at 77 tokens, text_encoder_2's pooler_output;
//   - embedded guidance: guidance_scale x 1000 in the transformer's dtype, one transformer call a
//     step; true CFG (a second call on the negative prompt, neg + true_cfg_scale x (pos - neg))
//     when true_cfg_scale > 1 and negative prompts are given;
//   - latents [B, C, (F - 1) / 4 + 1, H / 8, W / 8] drawn in float32, FlowMatchEulerDiscrete with
//     sigmas linspace(1, 0, n + 1)[:-1] and the folder's shift (--flow_shift overrides it); the
//     timestep t (sigma x 1000) as float32; after each step the latents are in the transformer's
//     dtype, as diffusers' scheduler returns them (held here in float32, the values identical);
//   - decode: latents / scaling_factor, AutoencoderKLHunyuanVideo.decode, then
//     VideoProcessor.postprocess_video: (x / 2 + 0.5).clamp(0, 1) x 255, rounded -> uint8
//     [B, F, H, W, 3].
// Text rows past the last attended one (the padding at max_sequence_length) are dropped before
// the transformer: no query attends them (HunyuanVideoTransformer3DModel's key rule and its token
// refiner's pairwise mask) and the image output does not depend on them, so the result is exact
// and the joint attention runs on the prompt's tokens only (e.g. 20 instead of 256). The two CFG
// branches keep the same rows. When the prompts of a batch count the same tokens no mask is left.
// The transformer runs on tokens (HunyuanVideoTransformer3DModel::patchify): Ulysses, ring, USP
// and tensor parallel, CFG parallel and PipeFusion over frame-rows of tokens are the generic
// drivers', the text whole on every rank (text_whole()); PipeFusion takes no text mask.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/registry.h"

namespace xfuser::models {
class Component;
namespace tokenizers {
class Tokenizer;
}
namespace text_encoders {
class LlamaEncoder;
}
}  // namespace xfuser::models

namespace xfuser::models::hunyuan_video {

class HunyuanVideoTransformer3DModel;
class AutoencoderKLHunyuanVideo;

// diffusers' DEFAULT_PROMPT_TEMPLATE["template"] ("{}" stands for the prompt).
extern const char* const kDefaultPromptTemplate;

class HunyuanVideoModel : public dit::DiTPipeline {
 public:
  explicit HunyuanVideoModel(const ModelSpec& spec);
  ~HunyuanVideoModel() override;

  // The Llama prompt embeddings as _get_llama_prompt_embeds: ([B, max_sequence_length, d] in the
  // transformer's dtype, the attention mask [B, max_sequence_length] int64), after the crop.
  std::pair<at::Tensor, at::Tensor> llama_embeds(const std::vector<std::string>& prompts,
                                                 int max_sequence_length) const;
  // CLIP's pooler_output [B, d2] in the transformer's dtype (_get_clip_prompt_embeds).
  at::Tensor clip_pooled(const std::vector<std::string>& prompts) const;
  // The template's tokens before the prompt (see the file comment).
  int64_t crop_start() const { return crop_start_; }

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;
  // TeaCache4HunyuanVideo's fit.
  dit::TeaCacheModel published_teacache() const override { return dit::hunyuan_video_teacache(); }

 private:
  struct HunyuanState;
  at::Tensor tokens_to_latents(const HunyuanState& s) const;

  c10::ScalarType dtype_ = c10::kFloat;
  HunyuanVideoTransformer3DModel* hv_transformer_ = nullptr;  // transformer_, typed
  std::shared_ptr<text_encoders::LlamaEncoder> text_encoder_;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_;
  std::shared_ptr<Component> text_encoder_2_;  // CLIPTextModel
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_2_;
  std::shared_ptr<AutoencoderKLHunyuanVideo> hv_vae_;
  std::filesystem::path scheduler_config_;
  int64_t crop_start_ = 0;
  int64_t vae_scale_temporal_ = 4, vae_scale_spatial_ = 8;
};

// ModelSpec::check_run: the generic DiT check with HunyuanVideo's video tokens, its text length
// and true-CFG rule and the frame count (4k + 1).
MemoryEstimate check_hunyuan_video_run(const std::filesystem::path& pipeline_dir,
                                       const RunLayout& run);

// The registry entries of this family: HunyuanVideo and the embedded tiny-hunyuan-video.
std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::hunyuan_video
