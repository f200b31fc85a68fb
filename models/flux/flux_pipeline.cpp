#include "models/flux/flux_pipeline.h"

#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux/flux_checks.h"
#include "models/flux/flux_parallel.h"
#include "models/flux/flux_pipefusion.h"
#include "models/flux/flux_transformer.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/patch_parallel.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::flux {
namespace fs = std::filesystem;

struct FluxModel::FluxState : State {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  at::Tensor prompt_embeds;           // [B, L, joint_attention_dim]
  at::Tensor pooled_prompt_embeds;    // [B, pooled_projection_dim]
  at::Tensor negative_prompt_embeds;  // defined with true CFG
  at::Tensor negative_pooled_prompt_embeds;
  at::Tensor text_ids;   // [L, 3]
  at::Tensor image_ids;  // [N, 3]
  at::Tensor latents;    // packed [B, N, 64]
  at::Tensor guidance;   // [B] float32, or undefined
  int64_t latent_h = 0;  // unpacked latent height (2 * (H // 16))
  int64_t latent_w = 0;
  bool do_true_cfg = false;
  std::unique_ptr<FluxPipeFusion> pipefusion;  // pp > 1
};

FluxModel::FluxModel(const ModelSpec& spec) : XFuserModel(spec) {}
FluxModel::~FluxModel() = default;

at::Tensor FluxModel::pack_latents(const at::Tensor& latents) {
  // [B, C, h, w] -> view [B, C, h/2, 2, w/2, 2] -> permute (0, 2, 4, 1, 3, 5) -> [B, N, 4C]
  const auto b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  XF_CHECK(h % 2 == 0 && w % 2 == 0, "FLUX latents must have even height and width, got ",
           latents.sizes());
  return latents.view({b, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({b, (h / 2) * (w / 2), c * 4});
}

at::Tensor FluxModel::unpack_latents(const at::Tensor& packed, int64_t latent_h, int64_t latent_w) {
  // [B, N, 4C] -> [B, h/2, w/2, C, 2, 2] -> permute (0, 3, 1, 4, 2, 5) -> [B, C, h, w]
  const auto b = packed.size(0), n = packed.size(1), d = packed.size(2);
  XF_CHECK(n == (latent_h / 2) * (latent_w / 2) && d % 4 == 0, "cannot unpack latents ",
           packed.sizes(), " to a ", latent_h, "x", latent_w, " grid");
  return packed.view({b, latent_h / 2, latent_w / 2, d / 4, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, d / 4, latent_h, latent_w});
}

at::Tensor FluxModel::latent_image_ids(int64_t half_h, int64_t half_w, c10::ScalarType dtype) {
  at::Tensor ids = at::zeros({half_h, half_w, 3});
  ids.select(2, 1).add_(at::arange(half_h, at::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(half_w, at::kFloat).unsqueeze(0));
  return ids.reshape({half_h * half_w, 3}).to(dtype);
}

void FluxModel::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  {
    const nlohmann::json index = read_model_index(dir);
    for (const char* name : {"scheduler", "text_encoder", "text_encoder_2", "tokenizer",
                             "tokenizer_2", "transformer", "vae"}) {
      XF_CHECK(index.contains(name), (dir / "model_index.json").string(), " lists no '", name,
               "' component; a FLUX pipeline needs scheduler, text_encoder, text_encoder_2, "
               "tokenizer, tokenizer_2, transformer and vae");
      XF_CHECK(fs::is_directory(dir / name), "FLUX pipeline folder ", dir.string(), " has no ",
               name, "/ folder (listed in model_index.json)");
    }
  }
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  // Parse now so a bad scheduler config fails before any compute.
  schedulers::FlowMatchEulerConfig::from_file(scheduler_config_);

  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer");
  tokenizer_2_ = tokenizers::load_tokenizer(dir / "tokenizer_2");

  const auto& groups = process_groups();
  if (groups && groups->config().pp() > 1) {
    XF_CHECK(groups->config().tp() == 1,
             "--pipefusion_parallel_degree with --tensor_parallel_degree is not supported yet (",
             groups->config().to_string(), "): use one of them");
    load_pipefusion_stage(dir, options);
  } else {
    // Under tensor parallelism each rank reads only its slices of the transformer's weights.
    transformer_ = load_flux_transformer((dir / "transformer").string(), dtype_, groups.get());
  }
  text_encoder_ = load_component((dir / "text_encoder").string(), dtype_);
  text_encoder_2_ = load_component((dir / "text_encoder_2").string(), dtype_);
  auto vae = load_component((dir / "vae").string(), dtype_);
  vae_ = std::dynamic_pointer_cast<vae::AutoencoderKL>(vae);
  XF_CHECK(vae_ != nullptr, (dir / "vae").string(), " holds a ", vae->class_name(),
           ", expected AutoencoderKL");
  XF_CHECK(!(options.parallel_vae && options.enable_tiling),
           "--use_parallel_vae and --enable_tiling cannot be combined: the patch-parallel decode "
           "splits the whole latent into bands (use one or the other)");
  vae_->enable_tiling(options.enable_tiling);
  vae_->enable_slicing(options.enable_slicing);
  vae_scale_factor_ = 1 << (vae_->config().block_out_channels.size() - 1);
  XF_CHECK(transformer_->config().in_channels % 4 == 0, "FLUX transformer in_channels ",
           transformer_->config().in_channels, " is not a multiple of 4");
}

void FluxModel::load_pipefusion_stage(const fs::path& dir, const ModelLoadOptions& options) {
  const auto& groups = *process_groups();
  ComponentFolder folder = open_component_folder((dir / "transformer").string());
  XF_CONTEXT("loading PipeFusion stage ", groups.coords().pp, " of ", folder.class_name, " from ",
             folder.dir);
  XF_CHECK(folder.class_name == "FluxTransformer2DModel", folder.dir, " holds a ",
           folder.class_name, ", expected FluxTransformer2DModel");
  auto config = FluxConfig::from_json(folder.config, folder.config_path);
  const auto layers =
      pipefusion_stage_layers(config, groups.config().pp(), options.pipefusion_layers);
  transformer_ = std::make_shared<FluxTransformer2DModel>(
      config, pipefusion_stage_part(layers, groups.coords().pp));
  // Only this stage's tensors are read from the (memory-mapped) checkpoint.
  LoadOptions load;
  load.allow_unexpected = true;
  transformer_->load(*folder.weights, dtype_, "", load);
}

std::unique_ptr<XFuserModel::State> FluxModel::begin(const GenerationRequest& request) {
  const int multiple = vae_scale_factor_ * 2;
  XF_CHECK(request.height > 0 && request.height % multiple == 0, "--height ", request.height,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.width > 0 && request.width % multiple == 0, "--width ", request.width,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.num_inference_steps >= 1, "--num_inference_steps must be >= 1 (got ",
           request.num_inference_steps, ")");
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= 512,
           "--max_sequence_length must be in [1, 512] for ", spec().id, " (got ",
           request.max_sequence_length, ")");
  auto state = std::make_unique<FluxState>();
  state->request = request;
  state->do_true_cfg = request.true_cfg_scale > 1.0 && !request.negative_prompts.empty();
  const auto& groups = process_groups();
  XF_CHECK(!groups || groups->config().cfg() == 1 || state->do_true_cfg,
           "--use_cfg_parallel needs true CFG: give --negative_prompt and --true_cfg_scale > 1 ",
           "(FLUX.1's --guidance_scale is distilled guidance, one forward per step)");
  if (groups && groups->config().pp() > 1) {
    // Fail before any compute: patches within the latent token rows, warm-up >= 1.
    const int patches =
        request.num_pipeline_patch > 0 ? request.num_pipeline_patch : groups->config().pp();
    pipefusion_patch_rows(request.height / multiple, patches);
    XF_CHECK(patches == 1 || request.pipefusion_warmup_steps >= 1,
             "--pipefusion_warmup_steps must be >= 1 with ", patches,
             " pipeline patches (the warm-up fills the stale K/V buffers)");
  }
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(
      schedulers::FlowMatchEulerConfig::from_file(scheduler_config_));
  return state;
}

std::pair<at::Tensor, at::Tensor> FluxModel::embed_prompts(const std::vector<std::string>& prompts,
                                                           int max_sequence_length) const {
  auto to_ids = [](const std::vector<tokenizers::Encoding>& enc) {
    const int64_t b = static_cast<int64_t>(enc.size());
    const int64_t s = static_cast<int64_t>(enc.front().input_ids.size());
    at::Tensor ids = at::empty({b, s}, at::kLong);
    for (int64_t i = 0; i < b; ++i) {
      std::copy(enc[i].input_ids.begin(), enc[i].input_ids.end(), ids[i].data_ptr<int64_t>());
    }
    return ids;
  };
  // CLIP: pooled output, padded/truncated to 77, no attention mask (as FluxPipeline).
  at::Tensor clip_ids = to_ids(tokenizer_->encode(prompts, tokenizer_max_length_));
  at::Tensor pooled = text_encoder_->call("forward", {{"input_ids", clip_ids}}).at("pooler_output");
  // T5: last hidden state at max_sequence_length, no attention mask.
  at::Tensor t5_ids = to_ids(tokenizer_2_->encode(prompts, max_sequence_length));
  at::Tensor embeds =
      text_encoder_2_->call("forward", {{"input_ids", t5_ids}}).at("last_hidden_state");
  return {embeds.to(dtype_), pooled.to(dtype_)};
}

void FluxModel::encode_prompt(State& base) {
  auto& s = static_cast<FluxState&>(base);
  std::tie(s.prompt_embeds, s.pooled_prompt_embeds) =
      embed_prompts(s.request.prompts, s.request.max_sequence_length);
  if (s.do_true_cfg) {
    std::tie(s.negative_prompt_embeds, s.negative_pooled_prompt_embeds) =
        embed_prompts(s.request.negative_prompts, s.request.max_sequence_length);
  }
  s.text_ids = at::zeros({s.prompt_embeds.size(1), 3}, at::TensorOptions().dtype(dtype_));
}

void FluxModel::prepare_latents(State& base) {
  auto& s = static_cast<FluxState&>(base);
  const auto& req = s.request;
  const int64_t channels = transformer_->config().in_channels / 4;
  s.latent_h = 2 * (req.height / (vae_scale_factor_ * 2));
  s.latent_w = 2 * (req.width / (vae_scale_factor_ * 2));
  // One CPU generator per prompt, as diffusers' randn_tensor with a list of generators: the
  // noise of prompt i depends only on its seed, on every rank and at any batch size.
  std::vector<at::Tensor> noise;
  for (int64_t seed : req.seeds) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    noise.push_back(
        at::randn({1, channels, s.latent_h, s.latent_w}, gen, at::TensorOptions().dtype(dtype_)));
  }
  s.latents = pack_latents(at::cat(noise, 0));
  s.image_ids = latent_image_ids(s.latent_h / 2, s.latent_w / 2, dtype_);

  const int64_t n = req.num_inference_steps;
  std::vector<double> sigmas(n);
  for (int64_t i = 0; i < n; ++i) {
    // np.linspace(1.0, 1 / n, n)
    sigmas[i] = n == 1 ? 1.0 : 1.0 + (1.0 / n - 1.0) * static_cast<double>(i) / (n - 1);
  }
  const double mu = s.scheduler->calculate_shift(s.latents.size(1));
  s.scheduler->set_timesteps(n, sigmas, mu);
  if (transformer_->config().guidance_embeds) {
    s.guidance = at::full({s.latents.size(0)}, req.guidance_scale, at::kFloat);
  }
  const auto& groups = process_groups();
  if (groups && groups->config().pp() > 1) {
    const int patches = req.num_pipeline_patch > 0 ? req.num_pipeline_patch : groups->config().pp();
    s.pipefusion =
        std::make_unique<FluxPipeFusion>(*transformer_, *groups, s.latent_h / 2, s.latent_w / 2,
                                         patches, req.pipefusion_warmup_steps, n);
  }
}

int FluxModel::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const FluxState&>(base).scheduler->num_inference_steps());
}

at::Tensor FluxModel::transformer_forward(const FluxInputs& full) {
  const auto& groups = process_groups();
  if (!groups) return transformer_->forward(full);
  return sequence_parallel_forward(*transformer_, full, *groups);
}

void FluxModel::pipefusion_step(FluxState& s, int index) {
  const auto& groups = *process_groups();
  const int64_t b = s.latents.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  FluxInputs in;
  in.encoder_hidden_states = s.prompt_embeds;
  in.pooled_projections = s.pooled_prompt_embeds;
  in.img_ids = s.image_ids;
  in.txt_ids = s.text_ids;
  in.guidance = s.guidance;
  int branches = 1;
  FluxPipeFusion::CombineFn combine = [](const at::Tensor& out) { return out; };
  const double scale = s.request.true_cfg_scale;
  if (s.do_true_cfg && groups.config().cfg() == 2) {
    // CFG parallel: cfg rank 0 the negative branch; the last stages combine per patch.
    if (groups.coords().cfg == 0) {
      in.encoder_hidden_states = s.negative_prompt_embeds;
      in.pooled_projections = s.negative_pooled_prompt_embeds;
    }
    combine = [&groups, b, scale](const at::Tensor& out) {
      at::Tensor both = groups.cfg().all_gather(out.contiguous(), 0);  // [neg; pos]
      at::Tensor neg = both.narrow(0, 0, b);
      return neg + scale * (both.narrow(0, b, b) - neg);
    };
  } else if (s.do_true_cfg) {
    // True CFG on one replica: both branches in one batch [neg; pos] through the pipeline.
    branches = 2;
    in.encoder_hidden_states = at::cat({s.negative_prompt_embeds, s.prompt_embeds}, 0);
    in.pooled_projections = at::cat({s.negative_pooled_prompt_embeds, s.pooled_prompt_embeds}, 0);
    if (in.guidance.defined()) in.guidance = in.guidance.repeat({2});
    combine = [b, scale](const at::Tensor& out) {
      at::Tensor neg = out.narrow(0, 0, b);
      return neg + scale * (out.narrow(0, b, b) - neg);
    };
  }
  in.timestep = at::full({branches * b}, t, at::kFloat).to(s.latents.scalar_type()) / 1000;
  const auto latents_dtype = s.latents.scalar_type();
  FluxPipeFusion::StepFn step_fn = [&s, index, latents_dtype](const at::Tensor& noise,
                                                              const at::Tensor& latents) {
    return s.scheduler->step(noise, index, latents).to(latents_dtype);
  };
  s.pipefusion->step(index, in, branches, combine, step_fn, s.latents);
}

void FluxModel::denoise_step(State& base, int index) {
  auto& s = static_cast<FluxState&>(base);
  if (s.pipefusion) {
    pipefusion_step(s, index);
    return;
  }
  const int64_t b = s.latents.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  // timestep = t.expand(B).to(latents.dtype) / 1000
  at::Tensor timestep = at::full({b}, t, at::kFloat).to(s.latents.scalar_type()) / 1000;
  FluxInputs in;
  in.hidden_states = s.latents;
  in.encoder_hidden_states = s.prompt_embeds;
  in.pooled_projections = s.pooled_prompt_embeds;
  in.timestep = timestep;
  in.img_ids = s.image_ids;
  in.txt_ids = s.text_ids;
  in.guidance = s.guidance;
  at::Tensor noise_pred;
  const auto& groups = process_groups();
  if (s.do_true_cfg && groups && groups->config().cfg() == 2) {
    // CFG parallel: cfg rank 0 runs the negative branch, rank 1 the positive one; every rank
    // combines the gathered predictions and steps the scheduler identically.
    if (groups->coords().cfg == 0) {
      in.encoder_hidden_states = s.negative_prompt_embeds;
      in.pooled_projections = s.negative_pooled_prompt_embeds;
    }
    at::Tensor mine = transformer_forward(in).contiguous();
    at::Tensor both = groups->cfg().all_gather(mine, 0);  // [neg; pos]
    at::Tensor neg = both.narrow(0, 0, b);
    at::Tensor pos = both.narrow(0, b, b);
    noise_pred = neg + s.request.true_cfg_scale * (pos - neg);
  } else {
    noise_pred = transformer_forward(in);
    if (s.do_true_cfg) {
      in.encoder_hidden_states = s.negative_prompt_embeds;
      in.pooled_projections = s.negative_pooled_prompt_embeds;
      at::Tensor neg = transformer_forward(in);
      noise_pred = neg + s.request.true_cfg_scale * (noise_pred - neg);
    }
  }
  const auto latents_dtype = s.latents.scalar_type();
  s.latents = s.scheduler->step(noise_pred, index, s.latents).to(latents_dtype);
}

void FluxModel::decode(State& base) {
  auto& s = static_cast<FluxState&>(base);
  s.State::latents = s.latents;
  at::Tensor latents = unpack_latents(s.latents, s.latent_h, s.latent_w);
  const auto& cfg = vae_->config();
  latents = latents / cfg.scaling_factor + cfg.shift_factor.value_or(0.0);
  // [B, 3, H, W] in [-1, 1]; with --use_parallel_vae in bands over the ranks of this replica
  // (every one of them holds the same final latents).
  const auto& groups = process_groups();
  at::Tensor image =
      load_options().parallel_vae && groups
          ? vae::patch_parallel_decode(*vae_, latents.to(vae_->dtype()), groups->replica())
          : vae_->decode(latents.to(vae_->dtype()));
  // diffusers' VaeImageProcessor.postprocess: (x / 2 + 0.5).clamp(0, 1) -> uint8, round.
  at::Tensor x = (image.to(at::kFloat) / 2 + 0.5).clamp(0, 1);
  s.images = (x * 255).round().to(at::kByte).permute({0, 2, 3, 1}).contiguous();
}

std::vector<ModelSpec> model_specs() {
  auto create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<FluxModel>(spec);
  };
  const std::set<std::string> options = {"--negative_prompt", "--true_cfg_scale",
                                         "--guidance_scale",  "--max_sequence_length",
                                         "--enable_tiling",   "--enable_slicing"};
  ModelSpec dev;
  dev.id = "FLUX.1-dev";
  dev.aliases = {"black-forest-labs/FLUX.1-dev"};
  dev.hf_repo = "black-forest-labs/FLUX.1-dev";
  dev.task = Task::kTextToImage;
  dev.defaults = {1024, 1024, 50, 3.5, 512, 0};
  dev.options = options;
  dev.parallelism.ulysses = true;
  dev.parallelism.ring = true;
  dev.parallelism.cfg_parallel = true;
  dev.parallelism.data_parallel = true;
  dev.parallelism.pipefusion = true;
  dev.parallelism.tensor_parallel = true;
  dev.parallelism.parallel_vae = true;
  dev.maturity = "stable";
  dev.description = "FLUX.1 [dev], 12B rectified-flow transformer, distilled guidance";
  dev.create = create;
  dev.check_run = check_flux_run;

  ModelSpec tiny = dev;
  tiny.id = "tiny-flux";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {256, 256, 4, 3.5, 64, 0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in FLUX.1 architecture with seeded random weights (`xfuser make-tiny`); "
      "noise-like images, for demos and tests";
  return {dev, tiny};
}

}  // namespace xfuser::models::flux
