#include "models/dit/dit_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/patch_parallel.h"
#include "models/vae/pixels.h"
#include "models/weights/component_folder.h"
#include "parallel/process_groups.h"

namespace xfuser::models::dit {

DiTPipeline::DiTPipeline(const ModelSpec& spec) : XFuserModel(spec) {}
DiTPipeline::~DiTPipeline() = default;

at::Tensor DiTPipeline::initial_noise(const GenerationRequest& request,
                                      const std::vector<int64_t>& shape,
                                      const at::TensorOptions& options, const std::string& layout) {
  XF_CHECK(!shape.empty() && shape[0] == static_cast<int64_t>(request.seeds.size()),
           "initial_noise: shape ", shape_string(shape), " for ", request.seeds.size(), " seeds");
  if (request.latents.defined()) {
    XF_CHECK(request.latents.sizes() == at::IntArrayRef(shape), "--latents holds a tensor of ",
             shape_string(request.latents.sizes()), "; this request needs ", shape_string(shape),
             " (", layout, ")");
    XF_CHECK(at::isFloatingType(request.latents.scalar_type()),
             "--latents must be floating point, got ", request.latents.scalar_type());
    // Always a copy: the denoising loop updates the latents in place (PipeFusion patch by
    // patch), and the caller's tensor must stay the request's initial latents.
    return request.latents.to(options, /*non_blocking=*/false, /*copy=*/true);
  }
  // One CPU generator per prompt, as diffusers' randn_tensor with a list of generators: the
  // noise of prompt i depends only on its seed; drawn in float32 whatever the run's dtype.
  std::vector<int64_t> one = shape;
  one[0] = 1;
  std::vector<at::Tensor> noise;
  for (int64_t seed : request.seeds) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    noise.push_back(at::randn(one, gen, at::TensorOptions().dtype(at::kFloat).device(at::kCPU)));
  }
  return at::cat(noise, 0).to(options);
}

int64_t DiTPipeline::transformer_parameter_bytes() const {
  return transformer_ ? transformer_->parameter_bytes() : 0;
}

void DiTPipeline::load_transformer(const std::filesystem::path& dir,
                                   const ModelLoadOptions& options,
                                   const std::string& expected_class) {
  const auto& groups = process_groups();
  if (groups && groups->config().pp() > 1) {
    XF_CHECK(!options.fsdp,
             "--use_fsdp with --pipefusion_parallel_degree is not supported: a PipeFusion stage "
             "holds only its own blocks already; use Ulysses, ring or CFG parallelism with FSDP");
    XF_CHECK(groups->config().tp() == 1,
             "--pipefusion_parallel_degree with --tensor_parallel_degree is not supported yet (",
             groups->config().to_string(), "): use one of them");
    XF_CONTEXT("loading PipeFusion stage ", groups->coords().pp, " of ", dir.string());
    const auto whole = describe_dit_transformer(dir.string());
    const auto layers =
        pipefusion_stage_layers(*whole, groups->config().pp(), options.pipefusion_layers);
    transformer_ =
        load_dit_transformer(dir.string(), options.dtype, groups.get(),
                             pipefusion_stage_part(layers, groups->coords().pp), expected_class,
                             options.weights_device(), options.transformer_weights, 0, 1,
                             component_lora(dir.filename().string()));
  } else {
    // Under tensor parallelism each rank reads only its slices of the transformer's weights;
    // under FSDP its row chunks.
    const LoadOptions rows = component_load_options(dir.filename().string());
    transformer_ =
        load_dit_transformer(dir.string(), options.dtype, groups.get(), DiTPart{}, expected_class,
                             options.weights_device(), options.transformer_weights, rows.row_part,
                             rows.row_parts, rows.lora);
  }
  register_component(dir.filename().string(), transformer_, transformer_->block_list_prefixes());
  transformer_names_[transformer_.get()] = dir.filename().string();
  const StepCacheConfig& cache = options.cache;
  if (cache.enabled()) {
    XF_CHECK(!groups || groups->config().pp() == 1, "--cache ", cache_method_name(cache.method),
             " with --pipefusion_parallel_degree ", groups ? groups->config().pp() : 1,
             " is not supported: PipeFusion's stages run stale patches of different steps, so a "
             "skip could not be decided for the whole model; use Ulysses, ring, CFG, tensor or "
             "data parallelism with step caching");
    XF_CHECK(cache.method != CacheMethod::kMagCache || cache.calibrate ||
                 !cache.mag_ratios.empty() || !transformer_->published_mag_ratios().empty(),
             "--cache magcache: ", transformer_->class_name(), " (", dir.string(),
             ") has no published magnitude ratios; give --cache_mag_ratios, or run once with "
             "--cache_calibrate to measure them");
    XF_CHECK(cache.method != CacheMethod::kTeaCache ||
                 (!cache.teacache_coefficients.empty() && cache.threshold.has_value()) ||
                 !published_teacache().coefficients.empty(),
             "--cache teacache: ", spec().id, " (", transformer_->class_name(),
             ") has no published TeaCache polynomial; give --cache_teacache_coefficients and "
             "--cache_threshold (fitted for this model), or use fbcache, the same idea on the "
             "first block's output");
  }
}

void DiTPipeline::check_layout(const GenerationRequest& request, bool cfg,
                               int64_t token_rows) const {
  const auto& groups = process_groups();
  if (!groups) return;
  XF_CHECK(groups->config().cfg() == 1 || cfg,
           "--use_cfg_parallel needs classifier-free guidance, which this request does not run "
           "for ",
           spec().id, ": give a --negative_prompt and a guidance scale that enables it");
  if (groups->config().pp() > 1) {
    // Fail before any compute: patches within the latent token rows, warm-up >= 1.
    const int patches =
        request.num_pipeline_patch > 0 ? request.num_pipeline_patch : groups->config().pp();
    pipefusion_patch_rows(token_rows, patches);
    XF_CHECK(patches == 1 || request.pipefusion_warmup_steps >= 1,
             "--pipefusion_warmup_steps must be >= 1 with ", patches,
             " pipeline patches (the warm-up fills the stale K/V buffers)");
  }
}

void DiTPipeline::start_pipefusion(DiTState& state, int64_t token_rows, int64_t token_cols,
                                   int steps) {
  const auto& groups = process_groups();
  if (!groups || groups->config().pp() == 1) return;
  const auto& req = state.request;
  const int patches = req.num_pipeline_patch > 0 ? req.num_pipeline_patch : groups->config().pp();
  state.pipefusion = std::make_unique<PipeFusion>(*transformer_, *groups, token_rows, token_cols,
                                                  patches, req.pipefusion_warmup_steps, steps);
}

void DiTPipeline::denoise(DiTState& s, int index, DiTInputs positive, const DiTInputs* negative,
                          double scale, bool batched_cfg, const StepFn& step) {
  const auto& groups = process_groups();
  const int64_t b = s.tokens.size(0);
  StepCacheUse cache;
  if (load_options().cache.enabled()) {
    if (!s.step_cache) {
      StepCacheConfig config = load_options().cache;
      if (config.mag_ratios.empty()) config.mag_ratios = transformer_->published_mag_ratios();
      if (config.method == CacheMethod::kTeaCache) {
        const TeaCacheModel published = published_teacache();
        if (config.teacache_coefficients.empty()) {
          config.teacache_coefficients = published.coefficients;
        }
        if (!config.threshold) config.threshold = published.threshold;
      }
      s.step_cache =
          std::make_unique<StepCache>(config, num_steps(s), transformer_->dtype(), &s.cache_report);
    }
    cache.cache = s.step_cache.get();
    cache.model_name = transformer_names_.at(transformer_.get());
    cache.step = index;
  }
  if (s.pipefusion) {
    int branches = 1;
    PipeFusion::CombineFn combine = [](const at::Tensor& out) { return out; };
    DiTInputs in = positive;
    if (negative && groups->config().cfg() == 2) {
      // CFG parallel: cfg rank 0 the negative branch; the last stages combine per patch.
      if (groups->coords().cfg == 0) {
        in = *negative;
        // The branches share the tokens (and so the reference tokens, when there are).
        if (!in.tokens.defined()) in.tokens = positive.tokens;
        in.reference_tokens = positive.reference_tokens;
      }
      combine = [&groups, b, scale](const at::Tensor& out) {
        at::Tensor both = groups->cfg().all_gather(out.contiguous(), 0);  // [neg; pos]
        at::Tensor neg = both.narrow(0, 0, b);
        return neg + scale * (both.narrow(0, b, b) - neg);
      };
    } else if (negative) {
      // Both branches in one batch [neg; pos] through the pipeline.
      branches = 2;
      in = concat_branches(*negative, positive);
      combine = [b, scale](const at::Tensor& out) {
        at::Tensor neg = out.narrow(0, 0, b);
        return neg + scale * (out.narrow(0, b, b) - neg);
      };
    }
    s.pipefusion->step(index, in, branches, combine, step, s.tokens);
    check_finite(s, index);
    return;
  }
  if (!positive.tokens.defined()) positive.tokens = s.tokens;
  at::Tensor noise;
  if (negative) {
    DiTInputs neg = *negative;
    if (!neg.tokens.defined()) neg.tokens = positive.tokens;
    noise = guided_noise(*transformer_, positive, neg, scale, groups.get(), batched_cfg, cache);
  } else {
    noise = cached_forward(*transformer_, positive, groups.get(), cache, "cond");
  }
  s.tokens = step(noise, s.tokens, {0, s.tokens.size(1), s.tokens.size(1)});
  check_finite(s, index);
  if (s.step_cache && index + 1 == num_steps(s)) s.step_cache->finish();
}

void DiTPipeline::check_finite(const DiTState& s, int index) const {
  // One reduction per step: a NaN or Inf fails at the step that made it, not as a black image.
  if (at::isfinite(s.tokens).all().item<bool>()) return;
  const int64_t b = s.tokens.size(0);
  const int64_t bad = b - at::isfinite(s.tokens.reshape({b, -1})).all(1).sum().item<int64_t>();
  const auto& r = s.request;
  std::string cause;
  if (r.guidance_scale > 100 || r.true_cfg_scale > 100) {
    cause = "the guidance scale is very large (guidance_scale " + std::to_string(r.guidance_scale) +
            ", true_cfg_scale " + std::to_string(r.true_cfg_scale) + ")";
  } else if (load_options().dtype == at::kHalf) {
    cause = "an overflow in fp16 (try --dtype bf16 or fp32)";
  } else {
    cause = "NaN or Inf in the model's weights, or an overflow in the compute dtype";
  }
  XF_THROW("the latents are not finite (NaN or Inf) after denoising step ", index + 1, " of ",
           num_steps(s), " (", bad, " of ", b,
           " prompt(s) of the batch); the image would be black. ", "Likely cause: ", cause);
}

void DiTPipeline::load_vae(const std::filesystem::path& dir, const ModelLoadOptions& options) {
  auto component =
      load_component(dir.string(), options.dtype, component_load_options(dir.filename().string()));
  register_component(dir.filename().string(), component);
  vae_ = std::dynamic_pointer_cast<vae::AutoencoderKL>(component);
  XF_CHECK(vae_ != nullptr, dir.string(), " holds a ", component->class_name(),
           ", expected AutoencoderKL");
  XF_CHECK(!(options.parallel_vae && options.enable_tiling),
           "--use_parallel_vae and --enable_tiling cannot be combined: the patch-parallel decode "
           "splits the whole latent into bands (use one or the other)");
  vae_->enable_tiling(options.enable_tiling);
  vae_->enable_slicing(options.enable_slicing);
  vae_scale_factor_ = 1 << (vae_->config().block_out_channels.size() - 1);
}

at::Tensor DiTPipeline::decode_latents(const at::Tensor& latents) const {
  const auto& cfg = vae_->config();
  at::Tensor z = (latents / cfg.scaling_factor + cfg.shift_factor.value_or(0.0)).to(vae_->dtype());
  const auto& groups = process_groups();
  at::Tensor image = load_options().parallel_vae && groups
                         ? vae::patch_parallel_decode(*vae_, z, groups->replica())
                         : vae_->decode(z);  // [B, 3, H, W] in [-1, 1]
  return vae::decoded_to_pixels(image);
}

vae::DiagonalGaussian DiTPipeline::encode_pictures(const at::Tensor& x) const {
  const auto& groups = process_groups();
  return load_options().parallel_vae && groups
             ? vae::patch_parallel_encode(*vae_, x, groups->replica())
             : vae_->encode(x);
}

at::Tensor DiTPipeline::ids_tensor(const std::vector<tokenizers::Encoding>& enc) const {
  const int64_t b = static_cast<int64_t>(enc.size());
  const int64_t s = static_cast<int64_t>(enc.front().input_ids.size());
  // Filled on the host, then moved to the run's device.
  at::Tensor ids = at::empty({b, s}, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
  for (int64_t i = 0; i < b; ++i) {
    std::copy(enc[i].input_ids.begin(), enc[i].input_ids.end(), ids[i].data_ptr<int64_t>());
  }
  return ids.to(load_options().device);
}

}  // namespace xfuser::models::dit
