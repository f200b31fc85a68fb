// HunyuanVideo15Pipeline and HunyuanVideo15ImageToVideoPipeline (HunyuanVideo-1.5 text and image
// to video) on the DiT pipeline base, with diffusers 0.36.0 semantics
// (pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5{,_image2video}.py):
//   - two prompt encodings (hunyuan_video15_prompt.h): Qwen2.5-VL's hidden_states[-3] of the
//     chat-templated prompt (tokenizer_max_length 1000 + the 108-token crop) with its mask, and
//     ByT5 embeddings of the prompt's quoted texts (zeros and a zero mask without quotes);
//   - classifier-free guidance from the folder's guider (ClassifierFreeGuidance:
//     guidance_scale, which --guidance_scale overrides; use_original_formulation; the start /
//     stop step range; enabled): both branches whenever guidance is on (the negative prompt, or
//     "" without one), noise = uncond + scale (cond - uncond); guidance_rescale > 0 is refused;
//   - latents [B, C, (F-1)/4+1, H/16, W/16] (float32 noise in the transformer dtype), the
//     model input [latents | zeros (the image condition) | zero mask] on the channels, zero
//     image embeddings [B, 729, image_embed_dim];
//   - FlowMatchEuler with sigmas linspace(1, 0, n + 1)[:-1] and the folder's shift; timestep t
//     in the latents' dtype;
//   - image to video (one --input_images picture): the output size defaults to the folder's
//     aspect-ratio bucket (calculate_default_height_width with the transformer's target_size);
//     the picture is resized to cover that size and center-cropped (Pillow-exact Lanczos), its
//     SigLIP last_hidden_state (the folder's image_encoder / feature_extractor) is the image
//     embedding, its VAE latent (the posterior's mode x scaling_factor) conditions frame 0 with
//     a mask of ones there; meanflow models take timestep_r (the next timestep, 0 at the end);
//   - decode: latents / scaling_factor, the VAE decode (tiled with --enable_tiling), video
//     postprocess ((x / 2 + 0.5).clamp(0, 1) x 255 rounded) -> uint8 [B, F, H, W, 3].
// The transformer runs through the generic drivers: Ulysses, ring, USP, tensor, CFG, data
// parallel and PipeFusion (which takes no text key mask: one prompt per branch, e.g. with
// --use_cfg_parallel; see the transformer's header).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/hunyuan_video15/hunyuan_video15_prompt.h"
#include "models/image/clip_image_processor.h"
#include "models/registry.h"

namespace xfuser::models {
namespace image {
class SiglipVisionModel;
}
namespace tokenizers {
class Tokenizer;
}
namespace text_encoders {
class LlamaEncoder;
class T5Encoder;
}  // namespace text_encoders
}  // namespace xfuser::models

namespace xfuser::models::hunyuan_video15 {

class HunyuanVideo15Transformer3DModel;
class AutoencoderKLHunyuanVideo15;

// HunyuanVideo15ImageProcessor.calculate_default_height_width: the (height, width) of the
// aspect-ratio bucket (generate_crop_size_list(target_size, multiple)) closest to height / width
// on the side of its orientation.
std::pair<int64_t, int64_t> default_height_width(int64_t height, int64_t width, int64_t target_size,
                                                 int64_t multiple = 16);
// VaeImageProcessor.resize(resize_mode="crop"): uint8 [H, W, 3] resized (Lanczos) to cover
// height x width, center-cropped.
at::Tensor resize_and_crop(const at::Tensor& picture, int64_t height, int64_t width);

// The folder's guider/guider_config.json (diffusers' ClassifierFreeGuidance).
struct GuiderConfig {
  double guidance_scale = 7.5;
  double guidance_rescale = 0.0;
  bool use_original_formulation = false;
  double start = 0.0, stop = 1.0;
  bool enabled = true;
  static GuiderConfig from_file(const std::filesystem::path& path);
  // _is_cfg_enabled at step `index` of `steps` (start / stop, and a scale that is 1, or 0 with
  // the original formulation, disables it) with `scale` as the guidance scale.
  bool cfg_enabled(double scale, int index, int steps) const;
};

class HunyuanVideo15Model : public dit::DiTPipeline {
 public:
  explicit HunyuanVideo15Model(const ModelSpec& spec);
  ~HunyuanVideo15Model() override;

  // Both encodings of `prompts` in the transformer's dtype (masks as 0 / 1 in that dtype too).
  struct Embeds {
    PromptEmbeds mllm, byt5;
  };
  Embeds embed_prompts(const std::vector<std::string>& prompts, int max_sequence_length) const;
  const GuiderConfig& guider() const { return guider_; }

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;

 private:
  struct HV15State;

  c10::ScalarType dtype_ = c10::kFloat;
  HunyuanVideo15Transformer3DModel* hv_transformer_ = nullptr;  // transformer_, typed
  std::shared_ptr<text_encoders::LlamaEncoder> text_encoder_;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_;
  std::shared_ptr<text_encoders::T5Encoder> text_encoder_2_;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_2_;
  std::shared_ptr<AutoencoderKLHunyuanVideo15> hv_vae_;
  std::filesystem::path scheduler_config_;
  GuiderConfig guider_;
  int64_t vae_scale_temporal_ = 4, vae_scale_spatial_ = 16;
  // Image to video: SigLIP and its processor.
  bool i2v_ = false;
  std::shared_ptr<image::SiglipVisionModel> image_encoder_;
  image::ClipImageProcessorConfig feature_extractor_;
};

MemoryEstimate check_hunyuan_video15_run(const std::filesystem::path& pipeline_dir,
                                         const RunLayout& run);

std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::hunyuan_video15
