#include "models/flux/flux_pipeline.h"

#include <cmath>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/flux/flux_checks.h"
#include "models/flux/flux_parallel.h"
#include "models/flux/flux_pipefusion.h"
#include "models/flux/flux_transformer.h"
#include "models/image/pil_resize.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::flux {
namespace fs = std::filesystem;

struct FluxModel::FluxState : DiTState {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  at::Tensor prompt_embeds;           // [B, L, joint_attention_dim]
  at::Tensor pooled_prompt_embeds;    // [B, pooled_projection_dim]
  at::Tensor negative_prompt_embeds;  // defined with true CFG
  at::Tensor negative_pooled_prompt_embeds;
  at::Tensor text_ids;   // [L, 3]
  at::Tensor image_ids;  // [N, 3]
  // DiTState::tokens: the packed latents [B, N, 64]
  at::Tensor guidance;  // [B] float32, or undefined
  // Kontext: the reference picture's packed latents [B, M, 64] and ids [M, 3] (first axis 1).
  at::Tensor reference_tokens;
  at::Tensor reference_ids;
  int64_t latent_h = 0;  // unpacked latent height (2 * (H // 16))
  int64_t latent_w = 0;
  bool do_true_cfg = false;
};

FluxModel::FluxModel(const ModelSpec& spec) : DiTPipeline(spec) {}
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

at::Tensor FluxModel::latent_image_ids(int64_t half_h, int64_t half_w,
                                       const at::TensorOptions& options) {
  const auto f32 = options.dtype(at::kFloat);  // positions in float32, then cast
  at::Tensor ids = at::zeros({half_h, half_w, 3}, f32);
  ids.select(2, 1).add_(at::arange(half_h, f32).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(half_w, f32).unsqueeze(0));
  return ids.reshape({half_h * half_w, 3}).to(options.dtype().toScalarType());
}

std::pair<int64_t, int64_t> FluxModel::kontext_resolution(int64_t height, int64_t width) {
  // PREFERRED_KONTEXT_RESOLUTIONS as (width, height).
  static constexpr int64_t kPreferred[][2] = {
      {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
      {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
      {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672}};
  // image_processor.get_default_height_width: the sides rounded down to multiples of the image
  // processor's vae_scale_factor, which FLUX's pipelines set to twice the VAE's (16).
  const int64_t h = height - height % 16, w = width - width % 16;
  XF_CHECK(h > 0 && w > 0, "--input_images: a ", height, "x", width,
           " picture is too small for FLUX.1-Kontext (at least 16x16 pixels)");
  const double aspect = static_cast<double>(w) / static_cast<double>(h);
  // min((abs(aspect - w / h), w, h)): ties go to the smaller width.
  const int64_t* best = nullptr;
  double best_diff = 0;
  for (const auto& r : kPreferred) {
    const double diff = std::abs(aspect - static_cast<double>(r[0]) / static_cast<double>(r[1]));
    if (!best || diff < best_diff || (diff == best_diff && r[0] < best[0])) {
      best = r;
      best_diff = diff;
    }
  }
  return {best[1] / 16 * 16, best[0] / 16 * 16};
}

std::pair<int64_t, int64_t> FluxModel::kontext_output_size(int64_t height, int64_t width,
                                                           double max_area) {
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  // Python's round(): half to even, as std::nearbyint in the default rounding mode.
  const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(max_area * aspect)));
  const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(max_area / aspect)));
  return {h / 16 * 16, w / 16 * 16};
}

void FluxModel::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  {
    const nlohmann::json index = read_model_index(dir);
    kontext_ = index.value("_class_name", "") == "FluxKontextPipeline";
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

  // This rank's part: tensor-parallel slices, or its PipeFusion stage's blocks.
  load_transformer(dir / "transformer", options, "FluxTransformer2DModel");
  flux_transformer_ = dynamic_cast<FluxTransformer2DModel*>(transformer_.get());
  XF_CHECK(flux_transformer_ != nullptr, (dir / "transformer").string(),
           " did not load as a FluxTransformer2DModel");
  text_encoder_ = load_pipeline_component(dir, "text_encoder", dtype_);
  text_encoder_2_ = load_pipeline_component(dir, "text_encoder_2", dtype_);
  load_vae(dir / "vae", options);
  XF_CHECK(flux_transformer_->config().in_channels % 4 == 0, "FLUX transformer in_channels ",
           flux_transformer_->config().in_channels, " is not a multiple of 4");
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
  if (kontext_) {
    XF_CHECK(request.input_images.size() == 1, spec().id,
             " edits a picture: give it as one --input_images (got ", request.input_images.size(),
             ")");
    const at::Tensor& image = request.input_images[0];
    XF_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == at::kByte,
             "--input_images: the picture must be uint8 [H, W, 3] RGB, got ", image.sizes(), " ",
             image.scalar_type());
  } else {
    XF_CHECK(request.input_images.empty(), spec().id,
             " is text-to-image: it takes no --input_images");
  }
  auto state = std::make_unique<FluxState>();
  state->request = request;
  state->do_true_cfg = request.true_cfg_scale > 1.0 && !request.negative_prompts.empty();
  const auto& groups = process_groups();
  XF_CHECK(!groups || groups->config().cfg() == 1 || state->do_true_cfg,
           "--use_cfg_parallel needs true CFG: give --negative_prompt and --true_cfg_scale > 1 ",
           "(FLUX.1's --guidance_scale is distilled guidance, one forward per step)");
  check_layout(request, state->do_true_cfg, request.height / multiple);
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(
      schedulers::FlowMatchEulerConfig::from_file(scheduler_config_));
  return state;
}

std::pair<at::Tensor, at::Tensor> FluxModel::embed_prompts(const std::vector<std::string>& prompts,
                                                           int max_sequence_length) const {
  // CLIP: pooled output, padded/truncated to 77, no attention mask (as FluxPipeline).
  at::Tensor clip_ids = ids_tensor(tokenizer_->encode(prompts, tokenizer_max_length_));
  at::Tensor pooled = text_encoder_->call("forward", {{"input_ids", clip_ids}}).at("pooler_output");
  // T5: last hidden state at max_sequence_length, no attention mask.
  at::Tensor t5_ids = ids_tensor(tokenizer_2_->encode(prompts, max_sequence_length));
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
  s.text_ids = at::zeros({s.prompt_embeds.size(1), 3},
                         at::TensorOptions().dtype(dtype_).device(load_options().device));
}

void FluxModel::prepare_latents(State& base) {
  auto& s = static_cast<FluxState&>(base);
  const auto& req = s.request;
  const int64_t channels = flux_transformer_->config().in_channels / 4;
  s.latent_h = 2 * (req.height / (vae_scale_factor_ * 2));
  s.latent_w = 2 * (req.width / (vae_scale_factor_ * 2));
  // FluxPipeline's `latents` argument is the packed form [B, (h/2)(w/2), 4C].
  const int64_t tokens = (s.latent_h / 2) * (s.latent_w / 2);
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  const auto options = at::TensorOptions().dtype(dtype_).device(load_options().device);
  if (req.latents.defined()) {
    s.tokens = initial_noise(req, {b, tokens, channels * 4}, options,
                             "FluxPipeline latents: packed [B, (h/2)(w/2), 4C]");
  } else {
    // Seeded noise in the unpacked layout [B, C, h, w], as diffusers draws it, then packed.
    s.tokens = pack_latents(
        initial_noise(req, {b, channels, s.latent_h, s.latent_w}, options, "[B, C, h, w]"));
  }
  s.initial_latents = s.tokens;
  s.image_ids = latent_image_ids(s.latent_h / 2, s.latent_w / 2, options);

  const int64_t n = req.num_inference_steps;
  std::vector<double> sigmas(n);
  for (int64_t i = 0; i < n; ++i) {
    // np.linspace(1.0, 1 / n, n)
    sigmas[i] = n == 1 ? 1.0 : 1.0 + (1.0 / n - 1.0) * static_cast<double>(i) / (n - 1);
  }
  if (kontext_) {
    // The reference picture: auto-resized, VAE-encoded, packed; ids (1, row, col).
    const at::Tensor& picture = req.input_images[0];
    const auto [rh, rw] = kontext_resolution(picture.size(0), picture.size(1));
    const at::Tensor resized = image::pil_resize(picture.cpu(), rw, rh, image::PilFilter::kLanczos);
    at::Tensor x = resized.to(options.device()).to(at::kFloat).div(255.0).mul(2.0).sub(1.0);
    x = x.permute({2, 0, 1}).unsqueeze(0).to(vae_->dtype());  // [1, 3, rh, rw]
    const auto& vc = vae_->config();
    at::Tensor z = encode_pictures(x).mode();  // sample_mode="argmax"
    z = ((z - vc.shift_factor.value_or(0.0)) * vc.scaling_factor).to(dtype_);
    s.reference_tokens = pack_latents(z).repeat({b, 1, 1});
    s.reference_ids = latent_image_ids(z.size(2) / 2, z.size(3) / 2, options);
    s.reference_ids.select(1, 0).fill_(1);
  }
  const double mu = s.scheduler->calculate_shift(s.tokens.size(1));
  s.scheduler->set_timesteps(n, sigmas, mu);
  if (flux_transformer_->config().guidance_embeds) {
    s.guidance = at::full({s.tokens.size(0)}, req.guidance_scale, options.dtype(at::kFloat));
  }
  start_pipefusion(s, s.latent_h / 2, s.latent_w / 2, static_cast<int>(n));
}

int FluxModel::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const FluxState&>(base).scheduler->num_inference_steps());
}

void FluxModel::denoise_step(State& base, int index) {
  auto& s = static_cast<FluxState&>(base);
  const int64_t b = s.tokens.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  // timestep = t.expand(B).to(latents.dtype) / 1000
  FluxInputs in;
  in.encoder_hidden_states = s.prompt_embeds;
  in.pooled_projections = s.pooled_prompt_embeds;
  in.timestep =
      at::full({b}, t, s.tokens.options().dtype(at::kFloat)).to(s.tokens.scalar_type()) / 1000;
  in.img_ids = s.image_ids;
  in.txt_ids = s.text_ids;
  in.guidance = s.guidance;
  if (kontext_) in.img_ids = at::cat({s.image_ids, s.reference_ids}, 0);
  dit::DiTInputs positive = FluxTransformer2DModel::to_dit(in);
  // Kontext: cat([latents, image_latents], dim=1) as the transformer's tokens.
  if (kontext_) {
    positive.tokens = at::cat({s.tokens, s.reference_tokens}, 1);
    positive.reference_tokens = s.reference_tokens.size(1);
  }
  dit::DiTInputs negative = positive;
  if (s.do_true_cfg) {
    negative.text = s.negative_prompt_embeds;
    negative.pooled = s.negative_pooled_prompt_embeds;
  }
  const auto latents_dtype = s.tokens.scalar_type();
  auto step = [&s, index, latents_dtype](const at::Tensor& noise, const at::Tensor& latents,
                                         const dit::TokenRange&) {
    // noise_pred[:, :latents.size(1)]: the reference tokens' outputs are dropped.
    const at::Tensor generated =
        noise.size(1) == latents.size(1) ? noise : noise.narrow(1, 0, latents.size(1));
    return s.scheduler->step(generated, index, latents).to(latents_dtype);
  };
  // True CFG runs the two branches one after the other, as FluxPipeline does.
  denoise(s, index, positive, s.do_true_cfg ? &negative : nullptr, s.request.true_cfg_scale,
          /*batched_cfg=*/false, step);
}

void FluxModel::decode(State& base) {
  auto& s = static_cast<FluxState&>(base);
  s.latents = s.tokens;
  at::Tensor latents = unpack_latents(s.tokens, s.latent_h, s.latent_w);
  s.images = decode_latents(latents);
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
  dev.checked_against = "diffusers 0.33.1 and 0.42.1, transformers 4.44.2 and 5.24.0";
  dev.description = "FLUX.1 [dev], 12B rectified-flow transformer, distilled guidance";
  dev.create = create;
  dev.check_run = check_flux_run;
  dev.component_classes = {{"transformer", {"FluxTransformer2DModel"}}, {"vae", {"AutoencoderKL"}}};

  ModelSpec tiny = dev;
  tiny.id = "tiny-flux";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {256, 256, 4, 3.5, 64, 0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in FLUX.1 architecture with seeded random weights (`xfuser make-tiny`); "
      "noise-like images, for demos and tests";
  // The trained tiny model (examples/tiny_shapes/train.py): the quick start's demo.
  ModelSpec shapes = tiny;
  shapes.id = "tiny-shapes";
  shapes.defaults = {96, 96, 16, 3.5, 56, 0};
  shapes.description =
      "Built-in FLUX.1 architecture trained to draw the shapes a caption asks for (\"a big red "
      "circle in the top left corner and two small blue triangles on yellow\"; "
      "examples/tiny_shapes); 96x96 in about a second";
  ModelSpec kontext = dev;
  kontext.id = "FLUX.1-Kontext-dev";
  kontext.aliases = {"black-forest-labs/FLUX.1-Kontext-dev", "FLUX.1-Kontext"};
  kontext.hf_repo = "black-forest-labs/FLUX.1-Kontext-dev";
  kontext.task = Task::kImageToImage;
  // xDiT's runner: 1024x1024 (the area; the aspect ratio follows the picture unless --height and
  // --width are given), 50 steps, guidance 2.5, max_sequence_length 256.
  kontext.defaults = {1024, 1024, 50, 2.5, 256, 0};
  kontext.options.insert("--input_images");
  kontext.maturity = "experimental";
  kontext.checked_against = "diffusers 0.35.2 and 0.42.1, transformers 4.44.2 and 5.24.0";
  kontext.description =
      "FLUX.1 Kontext [dev]: image editing; the picture's VAE tokens (ids on their own first "
      "axis) join the generated ones in attention";
  return {dev, kontext, tiny, shapes};
}

}  // namespace xfuser::models::flux
