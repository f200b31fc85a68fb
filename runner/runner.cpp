#include "runner/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include "backends/attention.h"
#include "backends/device.h"
#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/dit/dit_pipefusion.h"
#include "models/dit/step_cache.h"
#include "models/registry.h"
#include "models/schedulers/scheduler_config.h"
#include "models/weights/hub_cache.h"
#include "models/weights/safetensors.h"
#include "parallel/process_groups.h"
#include "profiling/trace.h"
#include "runner/dataset.h"
#include "runner/fault_handler.h"
#include "runner/image_input.h"
#include "runner/outputs.h"
#include "runner/progress.h"
#include "runner/video.h"

namespace xfuser::runner {
namespace fs = std::filesystem;

namespace {

std::string format_double(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

// Video models write an MP4 per prompt (and with --output_type frames a PNG per frame).
bool is_video(const ResolvedArgs& args) { return args.spec->defaults.num_frames > 0; }

// The PNG of frame `k` beside a video: <video stem>_frame{k:04}.png.
fs::path frame_path(const fs::path& video, int64_t k) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_frame%04lld.png", static_cast<long long>(k));
  return video.parent_path() / (video.stem().string() + suffix);
}

// The generation parameters a video records: one JSON object in the MP4's "comment" tag (MP4
// keeps only its known tags), read back by --resume.
std::map<std::string, std::string> video_metadata(const std::map<std::string, std::string>& text) {
  nlohmann::json j(text);
  return {{"comment", j.dump()}, {"title", text.count("prompt") ? text.at("prompt") : ""}};
}

// True when `path` is a complete video of the run's size and frame count; its parameters go to
// *text. Never throws (a missing or partial file is simply incomplete).
bool is_complete_video(const fs::path& path, int frames, int height, int width,
                       std::map<std::string, std::string>* text) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    const VideoInfo info = read_video_info(path);
    if (info.frames != frames || info.height != height || info.width != width) return false;
    auto it = info.metadata.find("comment");
    if (it == info.metadata.end()) return false;
    const auto j = nlohmann::json::parse(it->second);
    if (!j.is_object()) return false;
    text->clear();
    for (const auto& [k, v] : j.items()) {
      if (v.is_string()) (*text)[k] = v.get<std::string>();
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Temporary files a killed run left beside this run's own outputs (".{name}.tmp{N}", see
// write_file_atomic): its pictures or videos, their frames and latents files, and its reports.
// Removed when a run starts, once it holds the folder's lock: no other run writes there then, and
// this run has written nothing yet. Temporaries of other names are left alone.
void remove_stale_temp_files(const ResolvedArgs& args, int world_size) {
  std::set<std::string> names = {"timings.json"};
  for (int r = 0; r < world_size; ++r) {
    names.insert("timings_rank" + std::to_string(r) + ".json");
    names.insert("profile_trace_rank_" + std::to_string(r) + ".json");
  }
  for (int64_t i = 0; i < args.total_prompts; ++i) {
    fs::path out = output_path(args, i);
    names.insert(out.filename().string());
    if (is_video(args)) {
      for (int64_t k = 0; k < args.config.num_frames.value_or(0); ++k) {
        names.insert(frame_path(out, k).filename().string());
      }
    }
    names.insert(out.replace_extension(".latents.safetensors").filename().string());
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(args.config.output_directory, ec)) {
    const std::string f = entry.path().filename().string();
    const size_t tmp = f.rfind(".tmp");
    if (f.size() < 2 || f[0] != '.' || tmp == std::string::npos) continue;
    if (f.find_first_not_of("0123456789", tmp + 4) != std::string::npos) continue;
    if (!names.count(f.substr(1, tmp - 1))) continue;
    spdlog::info("removing {} (left by an interrupted run)", entry.path().string());
    fs::remove(entry.path(), ec);
  }
}

// How the transformers hold their weights, as reports and PNG text name it.
std::string weights_name(const models::WeightFormat& w) {
  switch (w.kind) {
    case models::WeightFormat::Kind::kAsLoaded:
      return "as_loaded";
    case models::WeightFormat::Kind::kFp8Storage:
      return "fp8_storage:" + backends::fp8_format_name(w.format);
    case models::WeightFormat::Kind::kFp8Scaled:
      return "fp8_gemms:" + backends::fp8_format_name(w.format);
  }
  return "?";
}

// --cache and its parameters with the defaults of the method filled in.
models::StepCacheConfig resolve_cache(const RunConfig& c, c10::ScalarType dtype) {
  models::StepCacheConfig out;
  out.method = models::parse_cache_method(c.cache);
  out.threshold = c.cache_threshold;
  if (!out.threshold && (out.method == models::CacheMethod::kFirstBlock ||
                         out.method == models::CacheMethod::kMagCache)) {
    out.threshold = models::dit::default_cache_threshold(out.method);
  }
  out.max_skip_steps = c.cache_max_skip_steps.value_or(out.max_skip_steps);
  out.retention_ratio = c.cache_retention_ratio.value_or(out.retention_ratio);
  out.mag_ratios = c.cache_mag_ratios;
  out.teacache_coefficients = c.cache_teacache_coefficients;
  out.calibrate = c.cache_calibrate;
  out.cache_interval = c.cache_interval.value_or(out.cache_interval);
  out.disable_cache_before_step =
      c.cache_disable_before_step.value_or(out.disable_cache_before_step);
  out.disable_cache_after_step = c.cache_disable_after_step.value_or(out.disable_cache_after_step);
  out.max_order = c.cache_max_order.value_or(out.max_order);
  out.factors_dtype =
      c.cache_factors_dtype.empty() ? dtype : backends::parse_dtype(c.cache_factors_dtype);
  return out;
}

// The LoRA adapters, as reports and PNG text name them: "mode; name@digest:scale[->target], ...".
std::string lora_description(const ResolvedArgs& args) {
  std::string text = args.lora_fused ? "fused" : "unfused";
  for (size_t i = 0; i < args.lora.size(); ++i) {
    const auto& l = args.lora[i];
    text += std::string(i == 0 ? "; " : ", ") + fs::path(l.path).filename().string() + "@" +
            (i < args.lora_digests.size() ? args.lora_digests[i] : "") + ":" +
            format_double(l.scale) + (l.target.empty() ? "" : "->" + l.target);
  }
  return text;
}

// How the step cache runs, as reports and PNG text name it.
std::string cache_description(const models::StepCacheConfig& k) {
  std::string text = models::cache_method_name(k.method);
  switch (k.method) {
    case models::CacheMethod::kNone:
      break;
    case models::CacheMethod::kTeaCache: {
      // Unset threshold / coefficients: the model's published ones.
      if (k.threshold) text += " threshold=" + format_double(*k.threshold);
      std::string coefficients;
      for (double x : k.teacache_coefficients) {
        coefficients += (coefficients.empty() ? "" : ",") + format_double(x);
      }
      if (!coefficients.empty()) text += " coefficients=" + coefficients;
      break;
    }
    case models::CacheMethod::kFirstBlock:
      text += " threshold=" + format_double(k.threshold.value_or(0.0));
      break;
    case models::CacheMethod::kMagCache: {
      text += " threshold=" + format_double(k.threshold.value_or(0.0)) +
              " max_skip_steps=" + std::to_string(k.max_skip_steps) +
              " retention_ratio=" + format_double(k.retention_ratio);
      if (k.calibrate) text += " calibrate";
      std::string ratios;
      for (double r : k.mag_ratios) ratios += (ratios.empty() ? "" : ",") + format_double(r);
      if (!ratios.empty()) text += " mag_ratios=" + ratios;
      break;
    }
    case models::CacheMethod::kTaylorSeer:
      text += " cache_interval=" + std::to_string(k.cache_interval) +
              " disable_cache_before_step=" + std::to_string(k.disable_cache_before_step) +
              " disable_cache_after_step=" + std::to_string(k.disable_cache_after_step) +
              " max_order=" + std::to_string(k.max_order) +
              " factors_dtype=" + backends::dtype_name(k.factors_dtype.value_or(c10::kFloat));
      break;
  }
  return text;
}

// A generation's step-cache report (timings.json: iterations[].cache). NaN metrics are null.
nlohmann::json cache_json(const models::StepCacheReport& r) {
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
  nlohmann::json decisions = nlohmann::json::array();
  for (const auto& d : r.decisions) {
    decisions.push_back({{"step", d.step},
                         {"model", d.model},
                         {"branch", d.branch},
                         {"computed", d.computed},
                         {"metric", number(d.metric)},
                         {"local_metric", number(d.local_metric)}});
  }
  nlohmann::json out = {{"method", models::cache_method_name(r.method)},
                        {"computed", r.computed},
                        {"skipped", r.skipped},
                        {"decisions", decisions}};
  if (!r.calibration.empty()) {
    nlohmann::json calibration = nlohmann::json::object();
    for (const auto& [name, ratios] : r.calibration) calibration[name] = ratios;
    out["calibration"] = calibration;
  }
  return out;
}

// The parameters an image records (PNG text) and --resume compares: everything that changes the
// pixels. `negative` is set when the prompt runs with true CFG.
std::map<std::string, std::string> generation_text(const ResolvedArgs& args,
                                                   const std::string& prompt,
                                                   const std::optional<std::string>& negative,
                                                   int64_t seed) {
  const RunConfig& c = args.config;
  std::map<std::string, std::string> text = {
      {"Software", "xfuser"},
      {"model", args.spec->id},
      {"prompt", prompt},
      {"seed", std::to_string(seed)},
      {"num_inference_steps", std::to_string(c.num_inference_steps.value_or(0))},
      {"guidance_scale", format_double(c.guidance_scale.value_or(0))},
      {"max_sequence_length", std::to_string(c.max_sequence_length.value_or(0))},
      {"size", std::to_string(c.height.value_or(0)) + "x" + std::to_string(c.width.value_or(0))},
      {"dtype", c.dtype},
      {"parallel",
       "ulysses=" + std::to_string(c.ulysses_degree) + " ring=" + std::to_string(c.ring_degree) +
           " pipefusion=" + std::to_string(c.pipefusion_parallel_degree) +
           " tensor=" + std::to_string(c.tensor_parallel_degree) + " data=" +
           std::to_string(c.data_parallel_degree) + " cfg=" + (c.use_cfg_parallel ? "2" : "1")}};
  if (c.pipefusion_parallel_degree > 1) {
    std::string layers;
    for (auto n : c.pipefusion_layers) layers += (layers.empty() ? "" : ",") + std::to_string(n);
    text["pipefusion"] = "patches=" + std::to_string(c.num_pipeline_patch) +
                         " warmup_steps=" + std::to_string(c.pipefusion_warmup_steps) +
                         " layers=" + (layers.empty() ? "balanced" : layers);
  }
  if (is_video(args)) {
    text["num_frames"] = std::to_string(c.num_frames.value_or(0));
    text["fps"] = std::to_string(c.fps.value_or(0));
  }
  if (c.flow_shift) text["flow_shift"] = format_double(*c.flow_shift);
  if (const std::string w = weights_name(args.transformer_weights); w != "as_loaded") {
    text["weights"] = w;
  }
  if (c.flow_sigmas) text["flow_sigmas"] = *c.flow_sigmas;
  if (args.cache.enabled()) text["cache"] = cache_description(args.cache);
  if (!args.lora.empty()) text["lora"] = lora_description(args);
  if (c.guidance_scale_2) text["guidance_scale_2"] = format_double(*c.guidance_scale_2);
  // The input files, by digest: a changed picture or latents file under the same name is a change.
  std::string images;
  for (size_t k = 0; k < c.input_images.size(); ++k) {
    images += (k ? "," : "") + fs::path(c.input_images[k]).filename().string() + "@" +
              (k < args.input_image_digests.size() ? args.input_image_digests[k] : "");
  }
  if (!images.empty()) text["input_images"] = images;
  if (!c.latents.empty()) {
    text["latents"] = fs::path(c.latents).filename().string() + "@" + args.latents_digest;
  }
  if (negative) {
    text["negative_prompt"] = *negative;
    text["true_cfg_scale"] = format_double(c.true_cfg_scale.value_or(1.0));
  }
  return text;
}

// What differs between the parameters an image records and those of this run ("" if none).
std::string text_differences(const std::map<std::string, std::string>& recorded,
                             const std::map<std::string, std::string>& wanted) {
  std::string diff;
  auto add = [&](const std::string& key, const std::string& was, const std::string& now) {
    diff += (diff.empty() ? "" : ", ") + key + " '" + was + "' -> '" + now + "'";
  };
  for (const auto& [key, value] : wanted) {
    const auto it = recorded.find(key);
    if (it == recorded.end()) {
      add(key, "(none)", value);
    } else if (it->second != value) {
      add(key, it->second, value);
    }
  }
  for (const auto& [key, value] : recorded) {
    if (!wanted.count(key)) add(key, value, "(none)");
  }
  return diff;
}

// "" when every frame PNG of `video` is complete, of its size and records `wanted` (and its frame
// index); else what is wrong with the first one that is not.
std::string first_incomplete_frame(const fs::path& video, int frames, int height, int width,
                                   const std::map<std::string, std::string>& wanted) {
  for (int k = 0; k < frames; ++k) {
    const fs::path frame = frame_path(video, k);
    std::map<std::string, std::string> text;
    if (!is_complete_png(frame, height, width, &text)) {
      return "frame " + frame.filename().string() + " is missing or incomplete";
    }
    auto want = wanted;
    want["frame"] = std::to_string(k);
    if (!text_differences(text, want).empty()) {
      return "frame " + frame.filename().string() + " was made with other parameters";
    }
  }
  return "";
}

// Initial latents from a file are checked before any compute, so that a NaN, an Inf or an absurd
// magnitude is named as the input it is, not found later as non-finite latents blamed on weights.
// Initial latents are standard normal noise (|x| < 10 in practice); above kMaxInitialLatent the
// transformer's products overflow bf16 and fp16.
constexpr double kMaxInitialLatent = 1e4;

void check_initial_latents(const at::Tensor& latents, const std::string& what) {
  XF_CHECK(at::isFloatingType(latents.scalar_type()), what, ": tensor 'latents' is ",
           latents.scalar_type(), "; initial latents must be floating point");
  const at::Tensor rows = latents.to(at::kFloat).reshape({latents.size(0), -1});
  const at::Tensor finite = at::isfinite(rows).all(1);
  if (!finite.all().item<bool>()) {
    const int64_t row = finite.logical_not().nonzero()[0][0].item<int64_t>();
    XF_THROW(what, ": tensor 'latents' holds NaN or Inf (first in row ", row, ", prompt ", row,
             "); initial latents are standard normal noise");
  }
  const float largest = rows.numel() ? rows.abs().max().item<float>() : 0.0F;
  XF_CHECK(largest <= kMaxInitialLatent, what, ": tensor 'latents' holds values up to ", largest,
           " in magnitude; initial latents are standard normal noise, ", "and values above ",
           format_double(kMaxInitialLatent), " overflow the transformer's compute");
}

// --task on a multi-task model: the model that runs the task (xDiT's runner: a model with
// valid_tasks takes one of them; a model without refuses the flag). With --model_path, the folder
// must be that model's pipeline.
const models::ModelSpec& task_model(const models::ModelSpec& spec, const std::string& task,
                                    const std::string& model_path) {
  std::string multi;
  for (const auto& m : models::ModelRegistry::all()) {
    if (m.tasks.empty()) continue;
    std::string names;
    for (const auto& [t, id] : m.tasks) names += (names.empty() ? "" : ", ") + t;
    multi += (multi.empty() ? "" : "; ") + m.id + " (" + names + ")";
  }
  XF_CHECK(!spec.tasks.empty(), "--task is not supported by model ", spec.id, ": it has one task (",
           models::to_string(spec.task), "); multi-task models: ", multi);
  const auto it = spec.tasks.find(task);
  if (it == spec.tasks.end()) {
    std::string names;
    for (const auto& [t, id] : spec.tasks) names += (names.empty() ? "" : ", ") + t;
    XF_THROW("--task '", task, "' is not a task of ", spec.id, " (", names, ")");
  }
  const models::ModelSpec& target = models::ModelRegistry::find(it->second);
  if (!model_path.empty() && !target.pipeline_classes.empty()) {
    const nlohmann::json index = models::read_model_index(model_path);
    const std::string cls = index.value("_class_name", "");
    XF_CHECK(std::find(target.pipeline_classes.begin(), target.pipeline_classes.end(), cls) !=
                 target.pipeline_classes.end(),
             "--task ", task, " runs ", target.id, " (a ", target.pipeline_classes.front(),
             "), but --model_path ", model_path, " holds a ", cls.empty() ? "?" : cls);
  }
  return target;
}

std::string likely_nonfinite_cause(const ResolvedArgs& args) {
  const RunConfig& c = args.config;
  if (c.true_cfg_scale.value_or(1.0) > 100 || c.guidance_scale.value_or(0) > 100) {
    return "the guidance scale is very large (--guidance_scale " +
           format_double(c.guidance_scale.value_or(0)) + ", --true_cfg_scale " +
           format_double(c.true_cfg_scale.value_or(1.0)) + ")";
  }
  if (c.dtype == "fp16") return "an overflow in fp16 (try --dtype bf16 or fp32)";
  return "NaN or Inf in the model's weights, or an overflow in " + c.dtype;
}

}  // namespace

c10::ScalarType default_cpu_dtype() {
  static const c10::ScalarType t = backends::cpu_has_native_bf16() ? c10::kBFloat16 : c10::kFloat;
  return t;
}

Runner::Runner(RunConfig config, std::shared_ptr<parallel::ProcessGroups> groups)
    : config_(std::move(config)), groups_(std::move(groups)) {}
Runner::~Runner() = default;

namespace {

// Flags this model does not honour are errors, never silently ignored.
void require_option(const models::ModelSpec& spec, bool given, const std::string& flag) {
  XF_CHECK(!given || spec.options.count(flag), flag, " is not supported by model ", spec.id);
}

// The inputs a run or a request sets that not every model reads.
void check_input_options(const models::ModelSpec& spec, const RunConfig& c) {
  require_option(spec, !c.negative_prompt.empty(), "--negative_prompt");
  require_option(spec, c.true_cfg_scale.has_value(), "--true_cfg_scale");
  require_option(spec, c.guidance_scale.has_value(), "--guidance_scale");
  require_option(spec, c.max_sequence_length.has_value(), "--max_sequence_length");
  require_option(spec, c.num_frames.has_value(), "--num_frames");
  require_option(spec, c.fps.has_value(), "--fps");
  require_option(spec, c.guidance_scale_2.has_value(), "--guidance_scale_2");
  require_option(spec, !c.input_images.empty(), "--input_images");
}

// Prompts are non-empty UTF-8 before anything loads; the offset is the byte's in the prompt as
// given (the tokenizer would find it later, at an offset into the model's prompt template).
void check_prompt_texts(const RunConfig& c) {
  for (size_t i = 0; i < c.prompt.size(); ++i) {
    XF_CHECK(!c.prompt[i].empty(), "--prompt ", i, " is empty");
  }
  for (const auto& [flag, texts] :
       {std::pair{"--prompt", &c.prompt}, std::pair{"--negative_prompt", &c.negative_prompt}}) {
    for (size_t i = 0; i < texts->size(); ++i) {
      size_t offset = 0;
      XF_CHECK(find_invalid_utf8((*texts)[i], &offset) == 0, flag, " ", i,
               " is not valid UTF-8 (byte offset ", offset, ")");
    }
  }
}

}  // namespace

ResolvedArgs Runner::resolve_plan() const {
  XF_CHECK(!config_.model.empty() || !config_.model_path.empty(),
           "--model is required, or --model_path with a diffusers pipeline folder (see `xfuser "
           "models` for the list)");
  validate_values(config_);
  ResolvedArgs args;
  args.config = config_;
  args.given = config_;
  RunConfig& c = args.config;
  // --model_path alone: the folder's pipeline class (model_index.json) picks the model.
  args.spec = c.model.empty() ? &models::ModelRegistry::for_pipeline_folder(c.model_path)
                              : &models::ModelRegistry::find(c.model);
  if (!c.task.empty()) args.spec = &task_model(*args.spec, c.task, c.model_path);
  const models::ModelSpec& spec = *args.spec;

  check_input_options(spec, c);
  require_option(spec, c.enable_tiling, "--enable_tiling");
  require_option(spec, c.enable_slicing, "--enable_slicing");
  require_option(spec, c.flow_shift.has_value(), "--flow_shift");
  require_option(spec, c.flow_sigmas.has_value(), "--flow_sigmas");
  const bool video = spec.defaults.num_frames > 0;
  XF_CHECK(video || c.output_type == "video" /* the default */, "--output_type ", c.output_type,
           " is for video models; ", spec.id, " writes images");
  XF_CHECK(!video || video_supported(), spec.id,
           " writes MP4 video, and this xfuser was built without FFmpeg (XFUSER_WITH_FFMPEG=OFF): "
           "rebuild with libavcodec, libavformat, libavutil and libswscale installed");
  // Parallel strategies the model does not support are errors naming the flag and the model.
  const auto& par = spec.parallelism;
  auto require_par = [&](bool used, bool supported, const std::string& flag) {
    XF_CHECK(!used || supported, flag, " is not supported by model ", spec.id);
  };
  require_par(c.ulysses_degree > 1, par.ulysses, "--ulysses_degree");
  require_par(c.ring_degree > 1, par.ring, "--ring_degree");
  require_par(c.pipefusion_parallel_degree > 1, par.pipefusion, "--pipefusion_parallel_degree");
  require_par(c.tensor_parallel_degree > 1, par.tensor_parallel, "--tensor_parallel_degree");
  require_par(c.data_parallel_degree > 1, par.data_parallel, "--data_parallel_degree");
  require_par(c.use_cfg_parallel, par.cfg_parallel, "--use_cfg_parallel");
  require_par(c.use_parallel_vae, par.parallel_vae, "--use_parallel_vae");
  check_prompt_texts(c);

  resolve_inputs(args);
  if (c.dtype.empty()) c.dtype = backends::dtype_name(default_cpu_dtype());
  args.dtype = backends::parse_dtype(c.dtype);
  args.device = backends::select_device(c.device);
  // Now, so a bad name fails before anything loads.
  args.attention_kernel = backends::resolve_attention_kernel(c.attention_backend, args.device);
  XF_CHECK(!(c.use_fp8_gemms && !c.fp8_storage.empty()),
           "--use_fp8_gemms and --fp8_storage are two ways to hold the weights in fp8: give one");
  if (c.use_fp8_gemms) {
    args.transformer_weights.kind = models::WeightFormat::Kind::kFp8Scaled;
    args.transformer_weights.format = backends::Fp8Format::kE4M3FN;
  } else if (!c.fp8_storage.empty()) {
    args.transformer_weights.kind = models::WeightFormat::Kind::kFp8Storage;
    args.transformer_weights.format = backends::parse_fp8_format(c.fp8_storage, "--fp8_storage");
  }
  XF_CHECK(args.transformer_weights.kind != models::WeightFormat::Kind::kFp8Scaled ||
               c.tensor_parallel_degree <= 1,
           "--use_fp8_gemms with --tensor_parallel_degree ", c.tensor_parallel_degree,
           " is not supported yet: a row-parallel layer would scale each rank's part of a row on "
           "its own; use sequence, CFG, data or PipeFusion parallelism with FP8 GEMMs");
  args.cache = resolve_cache(c, args.dtype);
  args.lora_fused = c.lora_mode != "unfused";
  {
    std::set<std::string> names;
    for (const auto* list : {&c.lora, &c.lora_2}) {
      const bool second = list == &c.lora_2;
      for (const auto& text : *list) {
        models::LoraSpec spec = models::parse_lora_spec(text, second ? "--lora_2" : "--lora");
        if (second) spec.target = "transformer_2";
        XF_CHECK(fs::is_regular_file(spec.path), second ? "--lora_2 " : "--lora ", spec.path,
                 ": no such file");
        const std::string stem = fs::path(spec.path).stem().string();
        spec.name = stem;
        for (int i = 2; names.count(spec.name); ++i) spec.name = stem + "_" + std::to_string(i);
        names.insert(spec.name);
        args.lora_digests.push_back(file_digest(spec.path));
        args.lora.push_back(std::move(spec));
      }
    }
  }
  XF_CHECK(!(c.enable_model_cpu_offload && c.enable_sequential_cpu_offload),
           "--enable_model_cpu_offload and --enable_sequential_cpu_offload are two ways to keep "
           "the weights in host memory (whole components, or the transformer's blocks one at a "
           "time): give one");
  if (c.enable_model_cpu_offload) args.offload = models::OffloadMode::kModel;
  if (c.enable_sequential_cpu_offload) args.offload = models::OffloadMode::kSequential;
  if (c.use_fsdp) {
    // FSDP shards over the ranks that run each forward together; the other dimensions either
    // split the weights already or run different forwards.
    XF_CHECK(c.tensor_parallel_degree <= 1, "--use_fsdp with --tensor_parallel_degree ",
             c.tensor_parallel_degree,
             " is not supported: FSDP shards whole weights; use Ulysses, ring or CFG parallelism "
             "with FSDP");
    XF_CHECK(c.pipefusion_parallel_degree <= 1, "--use_fsdp with --pipefusion_parallel_degree ",
             c.pipefusion_parallel_degree,
             " is not supported: a PipeFusion stage holds only its own blocks already; use "
             "Ulysses, ring or CFG parallelism with FSDP");
    XF_CHECK(args.offload == models::OffloadMode::kNone, "--use_fsdp with --enable_",
             models::offload_mode_name(args.offload),
             "_cpu_offload is not supported: each keeps the weights off the device its own way; "
             "give one");
    const int shard_ranks = c.ulysses_degree * c.ring_degree * (c.use_cfg_parallel ? 2 : 1);
    XF_CHECK(shard_ranks > 1,
             "--use_fsdp shards the weights over the ranks that run a generation together "
             "(--ulysses_degree x --ring_degree x --use_cfg_parallel), and this run has one (",
             "ulysses ", c.ulysses_degree, ", ring ", c.ring_degree, ", cfg ",
             c.use_cfg_parallel ? 2 : 1,
             "); data-parallel ranks run different prompts and keep whole weights each");
  }
  if (args.offload != models::OffloadMode::kNone && args.device.is_cpu()) {
    spdlog::warn(
        "--enable_{}_cpu_offload saves no memory on the CPU: the weights already live in host "
        "memory (the offload runs, and its report shows what a GPU would hold)",
        models::offload_mode_name(args.offload));
  }
  return args;
}

void Runner::resolve_inputs(ResolvedArgs& args) const {
  const models::ModelSpec& spec = *args.spec;
  RunConfig& c = args.config;
  const bool video = spec.defaults.num_frames > 0;
  models::ModelDefaults d = spec.defaults;
  if (spec.folder_defaults) spec.folder_defaults(resolve_model_dir(args), d);
  // The pictures, read once (errors name the file).
  std::vector<at::Tensor>& pictures = args.request.input_images;
  pictures.clear();
  args.input_image_digests.clear();
  set_max_image_pixels(c.max_input_pixels);
  for (const auto& file : c.input_images) {
    pictures.push_back(read_image(file));
    args.input_image_digests.push_back(file_digest(file));
  }
  if (spec.size_from_picture && !pictures.empty()) {
    const auto [h, w] =
        spec.size_from_picture(resolve_model_dir(args), pictures[0].size(0), pictures[0].size(1));
    // A picture too small to give a size is named, not reported as a --height nobody gave.
    for (auto [side, given, derived] : {std::tuple{"height", c.height.has_value(), h},
                                        std::tuple{"width", c.width.has_value(), w}}) {
      XF_CHECK(given || derived > 0, "--input_images ", c.input_images[0], " is ",
               pictures[0].size(1), "x", pictures[0].size(0), " pixels: too small for ", spec.id,
               " to take its output size from (its ", side,
               " rounds down to 0); give a larger picture, or --height and --width");
    }
    if (!c.height) c.height = h;
    if (!c.width) c.width = w;
  } else if (spec.task == models::Task::kImageToImage && !c.height && !c.width &&
             !pictures.empty()) {
    // Editing models: the output keeps the picture's aspect ratio at the default area (as
    // FluxKontextPipeline's max_area rule), sides rounded down to multiples of 16.
    const double aspect = static_cast<double>(pictures[0].size(1)) / pictures[0].size(0);
    const double area = static_cast<double>(d.height) * d.width;
    c.width =
        std::max<int>(16, static_cast<int>(std::nearbyint(std::sqrt(area * aspect))) / 16 * 16);
    c.height =
        std::max<int>(16, static_cast<int>(std::nearbyint(std::sqrt(area / aspect))) / 16 * 16);
  }
  c.height = c.height.value_or(d.height);
  c.width = c.width.value_or(d.width);
  c.num_inference_steps = c.num_inference_steps.value_or(d.num_inference_steps);
  c.guidance_scale = c.guidance_scale.value_or(d.guidance_scale);
  c.true_cfg_scale = c.true_cfg_scale.value_or(1.0);
  c.max_sequence_length = c.max_sequence_length.value_or(d.max_sequence_length);
  if (video) {
    c.num_frames = c.num_frames.value_or(d.num_frames);
    c.fps = c.fps.value_or(d.fps > 0 ? d.fps : 16);
    if (!c.flow_shift && d.flow_shift > 0) c.flow_shift = d.flow_shift;
  }
}

ResolvedArgs Runner::preprocess_args() const {
  // A run's own inputs first: a missing prompt is named before any model folder is looked for.
  {
    const RunConfig& c = config_;
    XF_CHECK(!c.model.empty() || !c.model_path.empty(),
             "--model is required, or --model_path with a diffusers pipeline folder (see `xfuser "
             "models` for the list)");
    validate_values(c);
    const bool dataset = !c.dataset_path.empty();
    XF_CHECK(!dataset || c.prompt.empty(), "--prompt and --dataset_path are exclusive: give one");
    XF_CHECK(!dataset || c.batch_size.has_value(),
             "--dataset_path needs --batch_size (prompts denoised together per step)");
    XF_CHECK(!c.resume || dataset,
             "--resume needs --dataset_path (it skips finished outputs of a "
             "dataset run)");
    XF_CHECK(dataset || !c.prompt.empty(), "--prompt is required (or --dataset_path)");
  }
  ResolvedArgs args = resolve_plan();
  RunConfig& c = args.config;
  const models::ModelSpec& spec = *args.spec;
  if (!c.latents.empty()) args.latents_digest = file_digest(c.latents);
  const bool dataset = !c.dataset_path.empty();
  XF_CHECK(c.negative_prompt.empty() || c.negative_prompt.size() == 1 ||
               (!dataset && c.negative_prompt.size() == c.prompt.size()),
           "--negative_prompt: give one, or one per --prompt (", c.prompt.size(), "), got ",
           c.negative_prompt.size());

  // Flags that would change nothing: one warning each, naming the flag.
  if (!c.negative_prompt.empty() && spec.options.count("--true_cfg_scale") &&
      *c.true_cfg_scale <= 1.0) {
    spdlog::warn(
        "--negative_prompt has no effect: {} uses it only with true CFG, --true_cfg_scale > 1 "
        "(got {})",
        spec.id, format_double(*c.true_cfg_scale));
  }
  if (!dataset && c.batch_size && static_cast<size_t>(*c.batch_size) >= c.prompt.size()) {
    spdlog::warn(
        "--batch_size {} has no effect: the {} --prompt(s) are denoised in one batch with or "
        "without it",
        *c.batch_size, c.prompt.size());
  }

  // Every prompt of the run, with its negative prompt (if any) and seed. Per-row seeds default to
  // --seed: each prompt is seeded on its own, as a one-prompt run with that seed, so an image
  // does not depend on the batch size, its place in a batch or the data-parallel layout.
  std::vector<std::string> prompts;
  std::vector<std::optional<std::string>> negatives;
  std::vector<int64_t> seeds;
  if (dataset) {
    for (auto& row : read_dataset(c.dataset_path)) {
      prompts.push_back(std::move(row.prompt));
      if (!row.negative_prompt && c.negative_prompt.size() == 1) {
        row.negative_prompt = c.negative_prompt[0];
      }
      require_option(spec, row.negative_prompt.has_value(), "--negative_prompt");
      negatives.push_back(std::move(row.negative_prompt));
      seeds.push_back(row.seed.value_or(c.seed));
    }
  } else {
    prompts = c.prompt;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (c.negative_prompt.empty()) {
        negatives.emplace_back();
      } else {
        negatives.emplace_back(c.negative_prompt[c.negative_prompt.size() == 1 ? 0 : i]);
      }
    }
    seeds.assign(prompts.size(), c.seed);
  }
  args.total_prompts = static_cast<int64_t>(prompts.size());
  args.batch_size = c.batch_size.value_or(0);

  // --resume: prompts whose output is complete are skipped. World rank 0 decides, every rank
  // takes its answer, so all ranks of a model replica run the same batches.
  std::vector<int64_t> pending;
  {
    at::Tensor todo = at::ones({static_cast<int64_t>(prompts.size())}, at::kByte);
    if (c.resume && (!groups_ || groups_->rank() == 0)) {
      std::error_code ec;
      if (fs::is_directory(c.output_directory, ec)) lock_output_directory();
      for (size_t i = 0; i < prompts.size(); ++i) {
        const fs::path path = output_path(args, static_cast<int64_t>(i));
        std::map<std::string, std::string> text;
        const bool complete = is_video(args) ? is_complete_video(path, c.num_frames.value_or(0),
                                                                 *c.height, *c.width, &text)
                                             : is_complete_png(path, *c.height, *c.width, &text);
        if (!complete) continue;
        // Done only when every parameter the image records equals this run's.
        const std::string diff =
            text_differences(text, generation_text(args, prompts[i], negatives[i], seeds[i]));
        if (!diff.empty()) {
          spdlog::warn("--resume: {} was made with other parameters ({}); generating it again",
                       path.string(), diff);
          continue;
        }
        // --output_type frames: every frame's PNG too, each complete and of this video.
        if (is_video(args) && c.output_type == "frames") {
          const std::string missing =
              first_incomplete_frame(path, c.num_frames.value_or(0), *c.height, *c.width,
                                     generation_text(args, prompts[i], negatives[i], seeds[i]));
          if (!missing.empty()) {
            spdlog::info("--resume: {} is complete but {}; generating it again", path.string(),
                         missing);
            continue;
          }
        }
        todo.data_ptr<uint8_t>()[i] = 0;
      }
    }
    if (c.resume && groups_ && groups_->config().world_size() > 1) {
      groups_->world().broadcast(todo, 0);
    }
    const uint8_t* t = todo.data_ptr<uint8_t>();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (t[i]) pending.push_back(static_cast<int64_t>(i));
    }
    args.skipped_prompts = args.total_prompts - static_cast<int64_t>(pending.size());
    if (c.resume) {
      spdlog::info("--resume: {} of {} outputs complete, {} to generate", args.skipped_prompts,
                   args.total_prompts, pending.size());
    }
  }

  fill_request(args, prompts, negatives, seeds, pending);
  return args;
}

ResolvedArgs Runner::resolve_request(const ResolvedArgs& plan, const RequestInputs& in) const {
  XF_CHECK(plan.spec != nullptr, "Runner::resolve_request needs a plan from resolve_plan()");
  XF_CHECK(!in.prompts.empty(), "a request needs at least one prompt");
  XF_CHECK(in.negative_prompts.size() == in.prompts.size() && in.seeds.size() == in.prompts.size(),
           "a request needs one negative prompt slot and one seed per prompt (", in.prompts.size(),
           " prompts, ", in.negative_prompts.size(), " negative prompts, ", in.seeds.size(),
           " seeds)");
  ResolvedArgs args = plan;
  args.request = {};
  args.prompt_indices.clear();
  args.has_negative.clear();
  args.input_image_digests.clear();
  args.latents_digest.clear();
  args.skipped_prompts = 0;
  args.batch_size = 0;
  RunConfig& c = args.config;
  const RunConfig& g = plan.given;
  // The request's values, else the plan's flags as given (the model's defaults fill the rest).
  c.prompt = in.prompts;
  c.negative_prompt.clear();
  for (const auto& n : in.negative_prompts) {
    if (n) c.negative_prompt.push_back(*n);
  }
  c.seed = in.seeds.front();
  c.height = in.height ? in.height : g.height;
  c.width = in.width ? in.width : g.width;
  c.num_frames = in.num_frames ? in.num_frames : g.num_frames;
  c.fps = in.fps ? in.fps : g.fps;
  c.num_inference_steps = in.num_inference_steps ? in.num_inference_steps : g.num_inference_steps;
  c.guidance_scale = in.guidance_scale ? in.guidance_scale : g.guidance_scale;
  c.true_cfg_scale = in.true_cfg_scale ? in.true_cfg_scale : g.true_cfg_scale;
  c.guidance_scale_2 = in.guidance_scale_2 ? in.guidance_scale_2 : g.guidance_scale_2;
  c.max_sequence_length = in.max_sequence_length ? in.max_sequence_length : g.max_sequence_length;
  c.flow_shift = g.flow_shift;
  c.input_images = in.input_images.empty() ? g.input_images : in.input_images;
  c.latents.clear();
  c.dataset_path.clear();
  c.resume = false;
  c.batch_size.reset();
  validate_values(c);
  check_input_options(*args.spec, c);
  check_prompt_texts(c);
  resolve_inputs(args);
  for (const auto& [name, scale] : in.lora_scales) {
    auto it = std::find_if(args.lora.begin(), args.lora.end(),
                           [&](const models::LoraSpec& l) { return l.name == name; });
    std::string loaded;
    for (const auto& l : args.lora) loaded += (loaded.empty() ? "" : ", ") + l.name;
    XF_CHECK(it != args.lora.end(), "--lora_scales: no LoRA adapter '", name, "' is loaded (",
             loaded.empty() ? std::string("none is") : "loaded: " + loaded, ")");
    XF_CHECK(std::isfinite(scale), "--lora_scales: adapter '", name, "' needs a finite scale");
    XF_CHECK(!args.lora_fused || scale == it->scale, "--lora_scales: adapter '", name,
             "' is fused into the weights at scale ", format_double(it->scale),
             "; other scales need the service started with --lora_mode unfused");
    it->scale = scale;  // as the outputs record it
  }
  args.total_prompts = static_cast<int64_t>(in.prompts.size());
  std::vector<int64_t> rows(in.prompts.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  fill_request(args, in.prompts, in.negative_prompts, in.seeds, rows);
  args.request.lora_scales = in.lora_scales;
  return args;
}

void Runner::fill_request(ResolvedArgs& args, const std::vector<std::string>& prompts,
                          const std::vector<std::optional<std::string>>& negatives,
                          const std::vector<int64_t>& seeds,
                          const std::vector<int64_t>& pending) const {
  const RunConfig& c = args.config;
  // Data parallel: prompts strided over the dp groups (prompts[dp_rank::dp], as xDiT); each
  // keeps its global index for its file name, so the union equals a one-rank run.
  auto& r = args.request;
  const bool any_negative =
      std::any_of(negatives.begin(), negatives.end(), [](const auto& n) { return n.has_value(); });
  const int dp = groups_ ? groups_->config().dp() : 1;
  const int dp_rank = groups_ ? groups_->coords().dp : 0;
  for (size_t k = dp_rank; k < pending.size(); k += dp) {
    const int64_t i = pending[k];
    r.prompts.push_back(prompts[i]);
    if (any_negative) r.negative_prompts.push_back(negatives[i].value_or(""));
    args.has_negative.push_back(negatives[i].has_value());
    r.seeds.push_back(seeds[i]);
    args.prompt_indices.push_back(i);
  }
  if (!c.latents.empty()) {
    // Row i of the file is prompt i's; this group keeps the rows of its prompts.
    const at::Tensor all = models::SafetensorsFile(c.latents).get("latents");
    XF_CHECK(all.dim() >= 2 && all.size(0) == args.total_prompts, "--latents ", c.latents,
             ": tensor 'latents' is ", xfuser::shape_string(all.sizes()),
             "; its first dimension must be the ", args.total_prompts, " prompt(s) of this run");
    check_initial_latents(all, "--latents " + c.latents);
    std::vector<int64_t> rows(args.prompt_indices.begin(), args.prompt_indices.end());
    r.latents =
        rows.empty() ? at::Tensor() : all.index_select(0, at::tensor(rows, at::kLong)).clone();
  }
  r.height = *c.height;
  r.width = *c.width;
  r.num_inference_steps = *c.num_inference_steps;
  r.guidance_scale = *c.guidance_scale;
  r.true_cfg_scale = *c.true_cfg_scale;
  r.max_sequence_length = *c.max_sequence_length;
  r.num_frames = c.num_frames.value_or(0);
  r.flow_shift = c.flow_shift;
  r.flow_sigmas = c.flow_sigmas;
  r.guidance_scale_2 = c.guidance_scale_2;
  r.num_pipeline_patch = c.num_pipeline_patch;
  r.pipefusion_warmup_steps = c.pipefusion_warmup_steps;
}

fs::path resolve_model_dir(const ResolvedArgs& args) {
  const models::ModelSpec& spec = *args.spec;
  fs::path dir;
  if (!args.config.model_path.empty()) {
    dir = args.config.model_path;
  } else if (spec.embedded_dir) {
    dir = spec.embedded_dir();
  } else {
    XF_CHECK(!spec.hf_repo.empty(), "model ", spec.id,
             " has no Hugging Face repo: pass --model_path with its pipeline folder");
    dir = models::find_in_hub_cache(spec.hf_repo);
  }
  models::check_pipeline_folder(dir);
  return dir;
}

models::RunLayout run_layout(const ResolvedArgs& args) {
  const RunConfig& c = args.config;
  models::RunLayout l;
  l.ulysses = c.ulysses_degree;
  l.ring = c.ring_degree;
  l.pipefusion = c.pipefusion_parallel_degree;
  l.tensor = c.tensor_parallel_degree;
  l.cfg = c.use_cfg_parallel ? 2 : 1;
  l.data = c.data_parallel_degree;
  l.pipefusion_layers = c.pipefusion_layers;
  l.num_pipeline_patch = c.num_pipeline_patch;
  l.height = c.height.value_or(0);
  l.width = c.width.value_or(0);
  l.max_sequence_length = c.max_sequence_length.value_or(0);
  l.num_frames = c.num_frames.value_or(0);
  l.input_images = static_cast<int>(c.input_images.size());
  for (const at::Tensor& picture : args.request.input_images) {
    l.input_image_sizes.emplace_back(picture.size(0), picture.size(1));
  }
  l.batch_size = args.batch_size > 0
                     ? args.batch_size
                     : std::max<int>(1, static_cast<int>(args.request.prompts.size()));
  l.true_cfg =
      c.true_cfg_scale.value_or(1.0) > 1.0 && !args.has_negative.empty() &&
      std::all_of(args.has_negative.begin(), args.has_negative.end(), [](bool b) { return b; });
  // A dp group without prompts has nothing to check against true CFG.
  if (args.has_negative.empty())
    l.true_cfg = c.true_cfg_scale.value_or(1.0) > 1.0 && !c.negative_prompt.empty();
  l.guidance_scale = args.request.guidance_scale;
  l.enable_tiling = c.enable_tiling;
  l.bytes_per_element = static_cast<int>(c10::elementSize(args.dtype));
  l.transformer_bytes_per_element =
      args.transformer_weights.kind == models::WeightFormat::Kind::kAsLoaded ? l.bytes_per_element
                                                                             : 1;
  l.threads = at::get_num_threads();
  l.fsdp = c.use_fsdp ? c.ulysses_degree * c.ring_degree * (c.use_cfg_parallel ? 2 : 1) : 1;
  l.cpu = args.device.is_cpu();
  return l;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0, total = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:" || key == "SwapFree:") total += value * 1024;
  }
  return total;
}

std::optional<models::MemoryEstimate> estimate_memory(const ResolvedArgs& args,
                                                      const fs::path& model_dir,
                                                      const models::RunLayout& layout) {
  XF_CONTEXT("checking the run against ", model_dir.string());
  models::check_component_classes(*args.spec, model_dir);
  models::schedulers::check_scheduler_folder(model_dir / "scheduler");
  if (!args.spec->check_run) return std::nullopt;
  return args.spec->check_run(model_dir, layout);
}

std::vector<std::pair<std::string, std::vector<int>>> Runner::layout_groups() const {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  if (!groups_) return out;
  for (parallel::MeshDim dim : parallel::kAllMeshDims) {
    const parallel::Communicator& g = groups_->group(dim);
    out.emplace_back(g.name(), g.world_ranks());
  }
  if (groups_->fsdp()) out.emplace_back(groups_->fsdp()->name(), groups_->fsdp()->world_ranks());
  return out;
}

int print_memory_plan(const RunConfig& given) {
  // A plan for a GPU needs none here: the flags resolve as for the CPU, and the plan leaves out
  // the CPU kernels' buffers.
  RunConfig config = given;
  const bool gpu = given.device.rfind("cuda", 0) == 0;
  if (gpu) config.device = "cpu";
  Runner runner(config);
  const ResolvedArgs args = runner.preprocess_args();
  const RunConfig& c = args.config;
  const fs::path dir = resolve_model_dir(args);
  models::RunLayout l = run_layout(args);
  if (gpu) l.cpu = false;
  const auto m = estimate_memory(args, dir, l);
  XF_CHECK(m.has_value(), "--dry_run: ", args.spec->id, " has no memory model");
  auto gib = [](uint64_t b) {
    if (b < (uint64_t{1} << 30)) return format_double(std::round(b / 1048576.0 * 10) / 10) + " MiB";
    return format_double(std::round(b / 1073741824.0 * 1000) / 1000) + " GiB";
  };
  const int world = l.ulysses * l.ring * l.cfg * l.pipefusion * l.tensor * l.data;
  std::string how;
  if (c.use_fsdp) how += ", --use_fsdp over " + std::to_string(l.fsdp) + " ranks";
  if (c.hybrid_fsdp) how += " (--hybrid_fsdp: the plan assumes each group on one host)";
  if (args.transformer_weights.kind != models::WeightFormat::Kind::kAsLoaded) {
    how += ", transformer weights " + weights_name(args.transformer_weights);
  }
  std::printf("plan: %s from %s\n", args.spec->id.c_str(), dir.string().c_str());
  std::printf(
      "run: %dx%d%s, batch %d, %s, %d rank(s) (ulysses %d, ring %d, cfg %d, pipefusion "
      "%d, tensor %d, data %d)%s\n",
      l.height, l.width,
      l.num_frames > 0 ? (", " + std::to_string(l.num_frames) + " frames").c_str() : "",
      l.batch_size, c.dtype.c_str(), world, l.ulysses, l.ring, l.cfg, l.pipefusion, l.tensor,
      l.data, how.c_str());
  std::printf("per rank on %s: weights %s + activations at the peak %s = %s\n",
              gpu ? "a GPU" : backends::device_name(args.device).c_str(), gib(m->weights).c_str(),
              gib(m->activations()).c_str(), gib(m->total()).c_str());
  std::printf(
      "activations by stage: text encoders %s, input picture encode %s, one denoising step %s "
      "(communication buffers %s), VAE decode %s\n",
      gib(m->text_encoders).c_str(), gib(m->image_encode).c_str(), gib(m->transformer).c_str(),
      gib(m->comm).c_str(), gib(m->vae).c_str());
  // The same in bytes, for scripts (bench/run_plan).
  auto u = [](uint64_t b) { return static_cast<unsigned long long>(b); };
  std::printf(
      "plan_bytes: weights=%llu activations=%llu total=%llu text_encoders=%llu "
      "image_encode=%llu transformer=%llu comm=%llu vae=%llu\n",
      u(m->weights), u(m->activations()), u(m->total()), u(m->text_encoders), u(m->image_encode),
      u(m->transformer), u(m->comm), u(m->vae));
  if (args.offload != models::OffloadMode::kNone) {
    std::printf(
        "note: --enable_%s_cpu_offload keeps the weights in host memory; the device "
        "holds one component or block at a time (docs/offload.md)\n",
        models::offload_mode_name(args.offload));
  }
  if (c.device_memory_gib > 0) {
    const auto have = static_cast<uint64_t>(c.device_memory_gib * 1073741824.0);
    const bool fits = m->total() <= have;
    std::printf("device memory %s: %s\n", gib(have).c_str(), fits ? "fits" : "does not fit");
    if (!fits) return 1;
  }
  return 0;
}

std::optional<models::MemoryEstimate> check_before_loading(const ResolvedArgs& args,
                                                           const fs::path& model_dir,
                                                           const models::RunLayout& layout) {
  const auto estimate = estimate_memory(args, model_dir, layout);
  if (!estimate) return std::nullopt;
  const models::MemoryEstimate m = *estimate;
  // Ranks on this node share its memory.
  int local = 1;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
    local = std::max(1, std::atoi(env));
  const uint64_t need = m.total() * static_cast<uint64_t>(local);
  const uint64_t have = available_memory_bytes();
  auto gib = [](uint64_t b) {
    return format_double(std::round(b / 1073741824.0 * 100) / 100) + " GiB";
  };
  XF_CHECK(have == 0 || need <= have, "this run needs about ", gib(need), " of memory (",
           local > 1 ? std::to_string(local) + " ranks x " : std::string(), "weights ",
           gib(m.weights), ", activations ", gib(m.activations()), " per rank at ",
           args.config.height.value_or(0), "x", args.config.width.value_or(0), ", batch ",
           layout.batch_size, ", ", args.config.dtype, "), but ", gib(have),
           " is available (MemAvailable + SwapFree): lower --height/--width or --batch_size, use "
           "--enable_tiling, or spread the model over more ranks");
  return m;
}

fs::path output_path(const ResolvedArgs& args, int64_t index) {
  const RunConfig& c = args.config;
  return fs::path(c.output_directory) /
         output_file_name(args.spec->id, c.ulysses_degree, c.ring_degree, c.use_torch_compile,
                          c.height.value_or(0), c.width.value_or(0), index,
                          is_video(args) ? "mp4" : "png",
                          {c.tensor_parallel_degree, c.pipefusion_parallel_degree,
                           c.use_cfg_parallel ? 2 : 1, c.data_parallel_degree},
                          c.task);
}

void Runner::initialize(const ResolvedArgs& args) {
  const models::ModelSpec& spec = *args.spec;
  ensure_writable_directory(args.config.output_directory);
  lock_output_directory();
  if (!groups_ || groups_->rank() == 0) {
    remove_stale_temp_files(args, groups_ ? groups_->config().world_size() : 1);
  }
  check_free_space(args.config.output_directory, estimated_output_bytes(args),
                   "this rank's images and reports");
  check_stop_requested("before loading the model");
  if (groups_) {
    // Where every rank runs (its host name), for the report's group layout and a warning when
    // a group that talks every layer (Ulysses, tensor, FSDP) crosses hosts.
    char name[64] = {};
    ::gethostname(name, sizeof(name) - 1);
    at::Tensor mine = at::zeros({64}, at::kByte);
    std::memcpy(mine.data_ptr<uint8_t>(), name, std::strlen(name));
    const at::Tensor all = groups_->world().all_gather(mine, 0).contiguous();
    hosts_.clear();
    for (int r = 0; r < groups_->config().world_size(); ++r) {
      const auto* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + 64 * r;
      hosts_.emplace_back(p, strnlen(p, 64));
    }
    if (groups_->rank() == 0) {
      for (const auto& [label, members] : layout_groups()) {
        std::set<std::string> on;
        for (int m : members) on.insert(hosts_[m]);
        if (on.size() > 1 && (label.rfind("ulysses", 0) == 0 || label.rfind("tp", 0) == 0)) {
          spdlog::warn(
              "group {} spans {} hosts: its all-to-alls (Ulysses) or all-reduces (tensor "
              "parallel) run every layer over the network; launch so that its ranks share a "
              "host (consecutive ranks per host: mpirun --map-by slot, or fewer ranks of this "
              "degree than GPUs per host)",
              label, on.size());
        }
      }
    }
  }
  model_dir_ = resolve_model_dir(args);
  // The layout against the model's configs and the memory the run needs, before any weight.
  models::RunLayout layout = run_layout(args);
  if (args.config.use_fsdp && args.config.hybrid_fsdp && groups_) {
    layout.fsdp = static_cast<int>(groups_->fsdp_members(groups_->rank(), hosts_).size());
  }
  plan_ = check_before_loading(args, model_dir_, layout);
  spdlog::info("loading {} from {} ({})", spec.id, model_dir_.string(), args.config.dtype);
  backends::set_default_attention_kernel(args.attention_kernel);
  backends::reset_attention_kernel_calls();
  backends::set_fp32_math(args.dtype, args.device);
  model_ = spec.create(spec);
  model_->set_process_groups(groups_);
  models::ModelLoadOptions options;
  options.dtype = args.dtype;
  options.device = args.device;
  options.enable_tiling = args.config.enable_tiling;
  options.enable_slicing = args.config.enable_slicing;
  options.compile = args.config.use_torch_compile;
  if (const char* env = std::getenv("XFUSER_KERNEL_OVERRIDES")) {
    options.kernel_overrides = std::string(env) != "0";
  }
  options.pipefusion_layers = args.config.pipefusion_layers;
  options.parallel_vae = args.config.use_parallel_vae;
  options.transformer_weights = args.transformer_weights;
  options.offload = args.offload;
  options.cache = args.cache;
  options.lora = args.lora;
  options.lora_fused = args.lora_fused;
  if (args.config.use_fsdp) {
    groups_->create_fsdp_group(args.config.hybrid_fsdp ? hosts_ : std::vector<std::string>{});
    options.fsdp = true;
    spdlog::info("--use_fsdp: every component but the VAE sharded over group '{}'",
                 groups_->fsdp()->name());
  }
  model_->load(model_dir_, options);
  // The generations' peaks (each stage's, XFuserModel::peak_tensor_bytes) are measured from
  // here: what they hold beyond the loaded model.
  const backends::TensorMemory loaded = backends::tensor_memory(args.device);
  load_peak_tensor_bytes_ = loaded.peak;
  loaded_tensor_bytes_ = loaded.allocated;
  for (const auto& e : model_->backend_timeline()) {
    spdlog::debug("backend {}: op {} runs {} ({})", e.backend, e.tag, e.chosen,
                  e.attempts.front().reason);
  }
  // Progress on a terminal; after every step, a SIGTERM/SIGINT received stops the run.
  model_->set_step_callback([tty = isatty(STDERR_FILENO) != 0](int step, int total) {
    spdlog::debug("denoising step {}/{}", step, total);
    if (tty) {
      std::fprintf(stderr, "\rdenoising step %d/%d", step, total);
      if (step == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    }
    check_stop_requested("after denoising step " + std::to_string(step) + "/" +
                         std::to_string(total));
  });
}

void Runner::lock_output_directory() const {
  // One rank per job holds the lock: ranks of one job share the folder.
  if (lock_ || (groups_ && groups_->rank() != 0)) return;
  lock_ = std::make_unique<OutputDirectoryLock>(config_.output_directory);
}

uint64_t Runner::estimated_output_bytes(const ResolvedArgs& args) const {
  // PNG: at most the raw pixels plus one filter byte per row, deflate's stored-block overhead
  // (5 bytes per 64 KiB) and the text chunks; the JSON reports are small.
  const uint64_t raw = static_cast<uint64_t>(args.request.height) *
                       (static_cast<uint64_t>(args.request.width) * 3 + 1);
  const uint64_t per_image = raw + raw / 8192 + 16384;
  const uint64_t images = writes_images() ? args.request.prompts.size() : 0;
  if (is_video(args)) {
    // An H.264 video at high quality stays well under a quarter of its raw frames; with
    // --output_type frames every frame's PNG as well.
    const uint64_t frames = static_cast<uint64_t>(std::max(args.request.num_frames, 1));
    const uint64_t per_video =
        frames * (raw / 4 + (args.config.output_type == "frames" ? per_image : 0));
    return images * per_video + (1u << 20);
  }
  return images * per_image + (1u << 20);
}

RunResult Runner::run(const ResolvedArgs& args) {
  XF_CHECK(model_ != nullptr, "Runner::run called before initialize");
  if (args.batch_size > 0) return run_batched(args);
  RunResult result;
  if (args.request.prompts.empty()) {
    // More data-parallel groups than prompts: this group has nothing to generate.
    spdlog::info("no prompt for this data-parallel group");
    return result;
  }
  for (int i = 0; i < args.config.warmup_calls; ++i) {
    check_stop_requested("before warm-up call " + std::to_string(i + 1));
    spdlog::info("warm-up call {}/{}", i + 1, args.config.warmup_calls);
    model_->generate(args.request);
  }
  for (int i = 0; i < args.config.num_iterations; ++i) {
    check_stop_requested("before iteration " + std::to_string(i + 1));
    if (groups_) groups_->reset_stats();  // count each timed iteration on its own
    auto out = model_->generate(args.request);
    check_finite(args, out);
    if (groups_) result.comm.push_back(groups_->stats());
    result.iteration_prompts.push_back(args.prompt_indices);
    spdlog::info("iteration {}/{}: {:.3f} s", i + 1, args.config.num_iterations, out.total_seconds);
    result.iteration_seconds.push_back(out.total_seconds);
    result.images = out.images;
    result.iterations.push_back(std::move(out));
  }
  if (args.config.pipefusion_psnr) {
    // The exact image: every step a synchronous warm-up step (equal to a serial run).
    auto exact = args.request;
    exact.pipefusion_warmup_steps = exact.num_inference_steps;
    spdlog::info("PipeFusion PSNR: generating the exact image ({} warm-up steps)",
                 exact.num_inference_steps);
    auto out = model_->generate(exact);
    result.pipefusion_psnr = models::dit::image_psnr(result.images, out.images);
    spdlog::info("PipeFusion PSNR vs exact: {:.2f} dB ({} patches, {} warm-up step(s))",
                 *result.pipefusion_psnr,
                 args.config.num_pipeline_patch > 0 ? args.config.num_pipeline_patch
                                                    : args.config.pipefusion_parallel_degree,
                 args.config.pipefusion_warmup_steps);
  }
  return result;
}

models::GenerationOutput Runner::generate(const ResolvedArgs& args) {
  XF_CHECK(model_ != nullptr, "Runner::generate called before initialize");
  auto out = model_->generate(args.request);
  check_finite(args, out);
  return out;
}

std::map<std::string, std::string> Runner::output_text(const ResolvedArgs& args,
                                                       size_t index) const {
  XF_CHECK(index < args.request.prompts.size(), "Runner::output_text: prompt ", index, " of ",
           args.request.prompts.size());
  std::optional<std::string> negative;
  if (args.has_negative.size() > index && args.has_negative[index]) {
    negative = args.request.negative_prompts[index];
  }
  return generation_text(args, args.request.prompts[index], negative, args.request.seeds[index]);
}

models::XFuserModel& Runner::model() {
  XF_CHECK(model_ != nullptr, "Runner::model called before initialize");
  return *model_;
}

void Runner::check_finite(const ResolvedArgs& args, const models::GenerationOutput& out) const {
  if (!out.latents.defined()) return;
  // One reduction over the final latents: a NaN or Inf in any step propagates to them.
  if (at::isfinite(out.latents).all().item<bool>()) return;
  int64_t bad_rows = 0;
  const at::Tensor per_row = at::isfinite(out.latents.reshape({out.latents.size(0), -1})).all(1);
  bad_rows = out.latents.size(0) - per_row.sum().item<int64_t>();
  XF_THROW("the latents are not finite (NaN or Inf) after the ", args.request.num_inference_steps,
           " denoising steps (", bad_rows, " of ", out.latents.size(0),
           " prompt(s) of the batch); the image would be black. Likely cause: ",
           likely_nonfinite_cause(args));
}

fs::path Runner::write_image(const ResolvedArgs& args, size_t i, const at::Tensor& image) const {
  const fs::path path = output_path(args, args.prompt_indices[i]);
  write_output(args, i, image, path);
  return path;
}

void Runner::write_output(const ResolvedArgs& args, size_t i, const at::Tensor& image,
                          const fs::path& path) const {
  const auto text = output_text(args, i);
  if (image.dim() == 4) {  // a video [F, H, W, 3]
    XF_CHECK(is_video(args), args.spec->id, " returned a video for an image model");
    if (args.config.output_type == "frames") {
      for (int64_t k = 0; k < image.size(0); ++k) {
        auto frame_text = text;
        frame_text["frame"] = std::to_string(k);
        write_png(frame_path(path, k), image[k], frame_text);
      }
    }
    write_mp4(path, image, args.config.fps.value_or(16), video_metadata(text));
    return;
  }
  write_png(path, image, text);
}

fs::path Runner::write_latents(const ResolvedArgs& args, size_t i,
                               const models::GenerationOutput& out, int64_t row) const {
  fs::path path = output_path(args, args.prompt_indices[i]);
  path.replace_extension(".latents.safetensors");
  XF_CHECK(out.initial_latents.defined() && out.latents.defined(), args.spec->id,
           " reports no latents to save (--save_latents)");
  models::save_safetensors(path.string(),
                           {{"latents", out.initial_latents.narrow(0, row, 1).to(at::kFloat)},
                            {"final_latents", out.latents.narrow(0, row, 1).to(at::kFloat)}},
                           {{"model", args.spec->id},
                            {"prompt", args.request.prompts[i]},
                            {"seed", std::to_string(args.request.seeds[i])}});
  return path;
}

RunResult Runner::run_batched(const ResolvedArgs& args) {
  RunResult result;
  const auto& req = args.request;
  const size_t n = req.prompts.size();
  if (n == 0) {
    spdlog::info("no prompt left for this data-parallel group");
    return result;
  }
  // Batches of B consecutive prompts of this group; a batch whose rows differ in true CFG (a
  // negative prompt or not) runs as two generate() calls, one per kind, timed together.
  const size_t b = static_cast<size_t>(args.batch_size);
  std::vector<std::vector<std::vector<size_t>>> batches;  // batch -> call -> local indices
  for (size_t start = 0; start < n; start += b) {
    std::vector<size_t> with, without;
    for (size_t i = start; i < std::min(n, start + b); ++i) {
      (args.has_negative[i] ? with : without).push_back(i);
    }
    batches.emplace_back();
    for (auto* part : {&without, &with}) {
      if (!part->empty()) batches.back().push_back(*part);
    }
  }
  auto sub_request = [&](const std::vector<size_t>& rows) {
    models::GenerationRequest r = req;
    r.prompts.clear();
    r.negative_prompts.clear();
    r.seeds.clear();
    for (size_t i : rows) {
      r.prompts.push_back(req.prompts[i]);
      if (args.has_negative[i]) r.negative_prompts.push_back(req.negative_prompts[i]);
      r.seeds.push_back(req.seeds[i]);
    }
    if (req.latents.defined()) {
      std::vector<int64_t> picked(rows.begin(), rows.end());
      r.latents = req.latents.index_select(0, at::tensor(picked, at::kLong));
    }
    return r;
  };
  for (int i = 0; i < args.config.warmup_calls; ++i) {
    spdlog::info("warm-up call {}/{} (first batch)", i + 1, args.config.warmup_calls);
    for (const auto& call : batches.front()) model_->generate(sub_request(call));
  }
  const bool writer = writes_images();
  // World rank 0 shows the progress of its data-parallel group (images and steps); the writing
  // rank logs every image as it is written.
  const bool shows = rank() == 0;
  Progress progress(static_cast<int64_t>(n), shows && isatty(STDERR_FILENO), stderr, shows);
  if (shows) {
    spdlog::info("{} prompt(s) in {} batch(es) of up to {} on this data-parallel group", n,
                 batches.size(), b);
  }
  model_->set_step_callback([&progress](int step, int steps) {
    progress.step(step, steps);
    check_stop_requested("after denoising step " + std::to_string(step) + "/" +
                         std::to_string(steps));
  });
  int64_t written = 0;
  for (int it = 0; it < args.config.num_iterations; ++it) {
    for (const auto& batch : batches) {
      double seconds = 0;
      for (const auto& call : batch) {
        if (groups_) groups_->reset_stats();
        auto out = model_->generate(sub_request(call));
        check_finite(args, out);
        if (groups_) result.comm.push_back(groups_->stats());
        seconds += out.total_seconds;
        std::vector<int64_t> indices;
        for (size_t k = 0; k < call.size(); ++k) {
          indices.push_back(args.prompt_indices[call[k]]);
          // The first iteration writes the images, batch by batch (later ones only time).
          if (it == 0 && writer) {
            result.written.push_back(write_image(args, call[k], out.images[k]));
            if (args.config.save_latents) {
              result.written.push_back(write_latents(args, call[k], out, k));
            }
            spdlog::info("wrote {} ({}/{} on this data-parallel group)",
                         result.written.back().string(), ++written, n);
          }
        }
        result.iteration_prompts.push_back(std::move(indices));
        result.iterations.push_back(std::move(out));
      }
      result.iteration_seconds.push_back(seconds);
      if (it == 0) {
        size_t prompts = 0;
        for (const auto& call : batch) prompts += call.size();
        progress.batch_done(static_cast<int64_t>(prompts), seconds);
      }
    }
    if (args.config.num_iterations > 1) {
      spdlog::info("iteration {}/{} done", it + 1, args.config.num_iterations);
    }
  }
  model_->set_step_callback(nullptr);
  return result;
}

// timings.json of a batched run: every data-parallel group's batch times (group 0's batches,
// then group 1's, ...), gathered over the dp group of the writing rank.
std::vector<double> Runner::gather_batch_seconds(const ResolvedArgs& args,
                                                 const std::vector<double>& mine) const {
  if (!groups_ || groups_->config().dp() == 1) return mine;
  parallel::Communicator& dp = groups_->dp();
  at::Tensor count = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  const at::Tensor counts = dp.all_gather(count);  // [dp]
  const int64_t most = counts.max().item<int64_t>();
  at::Tensor padded = at::zeros({std::max<int64_t>(most, 1)}, at::kDouble);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<double>());
  const at::Tensor all = dp.all_gather(padded).view({dp.size(), -1});  // [dp, most]
  std::vector<double> seconds;
  for (int g = 0; g < dp.size(); ++g) {
    for (int64_t i = 0; i < counts[g].item<int64_t>(); ++i) {
      seconds.push_back(all[g][i].item<double>());
    }
  }
  return seconds;
}

std::vector<fs::path> Runner::save(const ResolvedArgs& args, const RunResult& result) {
  const RunConfig& c = args.config;
  const fs::path dir = c.output_directory;
  const auto save_start = std::chrono::steady_clock::now();
  std::vector<fs::path> written = result.written;
  const int64_t images = writes_images() && result.images.defined() ? result.images.size(0) : 0;
  for (int64_t i = 0; i < images; ++i) {
    written.push_back(write_image(args, static_cast<size_t>(i), result.images[i]));
    if (c.save_latents && !result.iterations.empty()) {
      written.push_back(write_latents(args, static_cast<size_t>(i), result.iterations.back(), i));
    }
  }
  // --resume with nothing left to generate: the earlier run's reports stay as they are (never
  // replaced by empty ones).
  const bool nothing_ran = c.resume && result.iterations.empty();
  if (nothing_ran) {
    spdlog::info("--resume: nothing generated on this rank; its earlier timings_rank{}.json kept",
                 rank());
  }
  // Every rank: its own run report.
  if (!nothing_ran) {
    nlohmann::json report;
    report["schema"] = "xfuser.timings_rank";
    report["version"] = kRunReportSchemaVersion;
    report["rank"] = rank();
    report["world_size"] = groups_ ? groups_->config().world_size() : 1;
    report["model"] = args.spec->id;
    report["device"] = backends::device_name(args.device);
    // The plane of device tensors: "mpi+nccl", "mpi" (through host memory), or "none" (1 rank).
    report["comm_backend"] = groups_ ? groups_->world().backend() : "none";
    if (groups_ && !hosts_.empty()) {
      // The mesh as laid out: every rank's host, and each of this rank's groups with the hosts
      // of its members.
      nlohmann::json groups = nlohmann::json::object();
      for (const auto& [label, members] : layout_groups()) {
        nlohmann::json on = nlohmann::json::array();
        for (int m : members) on.push_back(hosts_[m]);
        groups[label] = on;
      }
      report["layout"] = {{"hosts", hosts_}, {"groups", groups}};
    }
    const char* attention_backend = backends::attention_kernel_name(args.attention_kernel);
    report["config"] = {{"height", args.request.height},
                        {"width", args.request.width},
                        {"num_inference_steps", args.request.num_inference_steps},
                        {"guidance_scale", args.request.guidance_scale},
                        {"true_cfg_scale", args.request.true_cfg_scale},
                        {"max_sequence_length", args.request.max_sequence_length},
                        {"seed", c.seed},
                        {"dtype", c.dtype},
                        {"transformer_weights", weights_name(args.transformer_weights)},
                        {"cpu_offload", models::offload_mode_name(args.offload)},
                        {"use_fsdp", c.use_fsdp},
                        {"hybrid_fsdp", c.hybrid_fsdp},
                        {"prompts", args.request.prompts.size()},
                        {"batch_size", args.batch_size},
                        {"dataset_path", c.dataset_path},
                        {"resume", c.resume},
                        {"total_prompts", args.total_prompts},
                        {"skipped_prompts", args.skipped_prompts},
                        {"prompt_indices", args.prompt_indices},
                        {"ulysses_degree", c.ulysses_degree},
                        {"ring_degree", c.ring_degree},
                        {"pipefusion_parallel_degree", c.pipefusion_parallel_degree},
                        {"tensor_parallel_degree", c.tensor_parallel_degree},
                        {"data_parallel_degree", c.data_parallel_degree},
                        {"use_cfg_parallel", c.use_cfg_parallel},
                        {"use_torch_compile", c.use_torch_compile},
                        {"attention_backend", attention_backend},
                        {"warmup_calls", c.warmup_calls},
                        {"num_iterations", c.num_iterations},
                        {"threads", at::get_num_threads()}};
    if (args.cache.enabled()) report["config"]["cache"] = cache_description(args.cache);
    if (!args.lora.empty()) report["config"]["lora"] = lora_description(args);
    nlohmann::json iterations = nlohmann::json::array();
    for (size_t i = 0; i < result.iterations.size(); ++i) {
      const auto& it = result.iterations[i];
      nlohmann::json stages = nlohmann::json::array();
      double stage_sum = 0;
      for (const auto& st : it.timings) {
        nlohmann::json e = {{"name", st.name}, {"seconds", st.seconds}};
        if (st.index >= 0) e["step"] = st.index;
        if (st.peak_tensor_bytes >= 0) e["peak_tensor_bytes"] = st.peak_tensor_bytes;
        stages.push_back(e);
        stage_sum += st.seconds;
      }
      nlohmann::json comm = nlohmann::json::object();
      if (i < result.comm.size()) {
        for (const auto& [group, ops] : result.comm[i]) {
          for (const auto& [op, st] : ops) {
            comm[group][op] = {{"calls", st.calls}, {"bytes", st.bytes}, {"seconds", st.seconds}};
          }
        }
      }
      nlohmann::json prompts = nlohmann::json::array();
      if (i < result.iteration_prompts.size()) prompts = result.iteration_prompts[i];
      nlohmann::json entry = {{"total_seconds", it.total_seconds},
                              {"prompt_indices", prompts},
                              {"stages_seconds", stage_sum},
                              {"stages", stages},
                              {"comm", comm}};
      if (it.cache.method != models::CacheMethod::kNone) entry["cache"] = cache_json(it.cache);
      iterations.push_back(entry);
    }
    report["iterations"] = iterations;
    nlohmann::json timeline = nlohmann::json::array();
    if (model_) {
      for (const auto& e : model_->backend_timeline()) {
        nlohmann::json attempts = nlohmann::json::array();
        for (const auto& a : e.attempts) {
          attempts.push_back({{"level", a.level}, {"ok", a.ok}, {"reason", a.reason}});
        }
        timeline.push_back(
            {{"tag", e.tag}, {"backend", e.backend}, {"chosen", e.chosen}, {"attempts", attempts}});
      }
    }
    report["backend_timeline"] = timeline;
    // Attention calls per kernel that ran on this rank since initialize (warm-up included).
    report["attention_kernel_calls"] = backends::attention_kernel_calls();
    if (c.pipefusion_parallel_degree > 1) {
      nlohmann::json pf = {
          {"stage", groups_ ? groups_->coords().pp : 0},
          {"patches",
           c.num_pipeline_patch > 0 ? c.num_pipeline_patch : c.pipefusion_parallel_degree},
          {"warmup_steps", c.pipefusion_warmup_steps},
          {"layers", c.pipefusion_layers},
          {"exact", c.pipefusion_warmup_steps >= args.request.num_inference_steps}};
      // null: identical images (infinite PSNR) or not measured (no --pipefusion_psnr).
      pf["psnr_db"] = nullptr;
      if (result.pipefusion_psnr && std::isfinite(*result.pipefusion_psnr)) {
        pf["psnr_db"] = *result.pipefusion_psnr;
      }
      pf["psnr_measured"] = result.pipefusion_psnr.has_value();
      report["pipefusion"] = pf;
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    report["memory"] = {{"peak_rss_bytes", static_cast<int64_t>(usage.ru_maxrss) * 1024},
                        {"device", backends::device_name(args.device)}};
    if (model_)
      report["memory"]["transformer_parameter_bytes"] = model_->transformer_parameter_bytes();
    if (model_ && model_->offloader()) {
      // Parameter bytes on the device under CPU offload (what a GPU holds of the weights).
      const models::OffloadStats o = model_->offloader()->stats();
      report["memory"]["offload"] = {{"mode", models::offload_mode_name(args.offload)},
                                     {"components", o.components},
                                     {"streamed_blocks", o.blocks},
                                     {"onloads", o.onloads},
                                     {"onload_bytes", o.onload_bytes},
                                     {"peak_resident_parameter_bytes", o.peak_resident_bytes},
                                     {"bound_bytes", o.bound_bytes},
                                     {"largest_component_bytes", o.largest_component_bytes},
                                     {"largest_block_bytes", o.largest_block_bytes},
                                     {"peak_streamed_parameter_bytes", o.peak_streamed_bytes},
                                     {"streamed_bound_bytes", o.streamed_bound_bytes}};
    }
    if (model_ && model_->fsdp()) {
      // Parameter bytes this rank holds under FSDP: its shards, what is replicated, and the
      // whole parameters gathered at the peak, against the bound (shards + two blocks, or a
      // component's rest and one block).
      const models::FsdpStats f = model_->fsdp()->stats();
      report["memory"]["fsdp"] = {{"group", model_->fsdp()->group().name()},
                                  {"group_size", f.group_size},
                                  {"components", f.components},
                                  {"blocks", f.blocks},
                                  {"model_parameter_bytes", f.model_bytes},
                                  {"shard_bytes", f.shard_bytes},
                                  {"replicated_bytes", f.replicated_bytes},
                                  {"peak_gathered_bytes", f.peak_gathered_bytes},
                                  {"peak_resident_parameter_bytes", f.peak_resident_bytes},
                                  {"bound_bytes", f.bound_bytes},
                                  {"largest_block_bytes", f.largest_block_bytes},
                                  {"largest_rest_bytes", f.largest_rest_bytes},
                                  {"gathers", f.gathers},
                                  {"gather_bytes", f.gather_bytes}};
    }
    if (model_ && model_->peak_tensor_bytes() >= 0) {
      // Measured, in the plan's terms: the parameters this rank holds, and the most its
      // generations held beyond the loaded model (activations, scratch, gathered blocks).
      const int64_t weights = model_->parameter_bytes();
      const int64_t generations =
          std::max<int64_t>(0, model_->peak_tensor_bytes() - loaded_tensor_bytes_);
      report["memory"]["measured"] = {{"weights_bytes", weights},
                                      {"generation_peak_bytes", generations},
                                      {"total_bytes", weights + generations},
                                      {"loaded_tensor_bytes", loaded_tensor_bytes_},
                                      {"load_peak_tensor_bytes", load_peak_tensor_bytes_}};
    }
    if (plan_) {
      // The pre-load estimate (what --dry_run prints), beside the measured peaks above.
      report["memory"]["plan"] = {{"weights_bytes", plan_->weights},
                                  {"activations_bytes", plan_->activations()},
                                  {"text_encoders_bytes", plan_->text_encoders},
                                  {"image_encode_bytes", plan_->image_encode},
                                  {"transformer_bytes", plan_->transformer},
                                  {"comm_bytes", plan_->comm},
                                  {"vae_bytes", plan_->vae},
                                  {"total_bytes", plan_->total()}};
      if (report["memory"].contains("measured")) {
        report["memory"]["plan"]["measured_over_plan"] =
            report["memory"]["measured"]["total_bytes"].get<double>() /
            static_cast<double>(std::max<uint64_t>(1, plan_->total()));
      }
    }
    const backends::DeviceMemoryStats dev_mem = backends::device_memory_stats(args.device);
    if (dev_mem.available) {
      // The caching allocator's view of the GPU: what tensors hold, what it keeps, and peaks
      // (the allocated peak was reset after loading: the larger of the loading's and since).
      report["memory"]["device_allocated_bytes"] = dev_mem.allocated;
      report["memory"]["device_reserved_bytes"] = dev_mem.reserved;
      report["memory"]["device_peak_allocated_bytes"] =
          std::max({dev_mem.peak_allocated, load_peak_tensor_bytes_,
                    model_ ? model_->peak_tensor_bytes() : 0});
      report["memory"]["device_peak_reserved_bytes"] = dev_mem.peak_reserved;
    }
    // Writing this rank's images (saving happens once, after the timed iterations).
    report["save_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
    const fs::path path = dir / ("timings_rank" + std::to_string(rank()) + ".json");
    write_file_atomic(path, report.dump(2) + "\n");
    written.push_back(path);
  }
  // Batched runs: every dp group's batches (a collective over the dp group: every rank joins).
  const std::vector<double> seconds = args.batch_size > 0
                                          ? gather_batch_seconds(args, result.iteration_seconds)
                                          : result.iteration_seconds;
  if (writes_timings() && c.resume && seconds.empty()) {
    spdlog::info("--resume: every output was complete; the earlier {} is kept",
                 (dir / "timings.json").string());
  } else if (writes_timings()) {
    nlohmann::json timings = seconds;
    write_file_atomic(dir / "timings.json", timings.dump() + "\n");
    written.push_back(dir / "timings.json");
  }
  return written;
}

fs::path Runner::profile(const ResolvedArgs& args) {
  XF_CHECK(model_ != nullptr, "Runner::profile called before initialize");
  const RunConfig& c = args.config;
  auto& recorder = profiling::TraceRecorder::instance();
  // A common clock: every rank leaves the barrier together and notes its own steady clock.
  if (groups_) groups_->world().barrier();
  profiling::TraceProcess process;
  process.clock_sync_us = profiling::now_us();
  process.rank = rank();
  process.world_size = groups_ ? groups_->config().world_size() : 1;
  recorder.set_process(process);
  profiling::TraceRecorder::set_thread_name("main");
  struct StopGuard {  // never leave the recorder on after an error
    ~StopGuard() { profiling::TraceRecorder::instance().stop(); }
  } stop_guard;
  const int total = c.profile_wait + c.profile_warmup + c.profile_active;
  for (int i = 0; i < total; ++i) {
    if (i == c.profile_wait) recorder.start({/*torch_ops=*/true});
    if (i == c.profile_wait + c.profile_warmup) recorder.clear();
    const char* phase = i < c.profile_wait                      ? "wait"
                        : i < c.profile_wait + c.profile_warmup ? "warmup"
                                                                : "active";
    spdlog::info("profile generation {}/{} ({})", i + 1, total, phase);
    profiling::Span span("run", "generation");
    span.arg("index", i).arg("phase", phase);
    if (!args.request.prompts.empty()) model_->generate(args.request);
  }
  recorder.stop();
  const fs::path path =
      fs::path(c.output_directory) / ("profile_trace_rank_" + std::to_string(rank()) + ".json");
  write_file_atomic(path, recorder.to_json().dump() + "\n");
  return path;
}

bool Runner::writes_images() const {
  if (!groups_) return true;
  const auto& w = groups_->config();
  const auto& r = groups_->coords();
  return r.tp == w.tp() - 1 && r.sp == w.sp() - 1 && r.pp == w.pp() - 1 && r.cfg == w.cfg() - 1;
}

int Runner::rank() const { return groups_ ? groups_->rank() : 0; }

bool Runner::writes_timings() const {
  return !groups_ || groups_->rank() == groups_->config().world_size() - 1;
}

void Runner::cleanup() { model_.reset(); }

}  // namespace xfuser::runner
