// FluxPipeline (FLUX.1-dev and the embedded tiny-flux) on the xFuserModel base, with diffusers
// v0.33.1 FluxPipeline semantics (../shared/reference/model-architectures.md section 1):
// CLIP pooled + T5 text embeddings, seeded noise packed 2x2 into tokens, img/txt ids, sigmas
// linspace(1, 1/n, n) with the dynamic shift mu from the image token count, distilled guidance
// embedding, optional true CFG, unpack, VAE decode with FLUX's scaling/shift factors.
//
// FluxKontextPipeline (FLUX.1-Kontext-dev, diffusers 0.35.2) is the same class with a reference
// picture (one --input_images, shared by every prompt): resized with PIL's Lanczos to the
// preferred Kontext resolution nearest its aspect ratio (auto-resize: ~1 MP, multiples of 16),
// x / 255 * 2 - 1, VAE-encoded (the posterior mean, then (z - shift_factor) * scaling_factor),
// packed into tokens whose ids are (1, row, col), appended to the generated tokens at every step
// (ids likewise) and dropped from the transformer's output. The output is --height x --width
// (FluxKontextPipeline called with max_area = height * width; the runner's default follows the
// picture's aspect ratio at 1 MP). The dynamic shift counts the generated tokens only.
// Sequence parallel shards the reference tokens with the generated ones; PipeFusion sends them
// with every patch of the generated tokens (DiTInputs::reference_tokens).
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "models/dit/dit_pipeline.h"
#include "models/registry.h"
#include "models/xfuser_model.h"

namespace xfuser::models {
class Component;
namespace tokenizers {
class Tokenizer;
}
namespace schedulers {
class FlowMatchEulerDiscreteScheduler;
}
namespace vae {
class AutoencoderKL;
}
}  // namespace xfuser::models

namespace xfuser::models::flux {

class FluxTransformer2DModel;
struct FluxInputs;

class FluxModel : public dit::DiTPipeline {
 public:
  explicit FluxModel(const ModelSpec& spec);
  ~FluxModel() override;

  FluxTransformer2DModel& transformer() { return *flux_transformer_; }

  // Packing as diffusers' FluxPipeline: [B, C, h, w] -> [B, (h/2)(w/2), 4C] and back.
  static at::Tensor pack_latents(const at::Tensor& latents);
  static at::Tensor unpack_latents(const at::Tensor& packed, int64_t latent_h, int64_t latent_w);
  // [(h/2)(w/2), 3] float ids (0, row, col), row-major.
  static at::Tensor latent_image_ids(int64_t half_h, int64_t half_w,
                                     const at::TensorOptions& options);
  // FluxKontextPipeline's auto-resize: the (height, width) of PREFERRED_KONTEXT_RESOLUTIONS
  // nearest the picture's aspect ratio (its sides first rounded down to multiples of 16).
  static std::pair<int64_t, int64_t> kontext_resolution(int64_t height, int64_t width);
  // The output size FluxKontextPipeline gives a height x width request with max_area: the aspect
  // ratio kept, the area max_area, sides rounded down to multiples of 16.
  static std::pair<int64_t, int64_t> kontext_output_size(int64_t height, int64_t width,
                                                         double max_area);

 protected:
  void load_components(const std::filesystem::path& dir, const ModelLoadOptions& options) override;
  std::unique_ptr<State> begin(const GenerationRequest& request) override;
  void encode_prompt(State& state) override;
  void prepare_latents(State& state) override;
  int num_steps(const State& state) const override;
  void denoise_step(State& state, int index) override;
  void decode(State& state) override;
  // TeaCache4FLUX's fit, or for Kontext ComfyUI-TeaCache's.
  dit::TeaCacheModel published_teacache() const override {
    return kontext_ ? dit::flux_kontext_teacache() : dit::flux_teacache();
  }

 private:
  struct FluxState;
  // (T5 last_hidden_state [B, L, 4096], CLIP pooled [B, 768]) for `prompts`.
  std::pair<at::Tensor, at::Tensor> embed_prompts(const std::vector<std::string>& prompts,
                                                  int max_sequence_length) const;

  c10::ScalarType dtype_ = c10::kFloat;
  FluxTransformer2DModel* flux_transformer_ = nullptr;  // transformer_ (DiTPipeline), typed
  std::shared_ptr<Component> text_encoder_;             // CLIPTextModel
  std::shared_ptr<Component> text_encoder_2_;           // T5EncoderModel
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizers::Tokenizer> tokenizer_2_;
  std::filesystem::path scheduler_config_;
  int tokenizer_max_length_ = 77;
  bool kontext_ = false;  // FluxKontextPipeline: a reference picture
};

// The registry entries of this family: FLUX.1-dev, FLUX.1-Kontext-dev and tiny-flux.
std::vector<ModelSpec> model_specs();

}  // namespace xfuser::models::flux
