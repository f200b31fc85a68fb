// bench_e2e: the FLUX pipeline end to end through xfuser::runner::Runner: per-stage times and the
// runner's own overhead (time of a generation that is not inside the model's compute).
//
//   bench_e2e [--threads N] [--configs tiny,small] [--dtype fp32|bf16] [--iterations I]
//             [--warmup W] [--steps S] [--dir DIR] [--out FILE]
//
// Pipelines (written once to a temporary folder under --dir, default the system temp folder,
// removed at the end):
//   tiny   the embedded tiny-flux pipeline (models/flux/tiny_flux.h: CLIP + T5 + transformer with
//          2 heads of 16, 2 + 2 blocks + VAE 8..16 channels), 256x256 (256 image tokens),
//          64 text tokens;
//   small  the same folder with the transformer replaced by bench_flux's small config (4 heads of
//          128 = hidden 512, 4 double + 8 single blocks) except joint_attention_dim and
//          pooled_projection_dim = 32, which the tiny text encoders produce (bench_flux uses 512
//          and 128: only the context/pooled embedders differ); 512x512 (1024 image tokens on a
//          32x32 grid), 128 text tokens.
// Both run `--steps` (4) denoising steps, one prompt, guidance 3.5, seed 42.
//
// Two measurements per pipeline:
//   A. Runner (the user's path): preprocess_args, initialize (load), run() with `warmup`
//      untimed generations, run() with `iterations` timed ones, save(). Per iteration the
//      model's stage timings (encode_prompt, prepare_latents, every denoise_step, decode) and the
//      generation's wall time; save() timed on its own.
//        generate_overhead = generation wall time - sum of its stage times
//          (XFuserModel::generate's own work: request checks, state creation, the step loop);
//        run_loop_overhead = wall time of the timed run() / iterations - generation wall time
//          (Runner::run's loop, stats and logging).
//   B. The transformer forward inside a step: the same pipeline loaded through the registry as a
//      FluxModel (Runner does not expose its model). After every denoising step, the step
//      callback runs one SEPARATE transformer forward on inputs of identical shapes and dtype
//      (latents [1, N, 64], T5 embeddings [1, L, J], pooled [1, P], ids, timestep, guidance;
//      values differ, the dense compute does not depend on them) and times it, so each step is
//      paired with a forward measured right after it under the same machine load.
//      The attention hook also marks each forward's attention window (start of layer 0's
//      attention to the end of the last layer's), inside the step and inside the paired forward.
//        step_overhead = median over steps of
//          step time - (step's window + (paired forward time - paired forward's window))
//          i.e. the step's forward is its own measured window plus the part of a forward outside
//          the window (embedders, the first block's projections, the last block's tail,
//          norm_out/proj_out: ~1/blocks of the forward) taken from the paired forward. Noise in
//          the window, most of the forward, cancels: it is measured in the step itself.
//        step_overhead_direct = median over steps of (step time - paired forward time): the
//          plain estimate, as noisy as two separate forwards.
//      Either is what a step does outside the transformer: the scheduler step, the timestep and
//      guidance tensors, the state update. The attention time inside each step and inside its
//      paired forward is reported too: equal times show the forwards do the same work.
//   runner_overhead = generate_overhead + run_loop_overhead + steps * step_overhead, reported
//   as a fraction of the generation's wall time (target < 2%).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <numeric>

#include <spdlog/spdlog.h>

#include "bench/bench_common.h"
#include "bench/bench_flux_configs.h"
#include "models/common/component.h"
#include "models/flux/flux_pipeline.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "runner/runner.h"

namespace xb = xfuser::bench;
namespace fs = std::filesystem;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxModel;

namespace {

struct E2eConfig {
  std::string name;
  int size = 0;  // height = width
  int text_tokens = 0;
};

const std::vector<E2eConfig>& e2e_configs() {
  static const std::vector<E2eConfig> configs = {{"tiny", 256, 64}, {"small", 512, 128}};
  return configs;
}

// Replaces `dir`/transformer with bench_flux's small config (text dims of the tiny encoders),
// seeded random weights written like make_tiny_flux does (norm scales near 1).
void write_small_transformer(const fs::path& dir, uint64_t seed) {
  const xb::BenchConfig b = xb::select_configs("small", "configs").front();
  const fs::path t = dir / "transformer";
  fs::remove_all(t);
  fs::create_directories(t);
  const nlohmann::json config = {{"_class_name", "FluxTransformer2DModel"},
                                 {"_diffusers_version", "0.33.1"},
                                 {"patch_size", 1},
                                 {"in_channels", 64},
                                 {"out_channels", nullptr},
                                 {"num_layers", b.double_blocks},
                                 {"num_single_layers", b.single_blocks},
                                 {"attention_head_dim", 128},
                                 {"num_attention_heads", b.heads},
                                 {"joint_attention_dim", 32},
                                 {"pooled_projection_dim", 32},
                                 {"guidance_embeds", true},
                                 {"axes_dims_rope", {16, 56, 56}}};
  {
    std::ofstream f(t / "config.json");
    f << config.dump(2) << "\n";
    XF_CHECK(f.good(), "cannot write ", (t / "config.json").string());
  }
  xfuser::models::register_builtin_components();
  auto component = xfuser::models::ComponentRegistry::create("FluxTransformer2DModel", config,
                                                             (t / "config.json").string());
  component->init_random(seed, 0.02);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, slot] : component->named_parameters()) {
    at::Tensor w = slot->tensor.to(at::kFloat);
    const bool norm_scale = w.dim() == 1 && name.find("norm") != std::string::npos &&
                            name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    tensors[name] = (norm_scale ? w + 1.0 : w).contiguous();
  }
  xfuser::models::save_safetensors((t / "diffusion_pytorch_model.safetensors").string(), tensors,
                                   {{"format", "pt"}});
}

double stage_sum(const xfuser::models::GenerationOutput& g) {
  double s = 0;
  for (const auto& st : g.timings) s += st.seconds;
  return s;
}

nlohmann::json stages_json(const xfuser::models::GenerationOutput& g) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& st : g.timings) {
    nlohmann::json e = {{"name", st.name}, {"seconds", st.seconds}};
    if (st.index >= 0) e["step"] = st.index;
    a.push_back(e);
  }
  return a;
}

// Median over iterations of one stage; denoise_step: median over every step of every iteration.
double stage_median(const std::vector<xfuser::models::GenerationOutput>& its,
                    const std::string& name) {
  std::vector<double> v;
  for (const auto& g : its) {
    for (const auto& st : g.timings) {
      if (st.name == name) v.push_back(st.seconds);
    }
  }
  return v.empty() ? 0.0 : xb::median(v);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {});
    args.check_known(
        {"threads", "configs", "dtype", "iterations", "warmup", "steps", "dir", "out"});
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const bool openblas = xb::set_threads(threads);
    const int iterations = static_cast<int>(args.get_int("iterations", 2));
    const int warmup = static_cast<int>(args.get_int("warmup", 1));
    const int steps = static_cast<int>(args.get_int("steps", 4));
    XF_CHECK(iterations >= 1 && warmup >= 0 && steps >= 1,
             "--iterations and --steps must be >= 1, --warmup >= 0");
    std::vector<E2eConfig> configs;
    {
      const std::string list = "," + args.get("configs", "tiny,small") + ",";
      for (size_t start = 1; start < list.size();) {
        const size_t comma = list.find(',', start);
        const std::string item = list.substr(start, comma - start);
        bool known = item.empty();
        for (const auto& c : e2e_configs()) known = known || c.name == item;
        XF_CHECK(known, "--configs: unknown config '", item, "' (tiny, small)");
        start = comma + 1;
      }
      for (const auto& c : e2e_configs()) {
        if (list.find("," + c.name + ",") != std::string::npos) configs.push_back(c);
      }
      XF_CHECK(!configs.empty(), "--configs selects nothing");
    }
    const std::string dtype_flag = args.get("dtype", "");
    if (!dtype_flag.empty()) xb::parse_dtype(dtype_flag);  // fp32 / bf16 only
    spdlog::set_level(spdlog::level::warn);                // the runner's info lines off stdout

    const fs::path base =
        args.has("dir") ? fs::path(args.get("dir", "")) : fs::temp_directory_path();
    const fs::path root = base / ("xfuser-bench-e2e-" + std::to_string(::getpid()));
    fs::create_directories(root);
    struct Cleanup {
      fs::path p;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(p, ec);
      }
    } cleanup{root};

    nlohmann::json runs = nlohmann::json::array();
    for (const auto& ec : configs) {
      const fs::path dir = root / ec.name;
      double t0 = xb::now_seconds();
      xfuser::models::flux::make_tiny_flux(dir, 0);
      if (ec.name == "small") write_small_transformer(dir, 3);
      const double write_seconds = xb::now_seconds() - t0;

      // ---- A: through the Runner ---------------------------------------------------------
      xfuser::runner::RunConfig rc;
      rc.model = "tiny-flux";
      rc.model_path = dir.string();
      rc.prompt = {"a photo of a cat sitting on a wooden table in the morning light"};
      rc.height = ec.size;
      rc.width = ec.size;
      rc.num_inference_steps = steps;
      rc.max_sequence_length = ec.text_tokens;
      rc.dtype = dtype_flag;
      rc.output_directory = (root / ("out-" + ec.name)).string();
      xfuser::runner::Runner runner(rc);
      t0 = xb::now_seconds();
      const auto resolved = runner.preprocess_args();
      runner.initialize(resolved);
      const double init_seconds = xb::now_seconds() - t0;
      auto warm_args = resolved;
      warm_args.config.warmup_calls = warmup;
      warm_args.config.num_iterations = 0;
      t0 = xb::now_seconds();
      runner.run(warm_args);
      const double warmup_seconds = xb::now_seconds() - t0;
      auto timed_args = resolved;
      timed_args.config.warmup_calls = 0;
      timed_args.config.num_iterations = iterations;
      t0 = xb::now_seconds();
      const auto result = runner.run(timed_args);
      const double run_wall = xb::now_seconds() - t0;
      t0 = xb::now_seconds();
      const auto written = runner.save(timed_args, result);
      const double save_seconds = xb::now_seconds() - t0;
      runner.cleanup();
      XF_CHECK(result.images.defined() && result.images.size(1) == ec.size &&
                   result.images.size(2) == ec.size,
               "the run produced no ", ec.size, "x", ec.size, " image");

      std::vector<double> totals, gen_overheads;
      nlohmann::json iters = nlohmann::json::array();
      for (const auto& g : result.iterations) {
        totals.push_back(g.total_seconds);
        gen_overheads.push_back(g.total_seconds - stage_sum(g));
        iters.push_back({{"total_seconds", g.total_seconds},
                         {"stages_seconds", stage_sum(g)},
                         {"generate_overhead_seconds", g.total_seconds - stage_sum(g)},
                         {"stages", stages_json(g)}});
      }
      const double total_median = xb::median(totals);
      const double gen_overhead = xb::median(gen_overheads);
      const double run_loop_overhead =
          (run_wall - std::accumulate(totals.begin(), totals.end(), 0.0)) / iterations;

      // ---- B: the transformer forward inside a step ----------------------------------------
      const auto& spec = xfuser::models::ModelRegistry::find("tiny-flux");
      auto model = spec.create(spec);
      xfuser::models::ModelLoadOptions lo;
      lo.dtype = resolved.dtype;
      model->load(dir, lo);
      auto* flux = dynamic_cast<FluxModel*>(model.get());
      XF_CHECK(flux != nullptr, "tiny-flux did not create a FluxModel");
      auto& transformer = flux->transformer();
      // The attention hook times every attention call and marks the attention window of a
      // forward: from the start of layer 0's attention to the end of the last layer's.
      const int64_t last_layer =
          transformer.config().num_layers + transformer.config().num_single_layers - 1;
      double attention_seconds = 0, window_start = 0, window_end = 0;
      transformer.set_attention_hook([&, last_layer](const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v,
                                                     const xfuser::models::AttentionCall& c) {
        const double a0 = xb::now_seconds();
        if (c.layer == 0) window_start = a0;
        auto o = xfuser::models::local_attention(q, k, v, c);
        const double a1 = xb::now_seconds();
        attention_seconds += a1 - a0;
        if (c.layer == last_layer) window_end = a1;
        return o;
      });
      // Inputs with the shapes and dtype of a denoising step (FluxModel's denoise_step).
      const auto& tc = transformer.config();
      const auto dtype = resolved.dtype;
      const int64_t half = ec.size / (flux->vae_scale_factor() * 2);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      auto opts = at::TensorOptions().dtype(dtype);
      FluxInputs in;
      in.hidden_states = at::randn({1, half * half, tc.in_channels}, gen, opts);
      in.encoder_hidden_states = at::randn({1, ec.text_tokens, tc.joint_attention_dim}, gen, opts);
      in.pooled_projections = at::randn({1, tc.pooled_projection_dim}, gen, opts);
      in.timestep = at::full({1}, 0.75, at::kFloat).to(dtype);
      in.img_ids = FluxModel::latent_image_ids(half, half, dtype);
      in.txt_ids = at::zeros({ec.text_tokens, 3}, opts);
      in.guidance = at::full({1}, resolved.request.guidance_scale, at::kFloat);

      std::vector<double> fwd, fwd_attention, step_attention, step_window, fwd_window;
      bool measuring = false;
      double attention_at_step_start = 0;
      model->set_step_callback([&](int, int) {
        if (!measuring) return;
        step_attention.push_back(attention_seconds - attention_at_step_start);
        step_window.push_back(window_end - window_start);  // the step's forward
        const double a_before = attention_seconds;
        const double f0 = xb::now_seconds();
        transformer.forward(in);
        fwd.push_back(xb::now_seconds() - f0);
        fwd_attention.push_back(attention_seconds - a_before);
        fwd_window.push_back(window_end - window_start);
        attention_at_step_start = attention_seconds;
      });
      for (int i = 0; i < warmup; ++i) model->generate(resolved.request);
      measuring = true;
      attention_at_step_start = attention_seconds;
      const auto paired = model->generate(resolved.request);
      measuring = false;
      std::vector<double> step_times, step_minus_fwd, step_outside;
      for (const auto& st : paired.timings) {
        if (st.name == "denoise_step") step_times.push_back(st.seconds);
      }
      XF_CHECK(step_times.size() == fwd.size() && step_times.size() == size_t(steps), "expected ",
               steps, " steps paired with forwards, got ", step_times.size(), " and ", fwd.size());
      for (size_t i = 0; i < step_times.size(); ++i) {
        step_minus_fwd.push_back(step_times[i] - fwd[i]);
        // The step's forward = its attention window (measured in the step) + the part of a
        // forward outside the window (measured in the paired forward).
        step_outside.push_back(step_times[i] - step_window[i] - (fwd[i] - fwd_window[i]));
      }
      const double step_overhead = xb::median(step_outside);
      const double step_overhead_direct = xb::median(step_minus_fwd);
      model.reset();

      const double runner_overhead = gen_overhead + run_loop_overhead + steps * step_overhead;
      const double step_median = stage_median(result.iterations, "denoise_step");
      nlohmann::json r = {
          {"config", ec.name},
          {"dtype", xb::dtype_name(resolved.dtype)},
          {"height", ec.size},
          {"width", ec.size},
          {"image_tokens", half * half},
          {"text_tokens", ec.text_tokens},
          {"transformer",
           {{"heads", tc.num_attention_heads},
            {"head_dim", tc.attention_head_dim},
            {"double_blocks", tc.num_layers},
            {"single_blocks", tc.num_single_layers},
            {"joint_attention_dim", tc.joint_attention_dim},
            {"pooled_projection_dim", tc.pooled_projection_dim}}},
          {"steps", steps},
          {"warmup", warmup},
          {"iterations", iterations},
          {"write_pipeline_seconds", write_seconds},
          {"initialize_seconds", init_seconds},
          {"warmup_seconds", warmup_seconds},
          {"generation_seconds", total_median},
          {"encode_prompt_seconds", stage_median(result.iterations, "encode_prompt")},
          {"prepare_latents_seconds", stage_median(result.iterations, "prepare_latents")},
          {"denoise_step_seconds", step_median},
          {"decode_seconds", stage_median(result.iterations, "decode")},
          {"save_seconds", save_seconds},
          {"files_saved", written.size()},
          {"iteration_details", iters},
          {"generate_overhead_seconds", gen_overhead},
          {"run_loop_overhead_seconds", run_loop_overhead},
          {"paired_steps",
           {{"step_seconds", step_times},
            {"forward_seconds", fwd},
            {"step_attention_seconds", step_attention},
            {"forward_attention_seconds", fwd_attention},
            {"step_attention_window_seconds", step_window},
            {"forward_attention_window_seconds", fwd_window},
            {"forward_timing",
             "separate forward of identical-shape inputs right after each step (step callback); "
             "step overhead = step - step's attention window - (forward - forward's window)"}}},
          {"forward_seconds", xb::median(fwd)},
          {"step_overhead_seconds", step_overhead},
          {"step_overhead_direct_seconds", step_overhead_direct},
          {"step_overhead_fraction", step_overhead / xb::median(step_times)},
          {"runner_overhead_seconds", runner_overhead},
          {"runner_overhead_fraction", runner_overhead / total_median},
          {"runner_overhead_target", 0.02}};
      std::cerr << "e2e " << ec.name << " " << xb::dtype_name(resolved.dtype) << ": generation "
                << total_median << " s, step " << step_median * 1e3 << " ms (forward "
                << xb::median(fwd) * 1e3 << " ms), runner overhead " << runner_overhead * 1e3
                << " ms = " << 100 * runner_overhead / total_median << "%\n";
      runs.push_back(r);
    }

    nlohmann::json out = {
        {"benchmark", "flux_end_to_end"},
        {"environment", xb::environment_json(threads, openblas)},
        {"overhead_formula",
         "generate_overhead (generation wall - sum of stages) + run_loop_overhead (timed run() "
         "wall / iterations - generation wall) + steps * median(step - paired forward)"},
        {"runs", runs}};
    xb::emit_json(args, out);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_e2e: " << e.what() << "\n";
    return 1;
  }
}
