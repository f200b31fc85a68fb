#include "models/hunyuan_video/hunyuan_video_pipeline.h"

#include <algorithm>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/dit/dit_checks.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/hunyuan_video/hunyuan_video_vae.h"
#include "models/hunyuan_video/hunyuan_video_vae_parallel.h"
#include "models/hunyuan_video/tiny_hunyuan_video.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/schedulers/scheduler_config.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/pixels.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::hunyuan_video {
namespace fs = std::filesystem;

const char* const kDefaultPromptTemplate =
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following "
    "aspects: 1. The main content and theme of the video.2. The color, shape, size, texture, "
    "quantity, text, and spatial relationships of the objects.3. Actions, events, behaviors "
    "temporal relationships, physical movement changes of the objects.4. background environment, "
    "light, style and atmosphere.5. camera angles, movements, and transitions used in the "
    "video:<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>";

namespace {

// diffusers' _get_llama_prompt_embeds: hidden_states[-(num_hidden_layers_to_skip + 1)].
constexpr int64_t kHiddenLayersToSkip = 2;
// _get_clip_prompt_embeds' max_sequence_length.
constexpr int kClipMaxLength = 77;

// crop_start as diffusers computes it when the template gives none: the template's tokens
// (special tokens added) minus the "{}" and the closing <|eot_id|>.
int64_t template_crop_start(const tokenizers::Tokenizer& tokenizer, const fs::path& dir) {
  const int64_t template_tokens =
      static_cast<int64_t>(tokenizer.encode_ids(kDefaultPromptTemplate).size());
  XF_CHECK(template_tokens > 2, dir.string(), ": the prompt template makes only ", template_tokens,
           " tokens");
  return template_tokens - 2;
}

bool listed(const nlohmann::json& index, const char* name) {
  auto it = index.find(name);
  return it != index.end() && it->is_array() && !it->empty() && !(*it)[0].is_null();
}

std::string apply_template(const std::string& prompt) {
  std::string out = kDefaultPromptTemplate;
  const auto at = out.find("{}");
  out.replace(at, 2, prompt);
  return out;
}

// The folder's FlowMatchEuler config with --flow_shift as its shift.
schedulers::FlowMatchEulerConfig scheduler_config(const fs::path& path,
                                                  const std::optional<double>& flow_shift) {
  auto config = schedulers::FlowMatchEulerConfig::from_file(path);
  XF_CHECK(!config.use_dynamic_shifting, path.string(),
           ": HunyuanVideo's FlowMatchEulerDiscreteScheduler takes a static shift "
           "(use_dynamic_shifting must be false)");
  if (flow_shift) config.shift = *flow_shift;
  return config;
}

// Columns [0, keep) of a text mask [B, L] (int64 0/1) that the transformer can see: past every
// row's count of ones (its key rule) and its last one (the token refiner's pairs).
int64_t attended_text_rows(const at::Tensor& mask) {
  const at::Tensor m = mask.gt(0).cpu();
  const int64_t b = m.size(0), l = m.size(1);
  int64_t keep = 0;
  for (int64_t i = 0; i < b; ++i) {
    const at::Tensor row = m[i];
    const int64_t count = row.sum().item<int64_t>();
    int64_t last = 0;
    if (count > 0) last = at::nonzero(row).max().item<int64_t>() + 1;
    keep = std::max({keep, count, last});
  }
  return std::max<int64_t>(std::min(keep, l), 1);
}

}  // namespace

struct HunyuanVideoModel::HunyuanState : DiTState {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  at::Tensor prompt_embeds;  // [B, L, d] (the attended rows)
  at::Tensor prompt_mask;    // [B, L] bool, undefined when every row attends all L
  at::Tensor pooled;         // [B, d2]
  at::Tensor negative_prompt_embeds, negative_prompt_mask, negative_pooled;
  at::Tensor guidance;   // [B] in the transformer's dtype (x 1000)
  at::Tensor token_ids;  // [N, 3]
  int64_t latent_f = 0, latent_h = 0, latent_w = 0;
  bool do_true_cfg = false;
};

HunyuanVideoModel::HunyuanVideoModel(const ModelSpec& spec) : DiTPipeline(spec) {}
HunyuanVideoModel::~HunyuanVideoModel() = default;

void HunyuanVideoModel::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  for (const char* name : {"scheduler", "text_encoder", "tokenizer", "text_encoder_2",
                           "tokenizer_2", "transformer", "vae"}) {
    XF_CHECK(listed(index, name), index_path, " lists no '", name,
             "' component; a HunyuanVideoPipeline needs scheduler, text_encoder, tokenizer, "
             "text_encoder_2, tokenizer_2, transformer and vae");
    XF_CHECK(fs::is_directory(dir / name), "HunyuanVideo pipeline folder ", dir.string(),
             " has no ", name, "/ folder (listed in model_index.json)");
  }
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  scheduler_config(scheduler_config_, std::nullopt);  // fail before any compute

  // model_index.json names each tokenizer's class (["transformers", "LlamaTokenizerFast"]); as in
  // diffusers, that class decides over the folder's tokenizer_config.json.
  const auto index_class = [&](const char* name) -> std::string {
    const auto& entry = index.at(name);
    return entry.is_array() && entry.size() == 2 && entry[1].is_string()
               ? entry[1].get<std::string>()
               : std::string();
  };
  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer", index_class("tokenizer"));
  tokenizer_2_ = tokenizers::load_tokenizer(dir / "tokenizer_2", index_class("tokenizer_2"));
  // CLIP's: its slow files, or (as transformers 5 saves it) tokenizer.json read as CLIPTokenizer.
  const std::string class_2 = index_class("tokenizer_2");
  XF_CHECK(
      tokenizer_2_->kind() == "clip" || class_2.rfind("CLIPTokenizer", 0) == 0,
      (dir / "tokenizer_2").string(),
      ": HunyuanVideo's tokenizer_2 must be CLIP's (vocab.json + merges.txt, or tokenizer.json "
      "with model_index.json naming CLIPTokenizer), got a ",
      tokenizer_2_->kind(), " tokenizer", class_2.empty() ? "" : " of class " + class_2);
  crop_start_ = template_crop_start(*tokenizer_, dir / "tokenizer");

  load_transformer(dir / "transformer", options, "HunyuanVideoTransformer3DModel");
  hv_transformer_ = dynamic_cast<HunyuanVideoTransformer3DModel*>(transformer_.get());
  XF_CHECK(hv_transformer_ != nullptr, (dir / "transformer").string(),
           " did not load as a HunyuanVideoTransformer3DModel");
  const auto& c = hv_transformer_->config();

  auto te = load_pipeline_component(dir, "text_encoder", dtype_);
  text_encoder_ = std::dynamic_pointer_cast<text_encoders::LlamaEncoder>(te);
  XF_CHECK(text_encoder_ != nullptr &&
               text_encoder_->config().family == text_encoders::LlamaEncoderConfig::Family::kLlama,
           (dir / "text_encoder").string(),
           ": HunyuanVideo's text encoder must be a LlamaModel, got ", te->class_name());
  const int64_t layers = text_encoder_->config().num_hidden_layers;
  XF_CHECK(layers >= kHiddenLayersToSkip, (dir / "text_encoder").string(), " has ", layers,
           " layers; HunyuanVideo takes hidden_states[-", kHiddenLayersToSkip + 1, "]");
  XF_CHECK(text_encoder_->config().hidden_size == c.text_embed_dim, (dir / "text_encoder").string(),
           ": hidden_size ", text_encoder_->config().hidden_size,
           " but the transformer's text_embed_dim is ", c.text_embed_dim);
  text_encoder_2_ = load_pipeline_component(dir, "text_encoder_2", dtype_);
  XF_CHECK(text_encoder_2_->class_name() == "CLIPTextModel", (dir / "text_encoder_2").string(),
           ": HunyuanVideo's text_encoder_2 must be a CLIPTextModel, got ",
           text_encoder_2_->class_name());

  auto vae = load_pipeline_component(dir, "vae", dtype_);
  hv_vae_ = std::dynamic_pointer_cast<AutoencoderKLHunyuanVideo>(vae);
  XF_CHECK(hv_vae_ != nullptr, (dir / "vae").string(), " holds a ", vae->class_name(),
           ", expected AutoencoderKLHunyuanVideo");
  const auto& vc = hv_vae_->config();
  vae_scale_temporal_ = vc.temporal_compression_ratio;
  vae_scale_spatial_ = vc.spatial_compression_ratio;
  vae_scale_factor_ = static_cast<int>(vae_scale_spatial_);
  XF_CHECK(
      !(options.enable_tiling && options.parallel_vae),
      "--enable_tiling and --use_parallel_vae together: HunyuanVideo's patch-parallel decode "
      "splits the picture into bands itself and does not take spatial tiles; give one of them");
  hv_vae_->enable_tiling(options.enable_tiling);
  XF_CHECK(c.in_channels == vc.latent_channels, dir.string(), ": the transformer takes ",
           c.in_channels, " channels, the VAE has ", vc.latent_channels, " latent channels");
  XF_CHECK(c.resolved_out_channels() == vc.latent_channels, dir.string(),
           ": the transformer predicts ", c.resolved_out_channels(), " channels, the VAE has ",
           vc.latent_channels);
}

std::unique_ptr<XFuserModel::State> HunyuanVideoModel::begin(const GenerationRequest& request) {
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
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= 1024,
           "--max_sequence_length must be in [1, 1024] for ", spec().id, " (got ",
           request.max_sequence_length, ")");
  if (request.flow_shift) {
    schedulers::check_flow_shift(*request.flow_shift, "--flow_shift");
  }
  auto state = std::make_unique<HunyuanState>();
  state->request = request;
  state->latent_f = latent_f;
  state->latent_h = request.height / vae_scale_spatial_;
  state->latent_w = request.width / vae_scale_spatial_;
  // do_true_cfg = true_cfg_scale > 1 and has_neg_prompt.
  state->do_true_cfg = request.true_cfg_scale > 1.0 && !request.negative_prompts.empty();
  const auto& groups = process_groups();
  XF_CHECK(!groups || groups->config().cfg() == 1 || state->do_true_cfg,
           "--use_cfg_parallel needs true CFG: give --negative_prompt and --true_cfg_scale > 1 ",
           "(HunyuanVideo's --guidance_scale is embedded guidance, one forward per step)");
  const int64_t gf = latent_f / c.patch_size_t;
  check_layout(request, state->do_true_cfg, gf * (state->latent_h / c.patch_size));
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(
      scheduler_config(scheduler_config_, request.flow_shift));
  return state;
}

std::pair<at::Tensor, at::Tensor> HunyuanVideoModel::llama_embeds(
    const std::vector<std::string>& prompts, int max_sequence_length) const {
  std::vector<std::string> templated;
  templated.reserve(prompts.size());
  for (const auto& p : prompts) templated.push_back(apply_template(p));
  const auto encodings = tokenizer_->encode(templated, max_sequence_length + crop_start_);
  const at::Tensor ids = ids_tensor(encodings);
  const int64_t b = ids.size(0), s = ids.size(1);
  at::Tensor mask = at::empty({b, s}, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
  for (int64_t i = 0; i < b; ++i) {
    std::copy(encodings[i].attention_mask.begin(), encodings[i].attention_mask.end(),
              mask[i].data_ptr<int64_t>());
  }
  mask = mask.to(ids.device());
  at::Tensor hidden =
      text_encoder_->forward_hidden_states(ids, mask, {-(kHiddenLayersToSkip + 1)}).at(0);
  hidden = hidden.narrow(1, crop_start_, s - crop_start_);
  mask = mask.narrow(1, crop_start_, s - crop_start_);
  return {hidden.to(hv_transformer_->dtype()), mask};
}

at::Tensor HunyuanVideoModel::clip_pooled(const std::vector<std::string>& prompts) const {
  const at::Tensor ids = ids_tensor(tokenizer_2_->encode(prompts, kClipMaxLength));
  return text_encoder_2_->call("forward", {{"input_ids", ids}})
      .at("pooler_output")
      .to(hv_transformer_->dtype());
}

void HunyuanVideoModel::encode_prompt(State& base) {
  auto& s = static_cast<HunyuanState&>(base);
  const int msl = s.request.max_sequence_length;
  at::Tensor mask, negative_mask;
  std::tie(s.prompt_embeds, mask) = llama_embeds(s.request.prompts, msl);
  s.pooled = clip_pooled(s.request.prompts);
  int64_t keep = attended_text_rows(mask);
  if (s.do_true_cfg) {
    std::tie(s.negative_prompt_embeds, negative_mask) =
        llama_embeds(s.request.negative_prompts, msl);
    s.negative_pooled = clip_pooled(s.request.negative_prompts);
    keep = std::max(keep, attended_text_rows(negative_mask));
  }
  // Drop the rows no query attends (exact; see the header), the same for both branches.
  auto trim = [keep](at::Tensor& embeds, at::Tensor& m, at::Tensor& out_mask) {
    embeds = embeds.narrow(1, 0, keep).contiguous();
    at::Tensor kept = m.narrow(1, 0, keep).gt(0);
    out_mask = kept.all().item<bool>() ? at::Tensor() : kept.contiguous();
  };
  trim(s.prompt_embeds, mask, s.prompt_mask);
  if (s.do_true_cfg) trim(s.negative_prompt_embeds, negative_mask, s.negative_prompt_mask);
  const auto& groups = process_groups();
  XF_CHECK(!groups || groups->config().pp() == 1 ||
               (!s.prompt_mask.defined() && !s.negative_prompt_mask.defined()),
           spec().id,
           ": --pipefusion_parallel_degree takes no text mask, and the prompts of this batch "
           "have different token counts (",
           keep,
           " rows for the longest); run prompts of different lengths in separate batches "
           "(--batch_size 1)");
}

void HunyuanVideoModel::prepare_latents(State& base) {
  auto& s = static_cast<HunyuanState&>(base);
  const auto& req = s.request;
  const auto& c = hv_transformer_->config();
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  const auto options = s.prompt_embeds.options().dtype(at::kFloat);
  s.initial_latents =
      initial_noise(req, {b, c.in_channels, s.latent_f, s.latent_h, s.latent_w}, options,
                    "HunyuanVideoPipeline latents: [B, C, (F-1)/4+1, H/8, W/8]");
  s.tokens =
      HunyuanVideoTransformer3DModel::patchify(s.initial_latents, c.patch_size_t, c.patch_size);
  const int64_t gf = s.latent_f / c.patch_size_t, gh = s.latent_h / c.patch_size,
                gw = s.latent_w / c.patch_size;
  s.token_ids = HunyuanVideoTransformer3DModel::token_ids(gf, gh, gw, options);
  // sigmas = np.linspace(1.0, 0.0, n + 1)[:-1]
  const int64_t n = req.num_inference_steps;
  std::vector<double> sigmas(n);
  for (int64_t i = 0; i < n; ++i) sigmas[i] = 1.0 - static_cast<double>(i) / n;
  s.scheduler->set_timesteps(n, sigmas);
  if (c.guidance_embeds) {
    // torch.tensor([guidance_scale] * B, dtype=transformer_dtype) * 1000.0
    s.guidance =
        at::full({b}, req.guidance_scale, options.dtype(hv_transformer_->dtype())) * 1000.0;
  }
  start_pipefusion(s, gf * gh, gw, static_cast<int>(n));
}

int HunyuanVideoModel::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const HunyuanState&>(base).scheduler->num_inference_steps());
}

void HunyuanVideoModel::denoise_step(State& base, int index) {
  auto& s = static_cast<HunyuanState&>(base);
  const int64_t b = s.tokens.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  dit::DiTInputs positive;
  positive.token_ids = s.token_ids;
  positive.text = s.prompt_embeds;
  positive.text_mask = s.prompt_mask;
  positive.pooled = s.pooled;
  positive.guidance = s.guidance;
  // timestep = t.expand(B).to(latents.dtype): float32 before the first step, then the
  // transformer's dtype (the scheduler returns the latents in it).
  const auto latents_dtype =
      index == 0 ? at::kFloat : static_cast<at::ScalarType>(hv_transformer_->dtype());
  positive.timestep = at::full({b}, t, s.tokens.options().dtype(at::kFloat)).to(latents_dtype);
  positive.extra["text_tokens"] = text_tokens_tensor(s.prompt_embeds);
  dit::DiTInputs negative = positive;
  if (s.do_true_cfg) {
    negative.text = s.negative_prompt_embeds;
    negative.text_mask = s.negative_prompt_mask;
    negative.pooled = s.negative_pooled;
    negative.extra["text_tokens"] = text_tokens_tensor(s.negative_prompt_embeds);
  }
  // The output tokens hold each patch as (c, pt, p, p), as the latent tokens (patchify): the
  // scheduler steps them element-wise. diffusers' step returns the model output's dtype.
  auto step = [&s, index](const at::Tensor& noise, const at::Tensor& latents,
                          const dit::TokenRange&) {
    return s.scheduler->step(noise, index, latents).to(at::kFloat);
  };
  denoise(s, index, positive, s.do_true_cfg ? &negative : nullptr, s.request.true_cfg_scale,
          /*batched_cfg=*/false, step);
}

at::Tensor HunyuanVideoModel::tokens_to_latents(const HunyuanState& s) const {
  const auto& c = hv_transformer_->config();
  const int64_t gf = s.latent_f / c.patch_size_t, gh = s.latent_h / c.patch_size,
                gw = s.latent_w / c.patch_size;
  return HunyuanVideoTransformer3DModel::unpatchify(s.tokens, gf, gh, gw, c.patch_size_t,
                                                    c.patch_size, c.in_channels);
}

void HunyuanVideoModel::decode(State& base) {
  auto& s = static_cast<HunyuanState&>(base);
  const at::Tensor latents = tokens_to_latents(s);
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

MemoryEstimate check_hunyuan_video_run(const fs::path& dir, const RunLayout& run) {
  // The Llama prompt carries the template's tokens before the crop: counted with the folder's
  // tokenizer where it has one, else diffusers' 95 (the template with Llama 3's tokenizer).
  int64_t crop_start = 95;
  if (fs::is_directory(dir / "tokenizer")) {
    const nlohmann::json index = read_model_index(dir);
    const auto& entry = index.value("tokenizer", nlohmann::json());
    const std::string cls = entry.is_array() && entry.size() == 2 && entry[1].is_string()
                                ? entry[1].get<std::string>()
                                : std::string();
    crop_start =
        template_crop_start(*tokenizers::load_tokenizer(dir / "tokenizer", cls), dir / "tokenizer");
  }
  const ComponentFolder transformer = open_component_config((dir / "transformer").string());
  const HunyuanVideoConfig config =
      HunyuanVideoConfig::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const HunyuanVideoVAEConfig vae =
      HunyuanVideoVAEConfig::from_json(vae_folder.config, vae_folder.config_path);
  const int64_t temporal = vae.temporal_compression_ratio;
  XF_CHECK(run.num_frames >= 1 && (run.num_frames - 1) % temporal == 0, "--num_frames ",
           run.num_frames, " is not ", temporal, "k + 1 frames, which the HunyuanVideo VAE needs (",
           vae_folder.config_path, ")");
  dit::DiTRunTraits t;
  t.family = "HunyuanVideo";
  t.pixels_per_token = vae.spatial_compression_ratio * config.patch_size;
  // The text rows the transformer sees are at most max_sequence_length (fewer once trimmed).
  t.text_tokens = run.max_sequence_length;
  t.cfg = run.true_cfg;
  t.cfg_parallel_needs =
      "true CFG: give --negative_prompt (every prompt) and --true_cfg_scale > 1 (HunyuanVideo's "
      "--guidance_scale is embedded guidance, one forward per step)";
  t.max_sequence_length = 1024;
  t.components = {"text_encoder", "text_encoder_2", "vae"};
  t.encoders = {{"text_encoder", run.max_sequence_length + crop_start},
                {"text_encoder_2", kClipMaxLength}};
  t.masked_attention = true;
  t.blocks_what = "double + single";
  t.latent_frames = ((run.num_frames - 1) / temporal + 1) / config.patch_size_t;
  return dit::check_dit_run(dir, run, t);
}

std::vector<ModelSpec> model_specs() {
  ModelSpec hv;
  hv.id = "HunyuanVideo";
  hv.aliases = {"hunyuanvideo-community/HunyuanVideo", "tencent/HunyuanVideo"};
  hv.hf_repo = "hunyuanvideo-community/HunyuanVideo";
  hv.task = Task::kTextToVideo;
  // xDiT's runner: 720x1280, 129 frames, 50 steps, embedded guidance 6.0, 24 fps; the folder's
  // scheduler shift (7.0).
  hv.defaults = {720, 1280, 50, 6.0, 256, 129, 24, 0.0};
  hv.options = {
      "--negative_prompt", "--true_cfg_scale", "--guidance_scale", "--max_sequence_length",
      "--enable_tiling",   "--num_frames",     "--flow_shift",     "--fps"};
  hv.parallelism.ulysses = true;
  hv.parallelism.ring = true;
  hv.parallelism.cfg_parallel = true;
  hv.parallelism.data_parallel = true;
  hv.parallelism.pipefusion = true;
  hv.parallelism.tensor_parallel = true;
  hv.parallelism.parallel_vae = true;
  hv.maturity = "experimental";
  hv.checked_against = "diffusers 0.33.1 and 0.42.1, transformers 4.44.2 and 5.24.0";
  hv.description =
      "HunyuanVideo 13B text-to-video: Llama 3 (LLaVA) + CLIP-L text, dual- then single-stream "
      "DiT with a token refiner and 3D RoPE, embedded guidance, causal 3D VAE; MP4 output";
  hv.create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<HunyuanVideoModel>(spec);
  };
  hv.check_run = check_hunyuan_video_run;
  hv.component_classes = {{"transformer", {"HunyuanVideoTransformer3DModel"}},
                          {"vae", {"AutoencoderKLHunyuanVideo"}}};
  hv.pipeline_classes = {"HunyuanVideoPipeline"};

  ModelSpec tiny = hv;
  tiny.id = "tiny-hunyuan-video";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {32, 48, 4, 6.0, 32, 9, 24, 0.0};
  tiny.maturity = "embedded";
  tiny.description =
      "Built-in HunyuanVideo architecture (Llama, CLIP, HunyuanVideoTransformer3DModel, "
      "AutoencoderKLHunyuanVideo) with seeded random weights (`xfuser make-tiny --arch "
      "hunyuan-video`); noise-like videos, for tests";
  tiny.pipeline_classes = {};
  tiny.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-hunyuan-video-v1-seed0",
                                  [](const fs::path& dir) { write_tiny_hunyuan_video(dir, 0); });
  };
  return {hv, tiny};
}

}  // namespace xfuser::models::hunyuan_video
