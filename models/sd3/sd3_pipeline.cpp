#include "models/sd3/sd3_pipeline.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/dit/dit_checks.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/sd3/sd3_transformer.h"
#include "models/sd3/tiny_sd3.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::sd3 {
namespace fs = std::filesystem;

struct SD3Model::SD3State : DiTState {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  at::Tensor prompt_embeds;           // [B, 77 + L, joint_attention_dim]
  at::Tensor pooled_prompt_embeds;    // [B, pooled_projection_dim]
  at::Tensor negative_prompt_embeds;  // defined with CFG
  at::Tensor negative_pooled_prompt_embeds;
  at::Tensor token_ids;  // [N, 2] position-table ids of the latent tokens
  int64_t latent_h = 0, latent_w = 0;
  bool do_cfg = false;
};

SD3Model::SD3Model(const ModelSpec& spec) : DiTPipeline(spec) {}
SD3Model::~SD3Model() = default;

namespace {

bool listed(const nlohmann::json& index, const char* name) {
  // model_index.json lists an absent component as [null, null].
  auto it = index.find(name);
  return it != index.end() && it->is_array() && !it->empty() && !(*it)[0].is_null();
}

}  // namespace

void SD3Model::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  for (const char* name : {"scheduler", "text_encoder", "text_encoder_2", "tokenizer",
                           "tokenizer_2", "transformer", "vae"}) {
    XF_CHECK(listed(index, name), index_path, " lists no '", name,
             "' component; an SD3 pipeline needs scheduler, text_encoder, text_encoder_2, "
             "tokenizer, tokenizer_2, transformer and vae (text_encoder_3 / tokenizer_3 are "
             "optional)");
    XF_CHECK(fs::is_directory(dir / name), "SD3 pipeline folder ", dir.string(), " has no ", name,
             "/ folder (listed in model_index.json)");
  }
  const bool t5 = listed(index, "text_encoder_3");
  zeros_for_max_sequence_length_ = !saved_before_diffusers(index, 0, 36);
  XF_CHECK(t5 == listed(index, "tokenizer_3"), index_path,
           ": text_encoder_3 and tokenizer_3 must be given together (or both null)");
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  schedulers::FlowMatchEulerConfig::from_file(scheduler_config_);  // fail before any compute

  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer");
  tokenizer_2_ = tokenizers::load_tokenizer(dir / "tokenizer_2");
  if (t5) tokenizer_3_ = tokenizers::load_tokenizer(dir / "tokenizer_3");

  load_transformer(dir / "transformer", options, "SD3Transformer2DModel");
  sd3_transformer_ = dynamic_cast<SD3Transformer2DModel*>(transformer_.get());
  XF_CHECK(sd3_transformer_ != nullptr, (dir / "transformer").string(),
           " did not load as an SD3Transformer2DModel");
  text_encoder_ = load_pipeline_component(dir, "text_encoder", dtype_);
  text_encoder_2_ = load_pipeline_component(dir, "text_encoder_2", dtype_);
  for (const auto* enc : {&text_encoder_, &text_encoder_2_}) {
    XF_CHECK((*enc)->class_name() == "CLIPTextModelWithProjection", dir.string(),
             ": SD3's text_encoder and text_encoder_2 must be CLIPTextModelWithProjection, got ",
             (*enc)->class_name());
  }
  if (t5) text_encoder_3_ = load_pipeline_component(dir, "text_encoder_3", dtype_);
  load_vae(dir / "vae", options);
  const auto& c = sd3_transformer_->config();
  XF_CHECK(c.pos_embed_max_size.has_value(), (dir / "transformer").string(),
           ": SD3 pipelines need pos_embed_max_size (the cropped position table)");
  XF_CHECK(vae_->config().latent_channels == c.in_channels, dir.string(), ": the VAE has ",
           vae_->config().latent_channels, " latent channels, the transformer takes ",
           c.in_channels);
}

std::unique_ptr<XFuserModel::State> SD3Model::begin(const GenerationRequest& request) {
  const auto& c = sd3_transformer_->config();
  const int multiple = vae_scale_factor_ * static_cast<int>(c.patch_size);
  XF_CHECK(request.height > 0 && request.height % multiple == 0, "--height ", request.height,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.width > 0 && request.width % multiple == 0, "--width ", request.width,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.height / multiple <= c.max_grid() && request.width / multiple <= c.max_grid(),
           "--height ", request.height, " x --width ", request.width, " is ",
           request.height / multiple, "x", request.width / multiple,
           " patches; the transformer's position table holds at most ", c.max_grid(), "x",
           c.max_grid(), " (", c.max_grid() * multiple, " pixels a side)");
  XF_CHECK(request.num_inference_steps >= 1, "--num_inference_steps must be >= 1 (got ",
           request.num_inference_steps, ")");
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= 512,
           "--max_sequence_length must be in [1, 512] for ", spec().id, " (got ",
           request.max_sequence_length, ")");
  auto state = std::make_unique<SD3State>();
  state->request = request;
  // StableDiffusion3Pipeline.do_classifier_free_guidance: guidance_scale > 1.
  state->do_cfg = request.guidance_scale > 1.0;
  check_layout(request, state->do_cfg, request.height / multiple);
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(
      schedulers::FlowMatchEulerConfig::from_file(scheduler_config_));
  return state;
}

std::pair<at::Tensor, at::Tensor> SD3Model::clip_embeds(
    const tokenizers::Tokenizer& tokenizer, Component& encoder,
    const std::vector<std::string>& prompts) const {
  // padding="max_length", max_length=77, truncation; no attention mask; hidden_states[-2].
  at::Tensor ids = ids_tensor(tokenizer.encode(prompts, tokenizer_max_length_));
  auto out = encoder.call("forward", {{"input_ids", ids}});
  return {out.at("hidden_states_penultimate"), out.at("text_embeds")};
}

std::pair<at::Tensor, at::Tensor> SD3Model::embed_prompts(const std::vector<std::string>& prompts,
                                                          int max_sequence_length) const {
  auto [clip_l, pooled_l] = clip_embeds(*tokenizer_, *text_encoder_, prompts);
  auto [clip_g, pooled_g] = clip_embeds(*tokenizer_2_, *text_encoder_2_, prompts);
  const int64_t b = static_cast<int64_t>(prompts.size());
  const int64_t joint = sd3_transformer_->config().joint_attention_dim;
  at::Tensor t5;
  if (text_encoder_3_) {
    at::Tensor ids = ids_tensor(tokenizer_3_->encode(prompts, max_sequence_length));
    t5 = text_encoder_3_->call("forward", {{"input_ids", ids}}).at("last_hidden_state");
  } else {
    // Without T5 the pipeline uses zeros [B, L, joint_attention_dim]: L = max_sequence_length
    // since diffusers 0.36, tokenizer_max_length (77) before; the folder's release decides.
    const int64_t length =
        zeros_for_max_sequence_length_ ? max_sequence_length : tokenizer_max_length_;
    t5 = at::zeros({b, length, joint}, clip_l.options());
  }
  at::Tensor clip = at::cat({clip_l, clip_g}, -1);  // [B, 77, 768 + 1280]
  XF_CHECK(clip.size(-1) <= t5.size(-1), "the CLIP hidden sizes ", clip_l.size(-1), " + ",
           clip_g.size(-1), " exceed the T5 width ", t5.size(-1));
  clip = at::constant_pad_nd(clip, {0, t5.size(-1) - clip.size(-1)});
  at::Tensor embeds = at::cat({clip.to(t5.scalar_type()), t5}, -2);  // [B, 77 + L, D]
  at::Tensor pooled = at::cat({pooled_l, pooled_g}, -1);             // [B, P]
  return {embeds.to(dtype_), pooled.to(dtype_)};
}

void SD3Model::encode_prompt(State& base) {
  auto& s = static_cast<SD3State&>(base);
  const int msl = s.request.max_sequence_length;
  std::tie(s.prompt_embeds, s.pooled_prompt_embeds) = embed_prompts(s.request.prompts, msl);
  if (s.do_cfg) {
    // negative_prompt or "" for every prompt.
    std::vector<std::string> negatives = s.request.negative_prompts;
    if (negatives.empty()) negatives.assign(s.request.prompts.size(), "");
    std::tie(s.negative_prompt_embeds, s.negative_pooled_prompt_embeds) =
        embed_prompts(negatives, msl);
  }
}

void SD3Model::prepare_latents(State& base) {
  auto& s = static_cast<SD3State&>(base);
  const auto& req = s.request;
  const auto& c = sd3_transformer_->config();
  s.latent_h = req.height / vae_scale_factor_;
  s.latent_w = req.width / vae_scale_factor_;
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  const auto options = s.prompt_embeds.options();
  // StableDiffusion3Pipeline's `latents` argument: [B, in_channels, H/8, W/8].
  s.initial_latents = initial_noise(req, {b, c.in_channels, s.latent_h, s.latent_w}, options,
                                    "StableDiffusion3Pipeline latents: [B, C, H/8, W/8]");
  s.tokens = SD3Transformer2DModel::patchify(s.initial_latents, c.patch_size);
  const int64_t grid_h = s.latent_h / c.patch_size, grid_w = s.latent_w / c.patch_size;
  s.token_ids =
      SD3Transformer2DModel::token_ids(grid_h, grid_w, c.max_grid(), options.dtype(at::kFloat));

  const int64_t n = req.num_inference_steps;
  std::optional<double> mu;
  if (s.scheduler->config().use_dynamic_shifting) {
    mu = s.scheduler->calculate_shift(grid_h * grid_w);
  }
  s.scheduler->set_timesteps(n, std::nullopt, mu);
  start_pipefusion(s, grid_h, grid_w, static_cast<int>(n));
}

int SD3Model::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const SD3State&>(base).scheduler->num_inference_steps());
}

void SD3Model::denoise_step(State& base, int index) {
  auto& s = static_cast<SD3State&>(base);
  const int64_t b = s.tokens.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  dit::DiTInputs positive;
  positive.token_ids = s.token_ids;
  positive.text = s.prompt_embeds;
  positive.pooled = s.pooled_prompt_embeds;
  positive.timestep = at::full({b}, t, s.tokens.options().dtype(at::kFloat));  // t.expand(B)
  dit::DiTInputs negative = positive;
  if (s.do_cfg) {
    negative.text = s.negative_prompt_embeds;
    negative.pooled = s.negative_pooled_prompt_embeds;
  }
  // The model's output tokens hold each patch as (y, x, c), the latent tokens as (c, y, x)
  // (SD3Transformer2DModel::patchify / unpatchify): reorder the noise before the (element-wise)
  // scheduler step.
  const int64_t p = sd3_transformer_->config().patch_size;
  const int64_t out_c = sd3_transformer_->config().resolved_out_channels();
  const auto latents_dtype = s.tokens.scalar_type();
  auto step = [&s, index, p, out_c, latents_dtype](
                  const at::Tensor& noise, const at::Tensor& latents, const dit::TokenRange&) {
    const int64_t bb = noise.size(0), n = noise.size(1);
    at::Tensor ordered = noise.reshape({bb, n, p, p, out_c})
                             .permute({0, 1, 4, 2, 3})
                             .reshape({bb, n, out_c * p * p});
    return s.scheduler->step(ordered, index, latents).to(latents_dtype);
  };
  // diffusers batches the two branches as [negative, positive].
  denoise(s, index, positive, s.do_cfg ? &negative : nullptr, s.request.guidance_scale,
          /*batched_cfg=*/true, step);
}

void SD3Model::decode(State& base) {
  auto& s = static_cast<SD3State&>(base);
  const auto& c = sd3_transformer_->config();
  const int64_t p = c.patch_size;
  // The latent tokens back to [B, C, h, w] (the inverse of patchify).
  const int64_t b = s.tokens.size(0);
  at::Tensor latents = s.tokens.reshape({b, s.latent_h / p, s.latent_w / p, c.in_channels, p, p})
                           .permute({0, 3, 1, 4, 2, 5})
                           .reshape({b, c.in_channels, s.latent_h, s.latent_w});
  s.latents = latents;
  s.images = decode_latents(latents);
}

MemoryEstimate check_sd3_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder transformer = open_component_config((dir / "transformer").string());
  const SD3Config config = SD3Config::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const auto vae = vae::AutoencoderKLConfig::from_json(vae_folder.config, vae_folder.config_path);
  const nlohmann::json index = read_model_index(dir);
  dit::DiTRunTraits t;
  t.family = "SD3";
  t.pixels_per_token = (int64_t{1} << (vae.block_out_channels.size() - 1)) * config.patch_size;
  t.text_tokens = 77 + run.max_sequence_length;  // CLIP's 77, then T5's
  t.cfg = run.guidance_scale > 1.0;
  t.cfg_parallel_needs =
      "classifier-free guidance, which SD3 runs when --guidance_scale > 1 (got " +
      std::to_string(run.guidance_scale) + ")";
  t.max_grid = config.max_grid();
  t.components = {"text_encoder", "text_encoder_2", "vae"};
  t.encoders = {{"text_encoder", 77}, {"text_encoder_2", 77}};
  t.cfg_batched = true;
  if (listed(index, "text_encoder_3")) {
    t.components.push_back("text_encoder_3");
    t.encoders.emplace_back("text_encoder_3", run.max_sequence_length);
  }
  return dit::check_dit_run(dir, run, t);
}

std::vector<ModelSpec> model_specs() {
  auto create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<SD3Model>(spec);
  };
  ModelSpec large;
  large.id = "SD3.5";
  large.aliases = {"stable-diffusion-3.5-large", "stabilityai/stable-diffusion-3.5-large"};
  large.hf_repo = "stabilityai/stable-diffusion-3.5-large";
  large.task = Task::kTextToImage;
  large.defaults = {1024, 1024, 28, 3.5, 256, 0};
  large.options = {"--negative_prompt", "--guidance_scale", "--max_sequence_length",
                   "--enable_tiling", "--enable_slicing"};
  large.parallelism.ulysses = true;
  large.parallelism.ring = true;
  large.parallelism.cfg_parallel = true;
  large.parallelism.data_parallel = true;
  large.parallelism.pipefusion = true;
  large.parallelism.tensor_parallel = true;
  large.parallelism.parallel_vae = true;
  large.maturity = "experimental";
  large.checked_against = "diffusers 0.33.1 and 0.42.1, transformers 4.44.2 and 5.24.0";
  large.description =
      "Stable Diffusion 3.5 Large: MMDiT with QK norms, CLIP-L + CLIP-G + T5-XXL, true CFG";
  large.create = create;
  large.check_run = check_sd3_run;
  large.component_classes = {{"transformer", {"SD3Transformer2DModel"}},
                             {"vae", {"AutoencoderKL"}}};
  large.pipeline_classes = {"StableDiffusion3Pipeline"};

  ModelSpec medium = large;
  medium.id = "SD3.5-medium";
  medium.aliases = {"stable-diffusion-3.5-medium", "stabilityai/stable-diffusion-3.5-medium"};
  medium.hf_repo = "stabilityai/stable-diffusion-3.5-medium";
  medium.description = "Stable Diffusion 3.5 Medium: MMDiT-X (dual-attention layers), true CFG";
  medium.pipeline_classes = {};

  ModelSpec sd3 = medium;
  sd3.id = "SD3-medium";
  sd3.aliases = {"stable-diffusion-3-medium", "stabilityai/stable-diffusion-3-medium-diffusers"};
  sd3.hf_repo = "stabilityai/stable-diffusion-3-medium-diffusers";
  sd3.description = "Stable Diffusion 3 Medium: MMDiT, CLIP-L + CLIP-G + T5-XXL, true CFG";

  ModelSpec tiny = large;
  tiny.id = "tiny-sd3";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {64, 64, 4, 3.5, 32, 0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in SD3.5 architecture (dual attention, QK norms) with seeded random weights "
      "(`xfuser make-tiny --arch sd3`); noise-like images, for tests";
  tiny.pipeline_classes = {};
  tiny.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-sd3-v1-seed0",
                                  [](const fs::path& dir) { write_tiny_sd3(dir, 0); });
  };
  return {large, medium, sd3, tiny};
}

}  // namespace xfuser::models::sd3
