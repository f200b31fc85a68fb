#include "models/flux2/flux2_pipeline.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/pipeline_cache.h"
#include "models/dit/dit_checks.h"
#include "models/flux2/flux2_config.h"
#include "models/flux2/flux2_prompt.h"
#include "models/flux2/flux2_transformer.h"
#include "models/flux2/flux2_vae.h"
#include "models/flux2/tiny_flux2.h"
#include "models/image/pil_resize.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/tokenizers/tokenizer.h"
#include "models/vae/patch_parallel.h"
#include "models/vae/pixels.h"
#include "models/weights/component_folder.h"
#include "models/weights/hub_cache.h"
#include "parallel/process_groups.h"

namespace xfuser::models::flux2 {
namespace fs = std::filesystem;

namespace {

// Flux2Pipeline's limits on an input picture (Flux2ImageProcessor.check_image_input) and the
// area it is capped at.
constexpr int64_t kMinSide = 64;
constexpr double kMaxAspect = 8.0;
constexpr int64_t kMaxArea = 1024 * 1024;
// The time coordinate of picture i: scale + scale * i (_prepare_image_ids).
constexpr double kImageTimeScale = 10.0;

bool listed(const nlohmann::json& index, const char* name) {
  auto it = index.find(name);
  return it != index.end() && it->is_array() && !it->empty() && !(*it)[0].is_null();
}

}  // namespace

double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const auto n = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return a2 * n + b2;
  const double m_200 = a2 * n + b2;
  const double m_10 = a1 * n + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(num_steps) + b;
}

std::pair<int64_t, int64_t> reference_size(int64_t height, int64_t width, int64_t multiple) {
  if (width * height > kMaxArea) {
    // _resize_to_target_area: scale = sqrt(target / (w h)); int(w * scale), int(h * scale).
    const double scale =
        std::sqrt(static_cast<double>(kMaxArea) / static_cast<double>(width * height));
    width = static_cast<int64_t>(static_cast<double>(width) * scale);
    height = static_cast<int64_t>(static_cast<double>(height) * scale);
  }
  return {height / multiple * multiple, width / multiple * multiple};
}

struct Flux2Model::Flux2State : DiTState {
  std::unique_ptr<schedulers::FlowMatchEulerDiscreteScheduler> scheduler;
  at::Tensor prompt_embeds;  // [B, L, 3d]
  at::Tensor text_ids;       // [L, 4]
  at::Tensor image_ids;      // [N, 4] (the generated tokens)
  at::Tensor guidance;       // [B] float32
  // The input pictures' packed latents [B, M, 4C] and ids [M, 4]; undefined without pictures.
  at::Tensor reference_tokens;
  at::Tensor reference_ids;
  int64_t rows = 0, cols = 0;  // the token grid (H / 16, W / 16)
};

Flux2Model::Flux2Model(const ModelSpec& spec) : DiTPipeline(spec) {}
Flux2Model::~Flux2Model() = default;

at::Tensor Flux2Model::pack_latents(const at::Tensor& latents) {
  const auto b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  return latents.reshape({b, c, h * w}).permute({0, 2, 1});
}

at::Tensor Flux2Model::unpack_latents(const at::Tensor& tokens, int64_t rows, int64_t cols) {
  const auto b = tokens.size(0), n = tokens.size(1), c = tokens.size(2);
  XF_CHECK(n == rows * cols, "cannot unpack FLUX.2 tokens ", tokens.sizes(), " to a ", rows, "x",
           cols, " grid");
  // _unpack_latents_with_ids scatters token (row, col) to row * cols + col: the packing order.
  return tokens.permute({0, 2, 1}).reshape({b, c, rows, cols});
}

at::Tensor Flux2Model::grid_ids(int64_t rows, int64_t cols, double t,
                                const at::TensorOptions& options) {
  const auto f32 = options.dtype(at::kFloat);
  at::Tensor ids = at::zeros({rows, cols, 4}, f32);
  ids.select(2, 0).fill_(t);
  ids.select(2, 1).add_(at::arange(rows, f32).unsqueeze(1));
  ids.select(2, 2).add_(at::arange(cols, f32).unsqueeze(0));
  return ids.reshape({rows * cols, 4});
}

void Flux2Model::load_components(const fs::path& dir, const ModelLoadOptions& options) {
  register_builtin_components();
  dtype_ = options.dtype;
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  for (const char* name : {"scheduler", "text_encoder", "tokenizer", "transformer", "vae"}) {
    XF_CHECK(listed(index, name), index_path, " lists no '", name,
             "' component; a Flux2Pipeline needs scheduler, text_encoder, tokenizer, transformer "
             "and vae");
    XF_CHECK(fs::is_directory(dir / name), "FLUX.2 pipeline folder ", dir.string(), " has no ",
             name, "/ folder (listed in model_index.json)");
  }
  scheduler_config_ = dir / "scheduler" / "scheduler_config.json";
  schedulers::FlowMatchEulerConfig::from_file(scheduler_config_);  // fail before any compute

  // The processor folder (PixtralProcessor): its tokenizer_config.json names the tokenizer.
  tokenizer_ = tokenizers::load_tokenizer(dir / "tokenizer");

  load_transformer(dir / "transformer", options, "Flux2Transformer2DModel");
  flux2_transformer_ = dynamic_cast<Flux2Transformer2DModel*>(transformer_.get());
  XF_CHECK(flux2_transformer_ != nullptr, (dir / "transformer").string(),
           " did not load as a Flux2Transformer2DModel");
  const auto& c = flux2_transformer_->config();

  auto te = load_pipeline_component(dir, "text_encoder", dtype_);
  text_encoder_ = std::dynamic_pointer_cast<text_encoders::LlamaEncoder>(te);
  XF_CHECK(text_encoder_ != nullptr, (dir / "text_encoder").string(), " holds a ", te->class_name(),
           "; FLUX.2 needs a Mistral3ForConditionalGeneration (or Mistral) "
           "language model");
  const int64_t te_layers = text_encoder_->config().num_hidden_layers;
  XF_CHECK(te_layers >= kTextEncoderOutLayers.back(), (dir / "text_encoder").string(), ": ",
           te_layers, " layers, but FLUX.2 stacks hidden_states[10, 20, 30]");
  const int64_t text_dim =
      text_encoder_->config().hidden_size * static_cast<int64_t>(kTextEncoderOutLayers.size());
  XF_CHECK(text_dim == c.joint_attention_dim, dir.string(), ": the text encoder gives ",
           kTextEncoderOutLayers.size(), " x ", text_encoder_->config().hidden_size, " = ",
           text_dim, " features per token, the transformer's joint_attention_dim is ",
           c.joint_attention_dim);

  // AutoencoderKL's loader: --enable_tiling / --enable_slicing, vae_scale_factor_.
  load_vae(dir / "vae", options);
  flux2_vae_ = std::dynamic_pointer_cast<AutoencoderKLFlux2>(vae_);
  XF_CHECK(flux2_vae_ != nullptr, (dir / "vae").string(), " holds a ", vae_->class_name(),
           ", expected AutoencoderKLFlux2");
  vae_scale_factor_2_ = static_cast<int64_t>(vae_scale_factor_) * 2;
  const int64_t latent_channels = flux2_vae_->config().latent_channels;
  XF_CHECK(flux2_vae_->flux2_config().patch_size == std::vector<int64_t>({2, 2}),
           (dir / "vae").string(),
           ": Flux2Pipeline packs 2x2 latent patches, the VAE's "
           "patch_size differs");
  XF_CHECK(c.in_channels == 4 * latent_channels, dir.string(), ": the transformer takes ",
           c.in_channels, " channels, the VAE's 2x2 patches of ", latent_channels,
           " latent channels are ", 4 * latent_channels);
  XF_CHECK(c.patch_size == 1, (dir / "transformer").string(), ": patch_size ", c.patch_size,
           "; Flux2Pipeline packs 1x1 tokens");
}

std::unique_ptr<XFuserModel::State> Flux2Model::begin(const GenerationRequest& request) {
  const int64_t multiple = vae_scale_factor_2_;
  XF_CHECK(request.height > 0 && request.height % multiple == 0, "--height ", request.height,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.width > 0 && request.width % multiple == 0, "--width ", request.width,
           " must be a positive multiple of ", multiple, " for ", spec().id);
  XF_CHECK(request.num_inference_steps >= 1, "--num_inference_steps must be >= 1 (got ",
           request.num_inference_steps, ")");
  XF_CHECK(request.max_sequence_length >= 1 && request.max_sequence_length <= 1024,
           "--max_sequence_length must be in [1, 1024] for ", spec().id, " (got ",
           request.max_sequence_length, ")");
  XF_CHECK(request.negative_prompts.empty() && request.true_cfg_scale <= 1.0, spec().id,
           " has no true CFG (its --guidance_scale is embedded guidance, one forward per step): "
           "drop --negative_prompt / --true_cfg_scale");
  for (size_t i = 0; i < request.input_images.size(); ++i) {
    const at::Tensor& image = request.input_images[i];
    XF_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == at::kByte,
             "--input_images ", i, ": the picture must be uint8 [H, W, 3] RGB, got ", image.sizes(),
             " ", image.scalar_type());
    const int64_t h = image.size(0), w = image.size(1);
    XF_CHECK(h >= kMinSide && w >= kMinSide, "--input_images ", i, ": ", w, "x", h,
             " is too small for FLUX.2: both sides must be at least ", kMinSide, " pixels");
    const double aspect = std::max(static_cast<double>(w) / h, static_cast<double>(h) / w);
    XF_CHECK(aspect <= kMaxAspect, "--input_images ", i, ": ", w, "x", h, " has aspect ratio ",
             aspect, ":1; FLUX.2 takes at most ", kMaxAspect, ":1");
  }
  check_layout(request, /*cfg=*/false, request.height / multiple);
  auto state = std::make_unique<Flux2State>();
  state->request = request;
  state->scheduler = std::make_unique<schedulers::FlowMatchEulerDiscreteScheduler>(
      schedulers::FlowMatchEulerConfig::from_file(scheduler_config_));
  return state;
}

at::Tensor Flux2Model::embed_prompts(const std::vector<std::string>& prompts,
                                     int max_sequence_length) const {
  std::vector<tokenizers::Encoding> encodings;
  encodings.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    XF_CONTEXT("tokenizing prompt ", i);
    encodings.push_back(prompt_tokens(*tokenizer_, prompts[i], max_sequence_length));
  }
  const at::Tensor ids = ids_tensor(encodings);
  std::vector<tokenizers::Encoding> masks = encodings;
  for (auto& e : masks) e.input_ids = e.attention_mask;
  const at::Tensor mask = ids_tensor(masks);
  return prompt_embeds(*text_encoder_, ids, mask).to(dtype_);
}

void Flux2Model::encode_prompt(State& base) {
  auto& s = static_cast<Flux2State&>(base);
  s.prompt_embeds = embed_prompts(s.request.prompts, s.request.max_sequence_length);
  // _prepare_text_ids: (0, 0, 0, l).
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(load_options().device);
  const int64_t l = s.prompt_embeds.size(1);
  s.text_ids = at::zeros({l, 4}, f32);
  s.text_ids.select(1, 3).copy_(at::arange(l, f32));
}

std::pair<at::Tensor, std::pair<int64_t, int64_t>> Flux2Model::encode_picture(
    const at::Tensor& picture) const {
  const auto device = load_options().device;
  const int64_t h0 = picture.size(0), w0 = picture.size(1);
  at::Tensor img = picture.cpu();
  if (w0 * h0 > kMaxArea) {
    const auto [ah, aw] = reference_size(h0, w0, 1);
    img = image::pil_resize(img, aw, ah, image::PilFilter::kLanczos);
  }
  const auto [h, w] = reference_size(img.size(0), img.size(1), vae_scale_factor_2_);
  XF_CHECK(h > 0 && w > 0, "an input picture of ", w0, "x", h0, " leaves no ", vae_scale_factor_2_,
           "-pixel block after the crop");
  // _resize_and_crop: center crop to (h, w).
  const int64_t top = (img.size(0) - h) / 2, left = (img.size(1) - w) / 2;
  img = img.narrow(0, top, h).narrow(1, left, w);
  // VaeImageProcessor: [0, 1] then 2x - 1 in float32, then the VAE's dtype.
  at::Tensor x = img.to(device).to(at::kFloat).div(255.0).mul(2.0).sub(1.0);
  x = x.permute({2, 0, 1}).unsqueeze(0).contiguous().to(flux2_vae_->dtype());  // [1, 3, h, w]
  // retrieve_latents(sample_mode="argmax"), _patchify_latents, then the bn normalisation.
  const at::Tensor z = flux2_vae_->normalize_latents(
      flux2_vae_->patchify(encode_pictures(x).mode()));  // [1, 4C, h/16, w/16]
  return {pack_latents(z), {z.size(2), z.size(3)}};
}

void Flux2Model::prepare_latents(State& base) {
  auto& s = static_cast<Flux2State&>(base);
  const auto& req = s.request;
  const int64_t channels = flux2_transformer_->config().in_channels;  // 4C
  s.rows = req.height / vae_scale_factor_2_;
  s.cols = req.width / vae_scale_factor_2_;
  const int64_t b = static_cast<int64_t>(req.seeds.size());
  // The latents take prompt_embeds' dtype.
  const auto options = at::TensorOptions().dtype(dtype_).device(load_options().device);
  const at::Tensor latents = initial_noise(req, {b, channels, s.rows, s.cols}, options,
                                           "Flux2Pipeline latents: [B, 4C, H/16, W/16]");
  s.initial_latents = latents;
  s.tokens = pack_latents(latents);
  s.image_ids = grid_ids(s.rows, s.cols, 0.0, options);

  if (!req.input_images.empty()) {
    std::vector<at::Tensor> tokens, ids;
    for (size_t i = 0; i < req.input_images.size(); ++i) {
      XF_CONTEXT("encoding --input_images ", i);
      auto [packed, grid] = encode_picture(req.input_images[i]);
      tokens.push_back(packed);
      ids.push_back(grid_ids(grid.first, grid.second,
                             kImageTimeScale + kImageTimeScale * static_cast<double>(i), options));
    }
    s.reference_tokens = at::cat(tokens, 1).repeat({b, 1, 1});
    s.reference_ids = at::cat(ids, 0);
  }

  const int64_t n = req.num_inference_steps;
  std::vector<double> sigmas(n);
  for (int64_t i = 0; i < n; ++i) {
    // np.linspace(1.0, 1 / n, n)
    sigmas[i] = n == 1 ? 1.0 : 1.0 + (1.0 / n - 1.0) * static_cast<double>(i) / (n - 1);
  }
  s.scheduler->set_timesteps(n, sigmas, compute_empirical_mu(s.tokens.size(1), n));
  // torch.full([1], guidance_scale, dtype=float32).expand(B)
  s.guidance = at::full({b}, req.guidance_scale, options.dtype(at::kFloat));
  start_pipefusion(s, s.rows, s.cols, static_cast<int>(n));
}

int Flux2Model::num_steps(const State& base) const {
  return static_cast<int>(static_cast<const Flux2State&>(base).scheduler->num_inference_steps());
}

void Flux2Model::denoise_step(State& base, int index) {
  auto& s = static_cast<Flux2State&>(base);
  const int64_t b = s.tokens.size(0);
  const float t = s.scheduler->timesteps()[index].item<float>();
  Flux2Inputs in;
  in.encoder_hidden_states = s.prompt_embeds;
  // timestep = t.expand(B).to(latents.dtype) / 1000
  in.timestep =
      at::full({b}, t, s.tokens.options().dtype(at::kFloat)).to(s.tokens.scalar_type()) / 1000;
  in.guidance = s.guidance;
  in.txt_ids = s.text_ids;
  in.img_ids =
      s.reference_tokens.defined() ? at::cat({s.image_ids, s.reference_ids}, 0) : s.image_ids;
  dit::DiTInputs positive = Flux2Transformer2DModel::to_dit(in);
  // cat([latents, image_latents], dim=1).to(transformer dtype); without pictures state.tokens.
  if (s.reference_tokens.defined()) {
    positive.tokens = at::cat({s.tokens, s.reference_tokens.to(s.tokens.scalar_type())}, 1);
    positive.reference_tokens = s.reference_tokens.size(1);
  }
  const auto latents_dtype = s.tokens.scalar_type();
  auto step = [&s, index, latents_dtype](const at::Tensor& noise, const at::Tensor& latents,
                                         const dit::TokenRange&) {
    // noise_pred[:, :latents.size(1)]: the pictures' outputs are dropped.
    const at::Tensor generated =
        noise.size(1) == latents.size(1) ? noise : noise.narrow(1, 0, latents.size(1));
    return s.scheduler->step(generated, index, latents).to(latents_dtype);
  };
  denoise(s, index, positive, nullptr, 1.0, /*batched_cfg=*/false, step);
}

void Flux2Model::decode(State& base) {
  auto& s = static_cast<Flux2State&>(base);
  s.latents = s.tokens;
  const at::Tensor z = flux2_vae_->unpatchify(
      flux2_vae_->denormalize_latents(unpack_latents(s.tokens, s.rows, s.cols)));
  const auto& groups = process_groups();
  // --use_parallel_vae: bands of latent rows over the replica group (every rank that holds the
  // same images), all-gathered: every rank ends with the whole image.
  const at::Tensor image = load_options().parallel_vae && groups
                               ? vae::patch_parallel_decode(*flux2_vae_, z, groups->replica())
                               : flux2_vae_->decode(z);  // [B, 3, H, W]
  s.images = vae::decoded_to_pixels(image);
}

MemoryEstimate check_flux2_run(const fs::path& dir, const RunLayout& run) {
  const ComponentFolder transformer = open_component_config((dir / "transformer").string());
  const Flux2Config config = Flux2Config::from_json(transformer.config, transformer.config_path);
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());
  const auto blocks = vae_folder.config.value("block_out_channels", std::vector<int64_t>{});
  XF_CHECK(!blocks.empty(), vae_folder.config_path, ": block_out_channels is missing or empty");
  const int64_t vae_scale = int64_t{1} << (blocks.size() - 1);
  dit::DiTRunTraits t;
  t.family = "FLUX.2";
  t.pixels_per_token = vae_scale * 2 * config.patch_size;
  // Each input picture joins the sequence (at most 1 MP: larger ones are scaled down), and is
  // encoded by the VAE, one at a time. Pictures not read yet (--dry_run) count as 1 MP.
  t.text_tokens = run.max_sequence_length;
  for (int i = 0; i < run.input_images; ++i) {
    int64_t h = 1024, w = 1024;
    if (static_cast<size_t>(i) < run.input_image_sizes.size()) {
      std::tie(h, w) = reference_size(run.input_image_sizes[i].first,
                                      run.input_image_sizes[i].second, t.pixels_per_token);
    }
    t.text_tokens += (h / t.pixels_per_token) * (w / t.pixels_per_token);
    if (h * w > t.encode_height * t.encode_width) {
      t.encode_height = h;
      t.encode_width = w;
    }
  }
  t.cfg = false;
  t.cfg_parallel_needs =
      "true CFG, which FLUX.2 does not run (its --guidance_scale is embedded guidance)";
  t.max_sequence_length = 1024;
  t.components = {"text_encoder", "vae"};
  t.encoders = {{"text_encoder", run.max_sequence_length}};
  t.live_hidden_tensors = 20;  // the fused QKV + MLP-in projection (measured)
  t.blocks_what = "double + single";
  return dit::check_dit_run(dir, run, t);
}

std::vector<ModelSpec> model_specs() {
  ModelSpec dev;
  dev.id = "FLUX.2-dev";
  dev.aliases = {"black-forest-labs/FLUX.2-dev", "FLUX.2"};
  dev.hf_repo = "black-forest-labs/FLUX.2-dev";
  dev.task = Task::kTextToImage;
  dev.defaults = {1024, 1024, 28, 4.0, 256, 0};
  dev.options = {"--guidance_scale", "--max_sequence_length", "--input_images", "--enable_tiling",
                 "--enable_slicing"};
  dev.parallelism.ulysses = true;
  dev.parallelism.ring = true;
  dev.parallelism.data_parallel = true;
  dev.parallelism.pipefusion = true;
  dev.parallelism.tensor_parallel = true;
  dev.parallelism.parallel_vae = true;
  dev.maturity = "experimental";
  dev.checked_against = "diffusers 0.36.0 and 0.42.1, transformers 4.57.1 and 5.24.0";
  dev.description =
      "FLUX.2 [dev]: Mistral-Small-3.1 text encoder (hidden states 10/20/30), double- then "
      "single-stream DiT with shared modulation and 4-axis RoPE, embedded guidance, 32-channel "
      "VAE; text to image and editing with one or several --input_images";
  dev.create = [](const ModelSpec& spec) -> std::unique_ptr<XFuserModel> {
    return std::make_unique<Flux2Model>(spec);
  };
  dev.check_run = check_flux2_run;
  dev.component_classes = {{"transformer", {"Flux2Transformer2DModel"}},
                           {"vae", {"AutoencoderKLFlux2"}}};
  dev.pipeline_classes = {"Flux2Pipeline"};
  dev.size_from_picture = [](const fs::path&, int64_t height, int64_t width) {
    const auto [h, w] = reference_size(height, width, 16);
    return std::pair<int, int>(static_cast<int>(h), static_cast<int>(w));
  };

  ModelSpec tiny = dev;
  tiny.id = "tiny-flux2";
  tiny.aliases = {};
  tiny.hf_repo = "";
  tiny.defaults = {128, 128, 4, 4.0, 64, 0};
  tiny.maturity = "embedded";
  tiny.description =
      "FLUX.2 layout in miniature (30-layer tiny Mistral 3, 1 double + 1 single block, "
      "AutoencoderKLFlux2) with seeded random weights (`xfuser make-tiny --arch flux2`): for "
      "smoke tests and the parallel drivers, its pictures are noise";
  tiny.pipeline_classes = {};
  tiny.embedded_dir = [] {
    return ensure_cached_pipeline("tiny-flux2-v1-seed0",
                                  [](const fs::path& dir) { write_tiny_flux2(dir, 0); });
  };
  return {dev, tiny};
}

}  // namespace xfuser::models::flux2
