#include "models/wan/wan_pipeline.h"

#include <map>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/common/trained_pipeline.h"
#include "models/dit/dit_checks.h"
#include "models/image/pil_resize.h"
#include "models/schedulers/scheduler_config.h"
#include "models/schedulers/unipc_multistep.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/pixels.h"
#include "models/wan/tiny_wan.h"
#include "models/wan/wan_prompt.h"
#include "models/wan/wan_transformer.h"
#include "models/wan/wan_vae.h"
#include "models/wan/wan_vae_parallel.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::wan {
namespace fs = std::filesystem;

struct WanModel::WanState : DiTState {
  std::unique_ptr<schedulers::UniPCMultistepScheduler> scheduler;
  // PipeFusion after its warm-up: one scheduler per patch (by first token), split from the
  // whole-image scheduler at the first patched step (UniPC keeps a history per element).
  std::map<int64_t, std::unique_ptr<schedulers::UniPCMultistepScheduler>> patch_schedulers;
  at::Tensor prompt_embeds;           // [B, L, text_dim]
  at::Tensor negative_prompt_embeds;  // defined with CFG
  at::Tensor token_ids;               // [N, 3] (f, h, w) of the latent tokens
  at::Tensor image_embeds;            // image-to-video: [B, 257, image_dim]
  at::Tensor condition;               // image-to-video: [B, N, 20 * patch] condition tokens
  int64_t latent_f = 0, latent_h = 0, latent_w = 0;
  bool do_cfg = false;
};

WanModel::WanModel(const ModelSpec& spec) : DiTPipeline(spec) {}
WanModel::~WanModel() = default;

namespace {

bool listed(const nlohmann::json& index, const char* name) {
  auto it = index.find(name);
  return it != index.end() && it->is_array() && !it->empty() && !(*it)[0].is_null();
}

// The folder's UniPC config with --flow_shift applied; checked to be Wan's flow setup.
schedulers::UniPCMultistepConfig scheduler_config(const fs::path& path,
                                                  const std::optional<double>& flow_shift,
                                                  const std::optional<std::string>& flow_sigmas) {
  auto config = schedulers::UniPCMultistepConfig::from_file(path);
  XF_CHECK(config.prediction_type == schedulers::UniPCPrediction::kFlowPrediction &&
               config.use_flow_sigmas,
           path.string(),
           ": Wan's UniPCMultistepScheduler must have prediction_type \"flow_prediction\" and "
           "use_flow_sigmas true");
  if (flow_shift) {
    schedulers::check_flow_shift(*flow_shift, "--flow_shift");
    config.flow_shift = *flow_shift;
  }
  if (flow_sigmas) {
    XF_CHECK(*flow_sigmas == "from_one" || *flow_sigmas == "reference",
             "--flow_sigmas must be from_one or reference (got '", *flow_sigmas, "')");
    config.flow_sigmas = *flow_sigmas == "from_one" ? schedulers::FlowSigmas::kFromOne
                                                    : schedulers::FlowSigmas::kReference;
  }
  return config;
}

struct WanFolder {
  bool i2v = false;          // WanImageToVideoPipeline
  bool clip = false;         // an image_encoder (Wan 2.1 image-to-video)
  bool two_experts = false;  // transformer_2 (Wan 2.2 A14B)
  std::optional<double> boundary_ratio;
};

// model_index.json's layout of a Wan folder, checked: its components, the image-to-video parts,
// Wan 2.2's two experts and boundary_ratio. One reader for the run's load and check_wan_run (so
// `xfuser validate` refuses what the run refuses).
WanFolder read_wan_folder(const fs::path& dir) {
  WanFolder f;
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  for (const char* name : {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"}) {
    XF_CHECK(listed(index, name), index_path, " lists no '", name,
             "' component; a WanPipeline needs scheduler, text_encoder, tokenizer, transformer "
             "and vae");
    XF_CHECK(fs::is_directory(dir / name), "Wan pipeline folder ", dir.string(), " has no ", name,
             "/ folder (listed in model_index.json)");
  }
  f.i2v = index.value("_class_name", "") == "WanImageToVideoPipeline";
  f.clip = listed(index, "image_encoder");
  XF_CHECK(f.clip == listed(index, "image_processor"), index_path,
           ": image_encoder and image_processor must be given together (Wan2.1 image-to-video) "
           "or both be absent");
  XF_CHECK(!f.clip || f.i2v, index_path, ": an image_encoder in a ",
           index.value("_class_name", "?"), " folder (only WanImageToVideoPipeline takes one)");
  // Wan 2.2 A14B: a high-noise expert (transformer) and a low-noise one (transformer_2), switched
  // at boundary_ratio * num_train_timesteps.
  f.two_experts = listed(index, "transformer_2");
  if (f.two_experts) {
    auto it = index.find("boundary_ratio");
    XF_CHECK(it != index.end() && it->is_number() && it->get<double>() > 0 && it->get<double>() < 1,
             index_path,
             " lists a transformer_2 but no boundary_ratio in (0, 1) (the timestep fraction where "
             "the low-noise expert takes over)");
    f.boundary_ratio = it->get<double>();
  } else {
    // diffusers hands the low-noise steps to a transformer_2 that is not there: refused here
    // rather than run with the one expert.
    const auto it = index.find("boundary_ratio");
    XF_CHECK(it == index.end() || it->is_null(), index_path, ": boundary_ratio = ", it->dump(),
             " without a transformer_2 (the low-noise expert it switches to)");
  }
  XF_CHECK(!index.value("expand_timesteps", false), index_path,
           ": expand_timesteps (Wan2.2 TI2V-5B's per-token timesteps) is not supported");
  // The scheduler as the run reads it (a flow_shift out of range, a non-flow setup).
  scheduler_config(dir / "scheduler" / "scheduler_config.json", std::nullopt, std::nullopt);
  return f;
}

}  // namespace

int64_t WanModel::transformer_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& expert : experts_) bytes += expert.first->parameter_bytes();
  return bytes;
}

void WanModel::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  const WanFolder folder = read_wan_folder(dir);
  i2v_ = folder.i2v;
  clip_ = folder.clip;
  two_experts_ = folder.two_experts;
  boundary_ratio_ = folder.boundary_ratio;
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  XF_CHECK(!options.enable_tiling, "--enable_tiling is not supported by the Wan VAE yet");

  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer");
  experts_.clear();
  for (const char* name : {"transformer", "transformer_2"}) {
    if (std::string(name) == "transformer_2" && !two_experts_) break;
    XF_CHECK(fs::is_directory(dir / name), "Wan pipeline folder ", dir.string(), " has no ", name,
             "/ folder (listed in model_index.json)");
    load_transformer(dir / name, options, "WanTransformer3DModel");
    auto* wan = dynamic_cast<WanTransformer3DModel*>(transformer_.get());
    XF_CHECK(wan != nullptr, (dir / name).string(), " did not load as a WanTransformer3DModel");
    const auto& c = wan->config();
    const bool image_attention = c.image_dim.has_value() && c.added_kv_proj_dim.has_value();
    XF_CHECK(image_attention == clip_, (dir / name).string(),
             clip_ ? " has no image cross-attention (image_dim / added_kv_proj_dim), which a "
                     "folder with an image_encoder needs"
                   : " has image cross-attention (image_dim / added_kv_proj_dim set) but the "
                     "folder has no image_encoder");
    if (!experts_.empty()) {
      const auto& first = experts_.front().second->config();
      XF_CHECK(c.in_channels == first.in_channels && c.patch_size == first.patch_size &&
                   c.text_dim == first.text_dim &&
                   c.resolved_out_channels() == first.resolved_out_channels(),
               (dir / name).string(),
               ": the two experts differ in in/out channels, patch size or text width");
    }
    experts_.emplace_back(transformer_, wan);
  }
  transformer_ = experts_.front().first;
  wan_transformer_ = experts_.front().second;
  const auto& c = wan_transformer_->config();
  text_encoder_ = load_pipeline_component(dir, "text_encoder", dtype_);
  XF_CHECK(text_encoder_->class_name() == "UMT5EncoderModel" ||
               text_encoder_->class_name() == "T5EncoderModel",
           (dir / "text_encoder").string(), ": Wan's text encoder must be a UMT5EncoderModel, got ",
           text_encoder_->class_name());
  // The Wan model cards load the VAE in float32 whatever the transformer's dtype.
  auto vae = load_pipeline_component(dir, "vae", at::kFloat);
  wan_vae_ = std::dynamic_pointer_cast<AutoencoderKLWan>(vae);
  XF_CHECK(wan_vae_ != nullptr, (dir / "vae").string(), " holds a ", vae->class_name(),
           ", expected AutoencoderKLWan");
  wan_vae_->enable_slicing(options.enable_slicing);
  vae_scale_temporal_ = wan_vae_->temporal_scale();
  vae_scale_spatial_ = wan_vae_->spatial_scale();
  vae_scale_factor_ = static_cast<int>(vae_scale_spatial_);
  const int64_t z = wan_vae_->config().z_dim;
  const int64_t want_in = i2v_ ? 2 * z + vae_scale_temporal_ : z;
  XF_CHECK(c.in_channels == want_in, dir.string(), ": the transformer takes ", c.in_channels,
           " channels; with the VAE's z_dim ", z, i2v_ ? " image-to-video needs " : " it needs ",
           want_in, i2v_ ? " (latents, mask and condition)" : "");
  XF_CHECK(c.resolved_out_channels() == z, dir.string(), ": the transformer predicts ",
           c.resolved_out_channels(), " channels, the VAE has z_dim ", z);
  if (clip_) {
    image_processor_ = image::ClipImageProcessorConfig::from_file(
        (dir / "image_processor" / "preprocessor_config.json").string());
    // The Wan model cards load the image encoder in float32 as well.
    image_encoder_ = load_pipeline_component(dir, "image_encoder", at::kFloat);
    XF_CHECK(image_encoder_->class_name() == "CLIPVisionModel", (dir / "image_encoder").string(),
             ": Wan's image encoder must be a CLIPVisionModel, got ", image_encoder_->class_name());
  }
}

std::unique_ptr<XFuserModel::State> WanModel::begin(const GenerationRequest& request) {
  const auto& c = wan_transformer_->config();
  const int64_t multiple = vae_scale_spatial_ * c.patch_size[1];
  XF_CHECK(request.height > 0 && request.height % multiple == 0, "--height ", request.height,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.width > 0 && request.width % multiple == 0, "--width ", request.width,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  const int64_t t = vae_scale_temporal_;
  XF_CHECK(request.num_frames >= 1 && (request.num_frames - 1) % t == 0, "--num_frames ",
           request.num_frames, " is not ", t, "k + 1 frames, which ", spec().id,
           "'s VAE needs (e.g. ", (std::max(request.num_frames, 1) - 1) / t * t + 1, " or ",
           ((std::max(request.num_frames, 1) - 1) / t + 1) * t + 1, ")");
  const int64_t latent_f = (request.num_frames - 1) / t + 1;
  const int64_t gf = latent_f / c.patch_size[0];
  const int64_t gh = request.height / multiple, gw = request.width / multiple;
  XF_CHECK(latent_f % c.patch_size[0] == 0, "--num_frames ", request.num_frames, " gives ",
           latent_f, " latent frames, not a multiple of the temporal patch ", c.patch_size[0]);
  XF_CHECK(gf <= c.rope_max_seq_len && gh <= c.rope_max_seq_len && gw <= c.rope_max_seq_len,
           "--num_frames ", request.num_frames, ", --height ", request.height, " and --width ",
           request.width, " make a ", gf, " x ", gh, " x ", gw,
           " token grid; every side must be at most rope_max_seq_len ", c.rope_max_seq_len);
  XF_CHECK(request.num_inference_steps >= 1, "--num_inference_steps must be >= 1 (got ",
           request.num_inference_steps, ")");
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= 512,
           "--max_sequence_length must be in [1, 512] for ", spec().id, " (got ",
           request.max_sequence_length, ")");
  XF_CHECK(!request.guidance_scale_2 || two_experts_,
           "--guidance_scale_2 is for Wan2.2's two experts; this pipeline has one transformer");
  XF_CHECK(!two_experts_ || process_groups() == nullptr || process_groups()->config().pp() == 1,
           spec().id,
           ": --pipefusion_parallel_degree is not supported with two experts yet (each expert "
           "would need its own stale K/V across the switch)");
  if (i2v_) {
    XF_CHECK(request.input_images.size() == 1, spec().id,
             " is image-to-video: give its first frame as one --input_images picture (got ",
             request.input_images.size(), ")");
    const at::Tensor& image = request.input_images[0];
    XF_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == at::kByte,
             "--input_images: the picture must be uint8 [H, W, 3] RGB, got ",
             shape_string(image.sizes()), " ", image.scalar_type());
    XF_CHECK(process_groups() == nullptr || process_groups()->config().pp() == 1, spec().id,
             ": --pipefusion_parallel_degree is not supported for image-to-video yet (the "
             "condition channels are not carried by PipeFusion's patches)");
  } else {
    XF_CHECK(request.input_images.empty(), spec().id,
             " is text-to-video: it takes no --input_images");
  }
  auto state = std::make_unique<WanState>();
  state->request = request;
  state->latent_f = latent_f;
  state->latent_h = request.height / vae_scale_spatial_;
  state->latent_w = request.width / vae_scale_spatial_;
  // WanPipeline.do_classifier_free_guidance: guidance_scale > 1.
  state->do_cfg = request.guidance_scale > 1.0;
  check_layout(request, state->do_cfg, gf * gh);
  state->scheduler = std::make_unique<schedulers::UniPCMultistepScheduler>(
      scheduler_config(scheduler_config_, request.flow_shift, request.flow_sigmas));
  return state;
}

at::Tensor WanModel::embed_prompts(const std::vector<std::string>& prompts,
                                   int max_sequence_length) const {
  std::vector<std::string> cleaned;
  cleaned.reserve(prompts.size());
  for (const auto& p : prompts) cleaned.push_back(prompt_clean(p));
  const auto encodings = tokenizer_->encode(cleaned, max_sequence_length);
  const at::Tensor ids = ids_tensor(encodings);
  const int64_t b = ids.size(0), s = ids.size(1);
  at::Tensor mask = at::empty({b, s}, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
  for (int64_t i = 0; i < b; ++i) {
    std::copy(encodings[i].attention_mask.begin(), encodings[i].attention_mask.end(),
              mask[i].data_ptr<int64_t>());
  }
  mask = mask.to(ids.device());
  at::Tensor hidden = text_encoder_->call("forward", {{"input_ids", ids}, {"attention_mask", mask}})
                          .at("last_hidden_state");  // [B, S, D]
  // u[:seq_len] then zeros up to max_sequence_length: positions at or past each prompt's length
  // (the mask's count) are zero, whatever the encoder computed there.
  const at::Tensor lengths = mask.gt(0).sum(1);  // [B]
  const at::Tensor positions = at::arange(s, lengths.options());
  const at::Tensor keep = positions.unsqueeze(0).lt(lengths.unsqueeze(1));  // [B, S]
  hidden = hidden * keep.unsqueeze(-1).to(hidden.scalar_type());
  return hidden.to(wan_transformer_->dtype());
}

at::Tensor WanModel::encode_image(const at::Tensor& image) const {
  // encode_image: image_processor(images=image) -> image_encoder(..., output_hidden_states=True)
  // .hidden_states[-2].
  const at::Tensor pixels = image::preprocess(image_processor_, {image.cpu()})
                                .to(load_options().device);  // [1, 3, h, w] float32
  return image_encoder_->call("forward", {{"pixel_values", pixels}})
      .at("hidden_states_penultimate");
}

at::Tensor WanModel::condition_tokens(const WanState& s, const at::Tensor& image) const {
  const auto& req = s.request;
  const auto& c = wan_transformer_->config();
  const int64_t b = s.tokens.size(0);
  const auto options = s.tokens.options();  // float32 on the run's device
  // VideoProcessor.preprocess(image, height, width): PIL Lanczos resize, /255 in float32, 2x - 1.
  const at::Tensor resized =
      image::pil_resize(image.cpu(), req.width, req.height, image::PilFilter::kLanczos);
  at::Tensor frame = resized.to(options.device()).to(at::kFloat).div(255.0).mul(2.0).sub(1.0);
  frame = frame.permute({2, 0, 1}).unsqueeze(0).unsqueeze(2);  // [1, 3, 1, H, W]
  // The picture, then num_frames - 1 frames of zeros.
  at::Tensor video = at::cat(
      {frame, at::zeros({1, 3, req.num_frames - 1, req.height, req.width}, frame.options())}, 2);
  at::Tensor latent = wan_vae_->encode(video.to(wan_vae_->dtype())).first.to(at::kFloat);
  const auto& vc = wan_vae_->config();
  const int64_t z = vc.z_dim;
  const auto host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  const at::Tensor mean = at::tensor(vc.latents_mean, host).to(options).view({1, z, 1, 1, 1});
  const at::Tensor inv_std =
      (1.0 / at::tensor(vc.latents_std, host)).to(options).view({1, z, 1, 1, 1});
  latent = ((latent - mean) * inv_std).repeat({b, 1, 1, 1, 1});
  // The mask: 1 on the picture's frame. Frame 0 is repeated temporal-scale times so every latent
  // frame covers `t` mask channels: [B, t, f, h, w], 1 on latent frame 0 only.
  const int64_t t = vae_scale_temporal_;
  at::Tensor mask = at::zeros({b, t, s.latent_f, s.latent_h, s.latent_w}, options);
  mask.narrow(2, 0, 1).fill_(1.0);
  const at::Tensor condition = at::cat({mask, latent}, 1);  // [B, t + z, f, h, w]
  return WanTransformer3DModel::patchify(condition, c.patch_size);
}

void WanModel::encode_prompt(State& base) {
  auto& s = static_cast<WanState&>(base);
  const int msl = s.request.max_sequence_length;
  s.prompt_embeds = embed_prompts(s.request.prompts, msl);
  if (clip_) {
    const int64_t b = static_cast<int64_t>(s.request.prompts.size());
    s.image_embeds =
        encode_image(s.request.input_images[0]).repeat({b, 1, 1}).to(wan_transformer_->dtype());
  }
  if (s.do_cfg) {
    std::vector<std::string> negatives = s.request.negative_prompts;
    if (negatives.empty()) negatives.assign(s.request.prompts.size(), "");
    s.negative_prompt_embeds = embed_prompts(negatives, msl);
  }
}

void WanModel::prepare_latents(State& base) {
  auto& s = static_cast<WanState&>(base);
  const auto& req = s.request;
  const auto& c = wan_transformer_->config();
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  // prepare_latents draws float32 latents and the loop keeps them in float32.
  const auto options = s.prompt_embeds.options().dtype(at::kFloat);
  const int64_t z = wan_vae_->config().z_dim;
  s.initial_latents = initial_noise(req, {b, z, s.latent_f, s.latent_h, s.latent_w}, options,
                                    std::string(i2v_ ? "WanImageToVideoPipeline" : "WanPipeline") +
                                        " latents: [B, 16, (F-1)/4+1, H/8, W/8]");
  s.tokens = WanTransformer3DModel::patchify(s.initial_latents, c.patch_size);
  if (i2v_) s.condition = condition_tokens(s, req.input_images[0]);
  const auto& p = c.patch_size;
  const int64_t gf = s.latent_f / p[0], gh = s.latent_h / p[1], gw = s.latent_w / p[2];
  s.token_ids = WanTransformer3DModel::token_ids(gf, gh, gw, options);
  s.scheduler->set_timesteps(req.num_inference_steps);
  // As diffusers' pipeline: step i is schedule index i. Looking the index up by timestep would
  // pick the second of repeated timesteps (many steps, or a small flow_shift, repeat them).
  s.scheduler->set_begin_index(0);
  // PipeFusion's patches: rows of tokens over all frames (token order is (f, h, w)).
  start_pipefusion(s, gf * gh, gw, req.num_inference_steps);
}

int WanModel::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const WanState&>(base).scheduler->num_inference_steps());
}

void WanModel::denoise_step(State& base, int index) {
  auto& s = static_cast<WanState&>(base);
  const int64_t b = s.tokens.size(0);
  const int64_t t = s.scheduler->timesteps()[index].item<int64_t>();
  dit::DiTInputs positive;
  positive.token_ids = s.token_ids;
  positive.text = s.prompt_embeds;
  if (i2v_) {
    // cat([latents, condition], dim=1): in the token layout the channels are outermost, so the
    // condition's features follow the latents' in every token.
    positive.tokens = at::cat({s.tokens, s.condition}, -1);
    if (clip_) positive.extra["encoder_hidden_states_image"] = s.image_embeds;
  }
  // Wan 2.2: the high-noise expert while t >= boundary_ratio * num_train_timesteps, then the
  // low-noise one with --guidance_scale_2 (default --guidance_scale).
  double guidance = s.request.guidance_scale;
  size_t expert = 0;
  if (two_experts_) {
    const double boundary =
        *boundary_ratio_ * static_cast<double>(s.scheduler->config().num_train_timesteps);
    if (static_cast<double>(t) < boundary) {
      expert = 1;
      guidance = s.request.guidance_scale_2.value_or(s.request.guidance_scale);
    }
  }
  transformer_ = experts_[expert].first;
  // t.expand(B); exact in float32 (t <= 1000).
  positive.timestep = at::full({b}, static_cast<double>(t), s.tokens.options().dtype(at::kFloat));
  dit::DiTInputs negative = positive;
  if (s.do_cfg) negative.text = s.negative_prompt_embeds;
  // The model's output tokens hold each patch as (pt, ph, pw, c), the latent tokens as
  // (c, pt, ph, pw) (patchify): reorder the noise before the (element-wise) scheduler step.
  const auto& p = wan_transformer_->config().patch_size;
  const int64_t out_c = wan_transformer_->config().resolved_out_channels();
  auto step = [&s, t, &p, out_c](const at::Tensor& noise, const at::Tensor& latents,
                                 const dit::TokenRange& range) {
    const int64_t bb = noise.size(0), n = noise.size(1);
    at::Tensor ordered = noise.reshape({bb, n, p[0], p[1], p[2], out_c})
                             .permute({0, 1, 5, 2, 3, 4})
                             .reshape({bb, n, out_c * p[0] * p[1] * p[2]});
    schedulers::UniPCMultistepScheduler* scheduler = s.scheduler.get();
    if (!range.whole()) {
      auto& part = s.patch_schedulers[range.begin];
      if (!part) {
        part = std::make_unique<schedulers::UniPCMultistepScheduler>(
            s.scheduler->narrowed(1, range.begin, range.end - range.begin));
      }
      scheduler = part.get();
    }
    return scheduler->step(ordered, t, latents).to(at::kFloat);
  };
  denoise(s, index, positive, s.do_cfg ? &negative : nullptr, guidance, /*batched_cfg=*/false,
          step);
}

at::Tensor WanModel::tokens_to_latents(const WanState& s) const {
  const auto& c = wan_transformer_->config();
  const auto& p = c.patch_size;
  const int64_t b = s.tokens.size(0);
  const int64_t gf = s.latent_f / p[0], gh = s.latent_h / p[1], gw = s.latent_w / p[2];
  const int64_t z = wan_vae_->config().z_dim;
  // The inverse of patchify: [B, gf, gh, gw, C, pt, ph, pw] -> [B, C, gf pt, gh ph, gw pw].
  return s.tokens.reshape({b, gf, gh, gw, z, p[0], p[1], p[2]})
      .permute({0, 4, 1, 5, 2, 6, 3, 7})
      .reshape({b, z, s.latent_f, s.latent_h, s.latent_w});
}

void WanModel::decode(State& base) {
  auto& s = static_cast<WanState&>(base);
  const at::Tensor latents = tokens_to_latents(s);
  s.latents = latents;
  const auto& vc = wan_vae_->config();
  const auto options = latents.options().dtype(wan_vae_->dtype());
  const int64_t z = vc.z_dim;
  // diffusers: torch.tensor(latents_mean) and 1.0 / torch.tensor(latents_std), both float32
  // (computed on the host), then latents / latents_std + latents_mean.
  const auto host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  const at::Tensor mean = at::tensor(vc.latents_mean, host).to(options).view({1, z, 1, 1, 1});
  const at::Tensor inv_std =
      (1.0 / at::tensor(vc.latents_std, host)).to(options).view({1, z, 1, 1, 1});
  const at::Tensor scaled = latents.to(options) / inv_std + mean;
  const auto& groups = process_groups();
  // --use_parallel_vae: bands of latent rows over the replica group (every rank that holds the
  // same videos), all-gathered: every rank ends with the whole video.
  const at::Tensor video = load_options().parallel_vae && groups
                               ? patch_parallel_decode(*wan_vae_, scaled, groups->replica())
                               : wan_vae_->decode(scaled);  // [B, 3, F, H, W]
  s.images = vae::decoded_to_pixels(video);
}

MemoryEstimate check_wan_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder transformer = open_component_config((dir / "transformer").string());
  const WanConfig config = WanConfig::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const WanVAEConfig vae = WanVAEConfig::from_json(vae_folder.config, vae_folder.config_path);
  int64_t temporal = 1;
  for (bool down : vae.temperal_downsample) temporal *= down ? 2 : 1;
  const int64_t spatial = int64_t{1} << vae.temperal_downsample.size();
  XF_CHECK(run.num_frames >= 1 && (run.num_frames - 1) % temporal == 0, "--num_frames ",
           run.num_frames, " is not ", temporal, "k + 1 frames, which the Wan VAE needs (",
           vae_folder.config_path, ")");
  const WanFolder folder = read_wan_folder(dir);
  const bool i2v = folder.i2v, clip = folder.clip, two_experts = folder.two_experts;
  XF_CHECK(!i2v || run.pipefusion == 1,
           "--pipefusion_parallel_degree is not supported for Wan image-to-video yet (",
           dir.string(), ")");
  XF_CHECK(!two_experts || run.pipefusion == 1,
           "--pipefusion_parallel_degree is not supported with Wan 2.2's two experts yet (",
           dir.string(), " has a transformer_2)");
  dit::DiTRunTraits t;
  t.family = "Wan";
  t.pixels_per_token = spatial * config.patch_size[1];
  t.text_tokens = 0;  // cross-attention: the text is not in the self-attention's sequence
  t.cfg = run.guidance_scale > 1.0;
  t.cfg_parallel_needs =
      "classifier-free guidance, which Wan runs when --guidance_scale > 1 (got " +
      std::to_string(run.guidance_scale) + ")";
  t.max_grid = config.rope_max_seq_len;
  t.components = {"text_encoder", "vae"};
  t.encoders = {{"text_encoder", run.max_sequence_length}};
  // Every block attends the text (padded to max_sequence_length) and, for I2V, the image's
  // 257 CLIP tokens.
  t.cross_attention_tokens = run.max_sequence_length + (clip ? 257 : 0);
  t.half_fp32_tensors = 3;  // FP32LayerNorm
  if (i2v) {
    // The condition video (the picture, then zeros) is encoded whole.
    t.encode_frames = run.num_frames;
    t.encode_height = run.height;
    t.encode_width = run.width;
  }
  // The VAE and the CLIP image encoder load in float32 (see load_components).
  t.float32_components = {"vae", "image_encoder"};
  if (clip) {
    t.components.push_back("image_encoder");
    t.encoders.emplace_back("image_encoder", 0);  // its own patch count
  }
  if (two_experts) t.components.push_back("transformer_2");
  t.latent_frames = ((run.num_frames - 1) / temporal + 1) / config.patch_size[0];
  return dit::check_dit_run(dir, run, t);
}

std::vector<ModelSpec> model_specs() {
  auto create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<WanModel>(spec);
  };
  ModelSpec t2v;
  t2v.id = "Wan2.1-T2V";
  t2v.aliases = {"Wan-AI/Wan2.1-T2V-14B-Diffusers", "Wan-AI/Wan2.1-T2V-14B-720P-Diffusers",
                 "Wan2.1-T2V-14B"};
  t2v.hf_repo = "Wan-AI/Wan2.1-T2V-14B-Diffusers";
  t2v.task = Task::kTextToVideo;
  // xDiT's runner: 720x1280, 81 frames, 40 steps, guidance 3.5, 16 fps, flow_shift 12.
  t2v.defaults = {720, 1280, 40, 3.5, 512, 81, 16, 12.0};
  t2v.options = {
      "--negative_prompt", "--guidance_scale", "--max_sequence_length", "--enable_slicing",
      "--num_frames",      "--flow_shift",     "--flow_sigmas",         "--fps"};
  t2v.parallelism.ulysses = true;
  t2v.parallelism.ring = true;
  t2v.parallelism.cfg_parallel = true;
  t2v.parallelism.data_parallel = true;
  t2v.parallelism.pipefusion = true;
  t2v.parallelism.tensor_parallel = true;
  t2v.parallelism.parallel_vae = true;
  t2v.maturity = "experimental";
  t2v.checked_against = "diffusers 0.33.1 and 0.42.1, transformers 4.44.2 and 5.24.0";
  t2v.description =
      "Wan 2.1 text-to-video 14B: UMT5-XXL, 3D RoPE DiT with cross-attention, causal 3D VAE, "
      "UniPC, true CFG; MP4 output";
  t2v.create = create;
  t2v.check_run = check_wan_run;
  t2v.component_classes = {{"transformer", {"WanTransformer3DModel"}},
                           {"transformer_2", {"WanTransformer3DModel"}},
                           {"vae", {"AutoencoderKLWan"}}};
  t2v.pipeline_classes = {"WanPipeline"};

  ModelSpec tiny = t2v;
  tiny.id = "tiny-wan";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {32, 48, 4, 5.0, 32, 9, 16, 0.0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in Wan 2.1 T2V architecture (UMT5, WanTransformer3DModel, AutoencoderKLWan) with "
      "seeded random weights (`xfuser make-tiny --arch wan-t2v`); noise-like videos, for tests";
  tiny.pipeline_classes = {};
  tiny.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-wan-t2v-v1-seed0",
                                  [](const fs::path& dir) { write_tiny_wan_t2v(dir, 0); });
  };
  // The trained tiny video model (examples/tiny_shapes_video/train.py): one shape moving as the
  // caption says, 17 frames of 64x64; the folder's scheduler shift (flow_shift 0 keeps it).
  ModelSpec shapes_video = tiny;
  shapes_video.id = "tiny-shapes-video";
  shapes_video.defaults = {64, 64, 20, 5.0, 32, 17, 8, 0.0};
  shapes_video.description =
      "Built-in Wan 2.1 T2V architecture trained to animate one shape as a caption says (\"a red "
      "circle moves from left to right on a blue background\", \"a green square falls\", \"a "
      "yellow triangle grows\"; examples/tiny_shapes_video); 17 frames of 64x64";
  shapes_video.embedded_dir = [] {
    return trained_pipeline_dir("tiny-shapes-video", "models/wan/tiny_shapes_video",
                                "tiny_shapes_video");
  };
  ModelSpec i2v = t2v;
  i2v.id = "Wan2.1-I2V";
  i2v.aliases = {"Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                 "Wan2.1-I2V-14B"};
  i2v.hf_repo = "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers";
  i2v.task = Task::kImageToVideo;
  // xDiT's runner: as T2V with flow_shift 5.
  i2v.defaults = {720, 1280, 40, 3.5, 512, 81, 16, 5.0};
  i2v.options.insert("--input_images");
  i2v.parallelism.pipefusion = false;
  i2v.description =
      "Wan 2.1 image-to-video 14B: the first frame as CLIP ViT-H/14 image context and as a "
      "VAE-encoded condition with a mask, UMT5-XXL, true CFG; MP4 output";
  i2v.pipeline_classes = {"WanImageToVideoPipeline"};

  ModelSpec tiny_i2v = i2v;
  tiny_i2v.id = "tiny-wan-i2v";
  tiny_i2v.aliases = {};
  tiny_i2v.hf_repo = "";
  tiny_i2v.defaults = tiny.defaults;
  tiny_i2v.maturity = "embedded";
  tiny_i2v.description =
      "Built-in Wan 2.1 I2V architecture (CLIP vision, image cross-attention, 36 input "
      "channels) with seeded random weights (`xfuser make-tiny --arch wan-i2v`); for tests";
  tiny_i2v.pipeline_classes = {};
  tiny_i2v.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-wan-i2v-v1-seed0",
                                  [](const fs::path& dir) { write_tiny_wan_i2v(dir, 0); });
  };
  // Wan 2.1 and 2.2 share the pipeline classes: a folder with a transformer_2 is Wan 2.2's.
  auto one_expert = [](const nlohmann::json& index) { return !listed(index, "transformer_2"); };
  auto two_experts = [](const nlohmann::json& index) { return listed(index, "transformer_2"); };
  t2v.folder_match = i2v.folder_match = one_expert;

  ModelSpec t2v_22 = t2v;
  t2v_22.id = "Wan2.2-T2V";
  t2v_22.checked_against = "diffusers 0.35.2 and 0.42.1, transformers 4.44.2 and 5.24.0";
  t2v_22.aliases = {"Wan-AI/Wan2.2-T2V-A14B-Diffusers", "Wan2.2-T2V-A14B"};
  t2v_22.hf_repo = "Wan-AI/Wan2.2-T2V-A14B-Diffusers";
  t2v_22.options.insert("--guidance_scale_2");
  t2v_22.parallelism.pipefusion = false;
  t2v_22.description =
      "Wan 2.2 text-to-video A14B: a high-noise and a low-noise 14B expert switched at the "
      "folder's boundary_ratio, each with its guidance (--guidance_scale, --guidance_scale_2); "
      "MP4 output";
  t2v_22.folder_match = two_experts;

  ModelSpec i2v_22 = i2v;
  i2v_22.id = "Wan2.2-I2V";
  i2v_22.checked_against = "diffusers 0.35.2 and 0.42.1, transformers 4.44.2 and 5.24.0";
  i2v_22.aliases = {"Wan-AI/Wan2.2-I2V-A14B-Diffusers", "Wan2.2-I2V-A14B"};
  i2v_22.hf_repo = "Wan-AI/Wan2.2-I2V-A14B-Diffusers";
  i2v_22.options.insert("--guidance_scale_2");
  i2v_22.description =
      "Wan 2.2 image-to-video A14B: two experts as Wan2.2-T2V, the first frame as a VAE-encoded "
      "condition (no CLIP); MP4 output";
  i2v_22.folder_match = two_experts;
  return {t2v, i2v, t2v_22, i2v_22, tiny, shapes_video, tiny_i2v};
}

}  // namespace xfuser::models::wan
