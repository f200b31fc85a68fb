#include "models/hunyuan_video15/hunyuan_video15_pipeline.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/dit/dit_checks.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/hunyuan_video15/hunyuan_video15_transformer.h"
#include "models/hunyuan_video15/hunyuan_video15_vae.h"
#include "models/hunyuan_video15/hunyuan_video15_vae_parallel.h"
#include "models/hunyuan_video15/tiny_hunyuan_video15.h"
#include "models/image/pil_resize.h"
#include "models/image/siglip_vision.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/schedulers/scheduler_config.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/text_encoders/t5_encoder.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/pixels.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::hunyuan_video15 {
namespace fs = std::filesystem;
using hunyuan_video::HunyuanVideoTransformer3DModel;

namespace {

// vision_num_semantic_tokens: the SigLIP tokens of the image condition (zeros for t2v).
constexpr int64_t kVisionSemanticTokens = 729;

bool listed(const nlohmann::json& index, const char* name) {
  auto it = index.find(name);
  return it != index.end() && it->is_array() && !it->empty() && !(*it)[0].is_null();
}

}  // namespace

std::pair<int64_t, int64_t> default_height_width(int64_t height, int64_t width, int64_t target_size,
                                                 int64_t multiple) {
  XF_CHECK(height > 0 && width > 0 && target_size >= multiple && multiple > 0,
           "default_height_width: bad sizes ", height, "x", width, ", target ", target_size);
  // generate_crop_size_list(base_size=target_size, patch_size=multiple, max_ratio=4.0)
  const double side = static_cast<double>(target_size) / static_cast<double>(multiple);
  const auto num_patches = static_cast<int64_t>(std::nearbyint(side * side));
  std::vector<std::pair<int64_t, int64_t>> buckets;  // (height, width) as the pipeline reads them
  int64_t wp = num_patches, hp = 1;
  while (wp > 0) {
    if (static_cast<double>(std::max(wp, hp)) / static_cast<double>(std::min(wp, hp)) <= 4.0) {
      buckets.emplace_back(wp * multiple, hp * multiple);
    }
    if ((hp + 1) * wp <= num_patches) {
      ++hp;
    } else {
      --wp;
    }
  }
  // get_closest_ratio: ratios rounded to 5 decimals; the closest on the picture's side.
  const double aspect = static_cast<double>(height) / static_cast<double>(width);
  int best = -1;
  double best_diff = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double ratio =
        std::nearbyint(static_cast<double>(buckets[i].first) / buckets[i].second * 1e5) / 1e5;
    const double diff = ratio - aspect;
    if (aspect >= 1 ? diff > 0 : diff < 0) continue;
    if (best < 0 || std::abs(diff) < best_diff) {
      best = static_cast<int>(i);
      best_diff = std::abs(diff);
    }
  }
  XF_CHECK(best >= 0, "no aspect-ratio bucket of target size ", target_size, " fits a ", width, "x",
           height, " picture (more than 4:1)");
  return buckets[static_cast<size_t>(best)];
}

at::Tensor resize_and_crop(const at::Tensor& picture, int64_t height, int64_t width) {
  const int64_t ih = picture.size(0), iw = picture.size(1);
  // _resize_and_crop: the side that is short relative to the target fills it exactly.
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double src_ratio = static_cast<double>(iw) / static_cast<double>(ih);
  const int64_t src_w = ratio > src_ratio ? width : iw * height / ih;
  const int64_t src_h = ratio <= src_ratio ? height : ih * width / iw;
  const at::Tensor resized =
      image::pil_resize(picture.cpu(), src_w, src_h, image::PilFilter::kLanczos);
  // Pasted at (width // 2 - src_w // 2, height // 2 - src_h // 2) into a black canvas.
  const int64_t x0 = width / 2 - src_w / 2, y0 = height / 2 - src_h / 2;
  at::Tensor canvas = at::zeros({height, width, 3}, resized.options());
  const int64_t sx = std::max<int64_t>(0, -x0), sy = std::max<int64_t>(0, -y0);
  const int64_t dx = std::max<int64_t>(0, x0), dy = std::max<int64_t>(0, y0);
  const int64_t w = std::min(src_w - sx, width - dx), h = std::min(src_h - sy, height - dy);
  canvas.narrow(0, dy, h).narrow(1, dx, w).copy_(resized.narrow(0, sy, h).narrow(1, sx, w));
  return canvas;
}

GuiderConfig GuiderConfig::from_file(const fs::path& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "cannot open the guider config ", path.string());
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("guider config ", path.string(), " is not valid JSON: ", e.what());
  }
  const std::string p = path.string();
  const std::string cls = cfg<std::string>(j, "_class_name", "ClassifierFreeGuidance", p);
  XF_CHECK(cls == "ClassifierFreeGuidance", p, ": guider class ", cls,
           " is not supported (only ClassifierFreeGuidance)");
  GuiderConfig g;
  g.guidance_scale = cfg<double>(j, "guidance_scale", g.guidance_scale, p);
  g.guidance_rescale = cfg<double>(j, "guidance_rescale", g.guidance_rescale, p);
  g.use_original_formulation =
      cfg<bool>(j, "use_original_formulation", g.use_original_formulation, p);
  g.start = cfg<double>(j, "start", g.start, p);
  g.stop = cfg<double>(j, "stop", g.stop, p);
  g.enabled = cfg<bool>(j, "enabled", g.enabled, p);
  XF_CHECK(g.start >= 0.0 && g.start < 1.0 && g.start <= g.stop && g.stop <= 1.0, p,
           ": start / stop must satisfy 0 <= start < 1 and start <= stop <= 1, got ", g.start,
           " / ", g.stop);
  XF_CHECK(g.guidance_rescale == 0.0, p, ": guidance_rescale ", g.guidance_rescale,
           " is not supported (rescale_noise_cfg); set it to 0");
  return g;
}

bool GuiderConfig::cfg_enabled(double scale, int index, int steps) const {
  if (!enabled) return false;
  const auto first = static_cast<int>(start * steps), last = static_cast<int>(stop * steps);
  const bool in_range = first <= index && index < last;
  // math.isclose(a, b): rel_tol 1e-9.
  const double target = use_original_formulation ? 0.0 : 1.0;
  const bool close = std::abs(scale - target) <= 1e-9 * std::max(std::abs(scale), std::abs(target));
  return in_range && !close;
}

struct HunyuanVideo15Model::HV15State : DiTState {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  Embeds positive, negative;  // negative: only when guidance is on at some step
  at::Tensor cond_tokens;     // [B, N, (C + 1) * pv]: the image condition and its mask
  at::Tensor picture;         // i2v: the resized and cropped picture, uint8 [H, W, 3]
  at::Tensor image_embeds;    // [B, 729, image_embed_dim]
  at::Tensor token_ids;       // [N, 3]
  int64_t latent_f = 0, latent_h = 0, latent_w = 0;
  bool any_cfg = false;
};

HunyuanVideo15Model::HunyuanVideo15Model(const ModelSpec& spec) : DiTPipeline(spec) {}
HunyuanVideo15Model::~HunyuanVideo15Model() = default;

void HunyuanVideo15Model::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  i2v_ = index.value("_class_name", "") == "HunyuanVideo15ImageToVideoPipeline";
  std::vector<const char*> names = {"scheduler",   "text_encoder", "tokenizer", "text_encoder_2",
                                    "tokenizer_2", "transformer",  "vae",       "guider"};
  if (i2v_) {
    names.push_back("image_encoder");
    names.push_back("feature_extractor");
  }
  for (const char* name : names) {
    XF_CHECK(listed(index, name), index_path, " lists no '", name, "' component; a ",
             i2v_ ? "HunyuanVideo15ImageToVideoPipeline" : "HunyuanVideo15Pipeline",
             " needs scheduler, text_encoder, tokenizer, text_encoder_2, tokenizer_2, "
             "transformer, vae and guider",
             i2v_ ? ", image_encoder and feature_extractor" : "");
    XF_CHECK(fs::is_directory(dir / name), "HunyuanVideo-1.5 pipeline folder ", dir.string(),
             " has no ", name, "/ folder (listed in model_index.json)");
  }
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  const auto sc = schedulers::FlowMatchEulerConfig::from_file(scheduler_config_);
  XF_CHECK(!sc.use_dynamic_shifting, scheduler_config_.string(),
           ": HunyuanVideo-1.5's scheduler takes a static shift (use_dynamic_shifting false)");
  guider_ = GuiderConfig::from_file(dir / "guider" / "guider_config.json");

  const auto index_class = [&](const char* name) -> std::string {
    const auto& entry = index.at(name);
    return entry.is_array() && entry.size() == 2 && entry[1].is_string()
               ? entry[1].get<std::string>()
               : std::string();
  };
  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer", index_class("tokenizer"));
  tokenizer_2_ = tokenizers::load_tokenizer(dir / "tokenizer_2", index_class("tokenizer_2"));

  load_transformer(dir / "transformer", options, "HunyuanVideo15Transformer3DModel");
  hv_transformer_ = dynamic_cast<HunyuanVideo15Transformer3DModel*>(transformer_.get());
  XF_CHECK(hv_transformer_ != nullptr, (dir / "transformer").string(),
           " did not load as a HunyuanVideo15Transformer3DModel");
  const auto& c = hv_transformer_->config();

  auto te = load_pipeline_component(dir, "text_encoder", dtype_);
  text_encoder_ = std::dynamic_pointer_cast<text_encoders::LlamaEncoder>(te);
  XF_CHECK(text_encoder_ != nullptr &&
               text_encoder_->config().family == text_encoders::LlamaEncoderConfig::Family::kQwen2,
           (dir / "text_encoder").string(),
           ": HunyuanVideo-1.5's text encoder must be a Qwen2_5_VLTextModel, got ",
           te->class_name());
  XF_CHECK(text_encoder_->config().num_hidden_layers > kNumHiddenLayersToSkip,
           (dir / "text_encoder").string(), " has ", text_encoder_->config().num_hidden_layers,
           " layers; HunyuanVideo-1.5 takes hidden_states[-", kNumHiddenLayersToSkip + 1, "]");
  XF_CHECK(text_encoder_->config().hidden_size == c.text_embed_dim, (dir / "text_encoder").string(),
           ": hidden_size ", text_encoder_->config().hidden_size,
           " but the transformer's text_embed_dim is ", c.text_embed_dim);
  auto te2 = load_pipeline_component(dir, "text_encoder_2", dtype_);
  text_encoder_2_ = std::dynamic_pointer_cast<text_encoders::T5Encoder>(te2);
  XF_CHECK(text_encoder_2_ != nullptr, (dir / "text_encoder_2").string(),
           ": HunyuanVideo-1.5's text_encoder_2 must be a T5EncoderModel (ByT5), got ",
           te2->class_name());
  XF_CHECK(text_encoder_2_->config().d_model == c.text_embed_2_dim,
           (dir / "text_encoder_2").string(), ": d_model ", text_encoder_2_->config().d_model,
           " but the transformer's text_embed_2_dim is ", c.text_embed_2_dim);

  auto vae = load_pipeline_component(dir, "vae", dtype_);
  hv_vae_ = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo15>(vae);
  XF_CHECK(hv_vae_ != nullptr, (dir / "vae").string(), " holds a ", vae->class_name(),
           ", expected AutoencoderKLHunyuanVideo15");
  const auto& vc = hv_vae_->config();
  vae_scale_temporal_ = vc.temporal_compression_ratio;
  vae_scale_spatial_ = vc.spatial_compression_ratio;
  vae_scale_factor_ = static_cast<int>(vae_scale_spatial_);
  XF_CHECK(!(options.enable_tiling && options.parallel_vae),
           "--enable_tiling and --use_parallel_vae together: HunyuanVideo-1.5's patch-parallel "
           "decode splits the picture into bands itself and does not take spatial tiles; give "
           "one of them");
  hv_vae_->enable_tiling(options.enable_tiling);
  hv_vae_->enable_slicing(options.enable_slicing);
  XF_CHECK(c.in_channels == 2 * vc.latent_channels + 1, dir.string(), ": the transformer takes ",
           c.in_channels, " channels, the pipeline gives 2 x ", vc.latent_channels,
           " latent channels + 1 mask");
  XF_CHECK(c.resolved_out_channels() == vc.latent_channels, dir.string(),
           ": the transformer predicts ", c.resolved_out_channels(), " channels, the VAE has ",
           vc.latent_channels);
  if (i2v_) {
    auto enc = load_pipeline_component(dir, "image_encoder", dtype_);
    image_encoder_ = std::dynamic_pointer_cast<image::SiglipVisionModel>(enc);
    XF_CHECK(image_encoder_ != nullptr, (dir / "image_encoder").string(),
             ": HunyuanVideo-1.5's image_encoder must be a SiglipVisionModel, got ",
             enc->class_name());
    XF_CHECK(image_encoder_->config().hidden_size == c.image_embed_dim,
             (dir / "image_encoder").string(), ": hidden_size ",
             image_encoder_->config().hidden_size, " but the transformer's image_embed_dim is ",
             c.image_embed_dim);
    feature_extractor_ = image::ClipImageProcessorConfig::from_file(
        (dir / "feature_extractor" / "preprocessor_config.json").string());
  }
}

std::unique_ptr<XFuserModel::State> HunyuanVideo15Model::begin(const GenerationRequest& request) {
  const auto& c = hv_transformer_->config();
  const int64_t multiple = vae_scale_spatial_ * c.patch_size;
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
  XF_CHECK(latent_f % c.patch_size_t == 0, "--num_frames ", request.num_frames, " gives ", latent_f,
           " latent frames, not a multiple of the temporal patch ", c.patch_size_t);
  XF_CHECK(request.num_inference_steps >= 1, "--num_inference_steps must be >= 1 (got ",
           request.num_inference_steps, ")");
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= kTokenizerMaxLength,
           "--max_sequence_length must be in [1, ", kTokenizerMaxLength, "] for ", spec().id,
           " (got ", request.max_sequence_length, ")");
  XF_CHECK(request.true_cfg_scale <= 1.0, spec().id,
           " guides with --guidance_scale (classifier-free, from the folder's guider): drop "
           "--true_cfg_scale");
  if (i2v_) {
    XF_CHECK(request.input_images.size() == 1, spec().id,
             " animates a picture: give it as one --input_images (got ",
             request.input_images.size(), ")");
    const at::Tensor& picture = request.input_images[0];
    XF_CHECK(picture.dim() == 3 && picture.size(2) == 3 && picture.scalar_type() == at::kByte,
             "--input_images: the picture must be uint8 [H, W, 3] RGB, got ", picture.sizes());
  } else {
    XF_CHECK(request.input_images.empty(), spec().id,
             " is text-to-video: it takes no --input_images");
  }
  if (request.flow_shift) {
    schedulers::check_flow_shift(*request.flow_shift, "--flow_shift");
  }
  auto state = std::make_unique<HV15State>();
  state->request = request;
  state->latent_f = latent_f;
  state->latent_h = request.height / vae_scale_spatial_;
  state->latent_w = request.width / vae_scale_spatial_;
  if (i2v_)
    state->picture = resize_and_crop(request.input_images[0], request.height, request.width);
  const int n = request.num_inference_steps;
  for (int i = 0; i < n && !state->any_cfg; ++i) {
    state->any_cfg = guider_.cfg_enabled(request.guidance_scale, i, n);
  }
  const auto& groups = process_groups();
  XF_CHECK(!groups || groups->config().cfg() == 1 || state->any_cfg,
           "--use_cfg_parallel needs classifier-free guidance: --guidance_scale is ",
           request.guidance_scale, " (guidance is off at 1), or the folder's guider disables it");
  check_layout(request, state->any_cfg,
               latent_f / c.patch_size_t * (state->latent_h / c.patch_size));
  auto sc = schedulers::FlowMatchEulerConfig::from_file(scheduler_config_);
  if (request.flow_shift) sc.shift = *request.flow_shift;
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(sc);
  return state;
}

HunyuanVideo15Model::Embeds HunyuanVideo15Model::embed_prompts(
    const std::vector<std::string>& prompts, int max_sequence_length) const {
  const auto device = load_options().device;
  Embeds e;
  e.mllm = encode_mllm_prompts(*tokenizer_, *text_encoder_, prompts, device, max_sequence_length);
  e.byt5 = byt5_prompt_embeds(*tokenizer_2_, *text_encoder_2_, prompts,
                              at::TensorOptions().dtype(dtype_).device(device));
  const auto dt = hv_transformer_->dtype();
  for (PromptEmbeds* p : {&e.mllm, &e.byt5}) p->embeds = p->embeds.to(dt);
  return e;
}

void HunyuanVideo15Model::encode_prompt(State& base) {
  auto& s = static_cast<HV15State&>(base);
  const auto& req = s.request;
  s.positive = embed_prompts(req.prompts, req.max_sequence_length);
  if (s.any_cfg) {
    // encode_prompt(prompt=negative_prompt): "" for every prompt without one.
    std::vector<std::string> negative = req.negative_prompts;
    if (negative.empty()) negative.assign(req.prompts.size(), "");
    s.negative = embed_prompts(negative, req.max_sequence_length);
  }
  const auto& groups = process_groups();
  if (groups && groups->config().pp() > 1) {
    // PipeFusion takes no text key mask: every row of a model batch must have the same count
    // of valid text tokens (image + glyph + Qwen). The branches are one batch [neg; pos]
    // without --use_cfg_parallel, separate batches with it.
    // (i2v's image tokens are valid in every row alike.)
    auto counts = [](const Embeds& e) {
      return (e.mllm.mask.gt(0).sum(1) + e.byt5.mask.gt(0).sum(1)).cpu();
    };
    std::vector<at::Tensor> batches;
    if (s.any_cfg && groups->config().cfg() == 1) {
      batches.push_back(at::cat({counts(s.negative), counts(s.positive)}));
    } else {
      batches.push_back(counts(s.positive));
      if (s.any_cfg) batches.push_back(counts(s.negative));
    }
    for (const auto& n : batches) {
      XF_CHECK(n.min().item<int64_t>() == n.max().item<int64_t>(), spec().id,
               ": --pipefusion_parallel_degree takes no text mask, and the rows of this model "
               "batch have different counts of text tokens (",
               n.min().item<int64_t>(), " to ", n.max().item<int64_t>(),
               "); run one prompt per batch, with classifier-free guidance together with "
               "--use_cfg_parallel (each branch its own batch)");
    }
  }
}

void HunyuanVideo15Model::prepare_latents(State& base) {
  auto& s = static_cast<HV15State&>(base);
  const auto& req = s.request;
  const auto& c = hv_transformer_->config();
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  const int64_t ch = hv_vae_->config().latent_channels;
  const auto options = s.positive.mllm.embeds.options().dtype(hv_transformer_->dtype());
  // prepare_latents: randn in the transformer's dtype (drawn in float32 from the seeds, cast).
  s.initial_latents =
      initial_noise(req, {b, ch, s.latent_f, s.latent_h, s.latent_w}, options,
                    "HunyuanVideo15Pipeline latents: [B, C, (F-1)/4+1, H/16, W/16]");
  s.tokens =
      HunyuanVideoTransformer3DModel::patchify(s.initial_latents, c.patch_size_t, c.patch_size);
  // t2v: zero image-condition latents and a zero mask, zero image embeddings.
  at::Tensor cond = at::zeros({b, ch + 1, s.latent_f, s.latent_h, s.latent_w}, options);
  if (i2v_) {
    // _get_image_latents: [0, 1] -> [-1, 1], [1, 3, 1, H, W], the posterior's mode x
    // scaling_factor; frame 0 of the condition, the mask 1 there.
    const auto device = load_options().device;
    at::Tensor x = s.picture.to(device).to(at::kFloat).div(255.0).mul(2.0).sub(1.0);
    x = x.permute({2, 0, 1}).unsqueeze(0).unsqueeze(2).contiguous().to(hv_vae_->dtype());
    const at::Tensor z = hv_vae_->encode(x).mode() * hv_vae_->config().scaling_factor;
    cond.narrow(1, 0, ch).narrow(2, 0, 1).copy_(z.to(options.dtype()).expand({b, ch, 1, -1, -1}));
    cond.narrow(1, ch, 1).narrow(2, 0, 1).fill_(1.0);
    // _get_image_embeds: SiglipImageProcessor on the cropped picture, last_hidden_state.
    const at::Tensor pixels = image::preprocess(feature_extractor_, {s.picture}).to(device);
    s.image_embeds =
        image_encoder_->forward(pixels).last_hidden_state.to(options.dtype()).repeat({b, 1, 1});
  } else {
    s.image_embeds = at::zeros({b, kVisionSemanticTokens, c.image_embed_dim}, options);
  }
  s.cond_tokens = HunyuanVideoTransformer3DModel::patchify(cond, c.patch_size_t, c.patch_size);
  const int64_t gf = s.latent_f / c.patch_size_t, gh = s.latent_h / c.patch_size,
                gw = s.latent_w / c.patch_size;
  s.token_ids = HunyuanVideoTransformer3DModel::token_ids(gf, gh, gw, options);
  // sigmas = np.linspace(1.0, 0.0, n + 1)[:-1]
  const int64_t n = req.num_inference_steps;
  std::vector<double> sigmas(n);
  for (int64_t i = 0; i < n; ++i) sigmas[i] = 1.0 - static_cast<double>(i) / n;
  s.scheduler->set_timesteps(n, sigmas);
  // PipeFusion patches the (frame, row) token rows; the text stream travels with every patch.
  start_pipefusion(s, gf * gh, gw, static_cast<int>(n));
}

int HunyuanVideo15Model::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const HV15State&>(base).scheduler->num_inference_steps());
}

void HunyuanVideo15Model::denoise_step(State& base, int index) {
  auto& s = static_cast<HV15State&>(base);
  const int64_t b = s.tokens.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  auto inputs = [&](const Embeds& e) {
    dit::DiTInputs in;
    in.token_ids = s.token_ids;
    in.text = e.mllm.embeds;
    in.text_mask = e.mllm.mask.gt(0);
    in.extra[HunyuanVideo15Transformer3DModel::kTextEmbeds2] = e.byt5.embeds;
    in.extra[HunyuanVideo15Transformer3DModel::kTextMask2] = e.byt5.mask.gt(0);
    in.extra[HunyuanVideo15Transformer3DModel::kImageEmbeds] = s.image_embeds;
    // timestep = t.expand(B).to(latent_model_input.dtype)
    in.timestep = at::full({b}, t, s.tokens.options().dtype(at::kFloat)).to(s.tokens.scalar_type());
    // cat([latents, cond_latents, mask], dim=1), patchified: the token channels likewise.
    in.tokens = at::cat({s.tokens, s.cond_tokens}, 2);
    if (i2v_ && hv_transformer_->config().use_meanflow) {
      // timestep_r: the next timestep (0 after the last), in the latents' dtype.
      const int steps = num_steps(s);
      const float r = index + 1 < steps ? s.scheduler->timesteps()[index + 1].item<float>() : 0.0f;
      in.extra[HunyuanVideo15Transformer3DModel::kTimestepR] =
          at::full({b}, r, s.tokens.options().dtype(at::kFloat)).to(s.tokens.scalar_type());
    }
    return in;
  };
  const dit::DiTInputs positive = inputs(s.positive);
  const int n = num_steps(s);
  const bool cfg = guider_.cfg_enabled(s.request.guidance_scale, index, n);
  dit::DiTInputs negative;
  if (cfg) negative = inputs(s.negative);
  // uncond + scale (cond - uncond); the original formulation cond + scale (cond - uncond) is
  // uncond + (scale + 1) (cond - uncond).
  const double scale = s.request.guidance_scale + (guider_.use_original_formulation ? 1.0 : 0.0);
  const auto latents_dtype = s.tokens.scalar_type();
  auto step = [&s, index, latents_dtype](const at::Tensor& noise, const at::Tensor& latents,
                                         const dit::TokenRange&) {
    return s.scheduler->step(noise, index, latents).to(latents_dtype);
  };
  // The guider runs the conditional and the unconditional batch one after the other.
  denoise(s, index, positive, cfg ? &negative : nullptr, scale, /*batched_cfg=*/false, step);
}

void HunyuanVideo15Model::decode(State& base) {
  auto& s = static_cast<HV15State&>(base);
  const auto& c = hv_transformer_->config();
  const int64_t gf = s.latent_f / c.patch_size_t, gh = s.latent_h / c.patch_size,
                gw = s.latent_w / c.patch_size;
  const at::Tensor latents = HunyuanVideoTransformer3DModel::unpatchify(
      s.tokens, gf, gh, gw, c.patch_size_t, c.patch_size, c.resolved_out_channels());
  s.latents = latents;
  // latents.to(vae.dtype) / vae.config.scaling_factor
  const at::Tensor scaled = latents.to(hv_vae_->dtype()) / hv_vae_->config().scaling_factor;
  const auto& groups = process_groups();
  // --use_parallel_vae: bands of latent rows over the replica group (every rank that holds the
  // same videos), all-gathered: every rank ends with the whole video.
  const at::Tensor video = load_options().parallel_vae && groups
                               ? patch_parallel_decode(*hv_vae_, scaled, groups->replica())
                               : hv_vae_->decode(scaled);  // [B, 3, F, H, W]
  s.images = vae::decoded_to_pixels(video);
}

MemoryEstimate check_hunyuan_video15_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder transformer = open_component_config((dir / "transformer").string());
  const HunyuanVideo15Config config =
      HunyuanVideo15Config::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const int64_t temporal =
      cfg<int64_t>(vae_folder.config, "temporal_compression_ratio", 4, vae_folder.config_path);
  const int64_t spatial =
      cfg<int64_t>(vae_folder.config, "spatial_compression_ratio", 16, vae_folder.config_path);
  XF_CHECK(run.num_frames >= 1 && (run.num_frames - 1) % temporal == 0, "--num_frames ",
           run.num_frames, " is not ", temporal,
           "k + 1 frames, which the HunyuanVideo-1.5 VAE needs (", vae_folder.config_path, ")");
  const auto blocks = vae_folder.config.value("block_out_channels", std::vector<int64_t>{});
  XF_CHECK(!blocks.empty(), vae_folder.config_path, ": block_out_channels is missing or empty");
  dit::DiTRunTraits t;
  t.family = "HunyuanVideo-1.5";
  t.pixels_per_token = spatial * config.patch_size;
  // The text stream keeps its valid tokens: the Qwen prompt's, the glyphs' (quoted text) and,
  // for image-to-video, the image's (at most).
  t.text_tokens = run.max_sequence_length + kByT5MaxLength;
  if (read_model_index(dir).value("_class_name", "") == "HunyuanVideo15ImageToVideoPipeline") {
    t.text_tokens += kVisionSemanticTokens;
    t.components.push_back("image_encoder");
    t.encoders.emplace_back("image_encoder", 0);  // its own patch count
    // Image-to-video: the picture is encoded by the VAE as one frame.
    t.encode_height = run.height;
    t.encode_width = run.width;
  }
  t.cfg = run.guidance_scale != 1.0;
  t.cfg_parallel_needs = "classifier-free guidance: --guidance_scale other than 1";
  t.max_sequence_length = kTokenizerMaxLength;
  t.components = {"text_encoder", "text_encoder_2", "vae"};
  t.encoders = {{"text_encoder", run.max_sequence_length + kCropStart},
                {"text_encoder_2", kByT5MaxLength}};
  t.masked_attention = true;
  t.blocks_what = "double-stream";
  t.latent_frames = ((run.num_frames - 1) / temporal + 1) / config.patch_size_t;
  return dit::check_dit_run(dir, run, t);
}

std::vector<ModelSpec> model_specs() {
  ModelSpec hv;
  hv.id = "HunyuanVideo-1.5";
  hv.aliases = {"tencent/HunyuanVideo-1.5", "hunyuanvideo-community/HunyuanVideo-1.5-720p_t2v",
                "hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v"};
  hv.hf_repo = "hunyuanvideo-community/HunyuanVideo-1.5-720p_t2v";
  hv.task = Task::kTextToVideo;
  // The contract: 720x1280, 121 frames, 50 steps, 24 fps; the pipeline's 1000 Qwen tokens. The
  // guidance scale is the folder's guider's (diffusers' pipeline takes no other); 6 only where
  // a folder has no guider config.
  hv.defaults = {720, 1280, 50, 6.0, 1000, 121, 24, 0.0};
  hv.folder_defaults = [](const fs::path& dir, ModelDefaults& d) {
    const fs::path guider = dir / "guider" / "guider_config.json";
    if (fs::exists(guider)) d.guidance_scale = GuiderConfig::from_file(guider).guidance_scale;
  };
  hv.folder_defaults_note = "guidance: the folder's guider/guider_config.json where it has one";
  hv.options = {"--negative_prompt", "--guidance_scale", "--max_sequence_length", "--enable_tiling",
                "--enable_slicing",  "--num_frames",     "--flow_shift",          "--fps"};
  hv.parallelism.ulysses = true;
  hv.parallelism.ring = true;
  hv.parallelism.cfg_parallel = true;
  hv.parallelism.data_parallel = true;
  hv.parallelism.tensor_parallel = true;
  hv.parallelism.pipefusion = true;
  hv.parallelism.parallel_vae = true;
  hv.maturity = "experimental";
  hv.checked_against = "diffusers 0.36.0 and 0.42.1, transformers 4.57.1 and 5.24.0";
  hv.description =
      "HunyuanVideo-1.5 8.3B text-to-video: Qwen2.5-VL text + ByT5 glyph encoder, dual-stream "
      "DiT with a token refiner and 3D RoPE, classifier-free guidance from the folder's guider, "
      "16x causal 3D VAE; MP4 output";
  hv.create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<HunyuanVideo15Model>(spec);
  };
  hv.check_run = check_hunyuan_video15_run;
  hv.component_classes = {{"transformer", {"HunyuanVideo15Transformer3DModel"}},
                          {"vae", {"AutoencoderKLHunyuanVideo15"}}};
  hv.pipeline_classes = {"HunyuanVideo15Pipeline"};
  // xDiT runs HunyuanVideo-1.5 as one model of two tasks: --task t2v or i2v picks the pipeline.
  hv.tasks = {{"t2v", "HunyuanVideo-1.5"}, {"i2v", "HunyuanVideo-1.5-I2V"}};

  ModelSpec i2v = hv;
  i2v.id = "HunyuanVideo-1.5-I2V";
  i2v.aliases = {"hunyuanvideo-community/HunyuanVideo-1.5-720p_i2v",
                 "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v"};
  i2v.hf_repo = "hunyuanvideo-community/HunyuanVideo-1.5-720p_i2v";
  i2v.task = Task::kImageToVideo;
  i2v.options.insert("--input_images");
  i2v.description =
      "HunyuanVideo-1.5 8.3B image-to-video: the picture's VAE latent conditions the first "
      "frame and its SigLIP tokens join the text stream; the output size follows the picture's "
      "aspect-ratio bucket; MP4 output";
  i2v.pipeline_classes = {"HunyuanVideo15ImageToVideoPipeline"};
  // The folder's bucket for the picture (diffusers' i2v call takes no height / width).
  i2v.size_from_picture = [](const fs::path& dir, int64_t height, int64_t width) {
    const ComponentFolder t = open_component_config((dir / "transformer").string());
    const auto config = HunyuanVideo15Config::from_json(t.config, t.config_path);
    const ComponentFolder v = open_component_config((dir / "vae").string());
    const int64_t spatial = cfg<int64_t>(v.config, "spatial_compression_ratio", 16, v.config_path);
    const auto [h, w] = default_height_width(height, width, config.target_size, spatial);
    return std::pair<int, int>(static_cast<int>(h), static_cast<int>(w));
  };

  ModelSpec tiny = hv;
  tiny.id = "tiny-hunyuan-video15";
  tiny.aliases = {};
  tiny.tasks = {};  // text-to-video only (a tiny image-to-video folder: make-tiny)
  tiny.hf_repo = "";
  tiny.defaults = {32, 48, 4, 6.0, 1000, 5, 24, 0.0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in HunyuanVideo-1.5 architecture (Qwen2.5-VL text, ByT5, "
      "HunyuanVideo15Transformer3DModel, AutoencoderKLHunyuanVideo15) with seeded random weights "
      "(`xfuser make-tiny --arch hunyuan-video15`); noise-like videos, for tests";
  tiny.pipeline_classes = {};
  tiny.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-hunyuan-video15-v1-seed0", [](const fs::path& dir) {
      write_tiny_hunyuan_video15(dir, 0, /*image_to_video=*/false);
    });
  };
  return {hv, i2v, tiny};
}

}  // namespace xfuser::models::hunyuan_video15
