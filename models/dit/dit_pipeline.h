// DiTPipeline: the part of every diffusion-transformer pipeline that does not depend on the
// family, on the xFuserModel base: loading the transformer for this rank (tensor-parallel
// slices, a PipeFusion stage's blocks), the seeded initial noise (or the user's latents), and
// one denoising step under every parallel layout (sequence parallel, CFG on one rank or over the
// cfg group, PipeFusion). A family implements its text encoding, its token inputs per step, its
// scheduler step and its decoding; the drivers are the same for all.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "models/dit/dit.h"
#include "models/dit/dit_pipefusion.h"
#include "models/dit/step_cache.h"
#include "models/registry.h"
#include "models/xfuser_model.h"

namespace xfuser::models {
namespace tokenizers {
struct Encoding;
}
namespace vae {
class AutoencoderKL;
struct DiagonalGaussian;
}  // namespace vae
}  // namespace xfuser::models

namespace xfuser::models::dit {

class DiTPipeline : public XFuserModel {
 public:
  explicit DiTPipeline(const ModelSpec& spec);
  ~DiTPipeline() override;

  DiTTransformer& dit_transformer() { return *transformer_; }
  int64_t transformer_parameter_bytes() const override;

  // The initial latents of a request in the family's layout `shape` ([B, ...], B = prompts):
  // request.latents when given (shape checked, cast to `options`), else one CPU generator per
  // prompt seeded with its seed, noise drawn in float32 and then cast and moved to `options`, so
  // a seed gives the same noise in every dtype, on every device, at any batch size and under
  // every parallel layout (as diffusers' randn_tensor with a list of generators, in float32).
  static at::Tensor initial_noise(const GenerationRequest& request,
                                  const std::vector<int64_t>& shape,
                                  const at::TensorOptions& options, const std::string& layout);

  // 2 ** (len(vae.block_out_channels) - 1), as diffusers computes it (after load_vae()).
  int vae_scale_factor() const { return vae_scale_factor_; }

 protected:
  // Per-generation state of a DiT pipeline.
  struct DiTState : State {
    at::Tensor tokens;  // the latents as transformer tokens [B, N, C] (updated every step)
    std::unique_ptr<PipeFusion> pipefusion;  // pp > 1
    std::unique_ptr<StepCache> step_cache;   // --cache (created by the first denoise())
  };
  // (noise prediction [B, n, C], latents [B, n, C]) -> the next latents (the scheduler step).
  using StepFn = PipeFusion::StepFn;

  // Loads transformer_ from `dir` for this rank: the whole model, or with pp > 1 the blocks of
  // this rank's PipeFusion stage (--pipefusion_layers, else balanced by parameters), with tp > 1
  // this rank's slices. `expected_class` must match the folder's class.
  void load_transformer(const std::filesystem::path& dir, const ModelLoadOptions& options,
                        const std::string& expected_class);
  // Checks the parallel layout against a request before any compute: --use_cfg_parallel needs
  // `cfg` (true CFG), PipeFusion's patches fit the `token_rows`.
  void check_layout(const GenerationRequest& request, bool cfg, int64_t token_rows) const;
  // With pp > 1 creates state.pipefusion for a token grid of token_rows x token_cols.
  void start_pipefusion(DiTState& state, int64_t token_rows, int64_t token_cols, int steps);
  // One denoising step of state.tokens: the model on `positive` (and on `negative` with
  // classifier-free guidance: neg + scale * (pos - neg), the two branches batched as [neg, pos]
  // when `batched_cfg`, else evaluated one after the other), then `step`. Sequence parallel,
  // CFG parallel and PipeFusion are chosen from the process groups. positive.tokens may be left
  // undefined: state.tokens is used. With --cache every evaluation goes through the step cache
  // (state.step_cache), under the name the transformer was loaded as.
  void denoise(DiTState& state, int index, DiTInputs positive, const DiTInputs* negative,
               double scale, bool batched_cfg, const StepFn& step);

  // TeaCache's published fit for this pipeline's transformer; empty coefficients: none published
  // (--cache teacache then needs --cache_teacache_coefficients and --cache_threshold).
  virtual TeaCacheModel published_teacache() const { return {}; }
  // Fails naming step `index` and the likely cause when state.tokens hold a NaN or an Inf.
  void check_finite(const DiTState& state, int index) const;
  // Loads `dir` (an AutoencoderKL) into vae_ with --enable_tiling / --enable_slicing (which
  // --use_parallel_vae excludes) and sets vae_scale_factor_.
  void load_vae(const std::filesystem::path& dir, const ModelLoadOptions& options);
  // latents [B, C, h, w] -> images uint8 [B, H, W, 3]: latents / scaling_factor + shift_factor,
  // decoded (with --use_parallel_vae in bands over the ranks of this replica, which all hold the
  // same final latents), then diffusers' VaeImageProcessor.postprocess ((x / 2 + 0.5).clamp(0,
  // 1), x 255, rounded).
  at::Tensor decode_latents(const at::Tensor& latents) const;
  // vae_->encode(x) of pictures x [B, 3, H, W] in the VAE's dtype; with --use_parallel_vae in
  // bands of pixel rows over the ranks of this replica (which all hold the same pictures).
  vae::DiagonalGaussian encode_pictures(const at::Tensor& x) const;
  // Token ids [B, S] of tokenizer encodings, on the run's device.
  at::Tensor ids_tensor(const std::vector<tokenizers::Encoding>& encodings) const;

  std::shared_ptr<DiTTransformer> transformer_;
  std::shared_ptr<vae::AutoencoderKL> vae_;
  // The folder name each loaded transformer was loaded from ("transformer", "transformer_2").
  std::map<const DiTTransformer*, std::string> transformer_names_;
  int vae_scale_factor_ = 8;
};

}  // namespace xfuser::models::dit
