// bench_memory_pp: per-rank memory of PipeFusion against one rank, on the bench "medium" FLUX
// transformer (8 heads, D = 1024, 8 double + 16 single blocks, 32x32 image + 256 text tokens,
// batch 1; bench_flux's config) loaded from a safetensors checkpoint through the memory map.
//
//   bench_memory_pp --prepare DIR                 writes DIR/config.json + weights (fp32, seeded)
//   mpirun -np P bench_memory_pp --dir DIR [--steps 2] [--warmup-steps 1] [--patches P]
//                                [--threads 1] [--out FILE]
//
// P = 1: the whole transformer, `steps` plain forwards. P > 1: PipeFusion with P stages (each
// rank loads only its stage's tensors; parameter-balanced split), `steps` denoising steps of
// which `warmup-steps` synchronous, then the patch pipeline with stale K/V. Rank 0 writes, per
// rank: the stage's block range, its transformer weight bytes, the resident set after loading
// and its peak (getrusage), and the step times.
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <sys/resource.h>

#include "bench/bench_common.h"
#include "bench/bench_flux_configs.h"
#include "models/flux/flux_pipefusion.h"
#include "models/flux/flux_transformer.h"
#include "models/weights/checkpoint.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"

namespace xb = xfuser::bench;
namespace fs = std::filesystem;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

namespace {

constexpr int64_t kGrid = 32;  // image tokens kGrid x kGrid
constexpr int64_t kText = 256;

// The bench "medium" transformer (bench/bench_flux_configs.h), as bench_flux measures it.
FluxConfig medium_config() {
  return xfuser::bench::flux_config(xfuser::bench::select_configs("medium", "config")[0]);
}

void prepare(const fs::path& dir) {
  const auto weights = dir / "diffusion_pytorch_model.safetensors";
  if (fs::exists(weights)) return;
  fs::create_directories(dir);
  const FluxConfig c = medium_config();
  nlohmann::json j = {{"_class_name", "FluxTransformer2DModel"},
                      {"patch_size", c.patch_size},
                      {"in_channels", c.in_channels},
                      {"num_layers", c.num_layers},
                      {"num_single_layers", c.num_single_layers},
                      {"attention_head_dim", c.attention_head_dim},
                      {"num_attention_heads", c.num_attention_heads},
                      {"joint_attention_dim", c.joint_attention_dim},
                      {"pooled_projection_dim", c.pooled_projection_dim},
                      {"guidance_embeds", c.guidance_embeds},
                      {"axes_dims_rope", c.axes_dims_rope}};
  std::ofstream(dir / "config.json") << j.dump(2) << "\n";
  FluxTransformer2DModel model(c);
  model.init_random(7, 0.02, at::kFloat);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, slot] : model.named_parameters()) tensors[name] = slot->tensor.contiguous();
  // Written to a temporary name and renamed: a complete file or none.
  xfuser::models::save_safetensors(weights.string(), tensors, {{"format", "pt"}});
}

int64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

FluxInputs make_inputs(const FluxConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const int64_t n = kGrid * kGrid;
  FluxInputs in;
  in.hidden_states = at::empty({1, n, c.in_channels}).normal_(0.0, 1.0, gen);  // [1, N, C]
  in.encoder_hidden_states =
      at::empty({1, kText, c.joint_attention_dim}).normal_(0.0, 1.0, gen);  // [1, L, J]
  in.pooled_projections = at::empty({1, c.pooled_projection_dim}).normal_(0.0, 1.0, gen);
  in.timestep = at::full({1}, 0.5);
  in.guidance = at::full({1}, 3.5);
  auto rows = at::arange(kGrid, at::kFloat).repeat_interleave(kGrid);  // [N]
  auto cols = at::arange(kGrid, at::kFloat).repeat({kGrid});           // [N]
  in.img_ids = at::stack({at::zeros({n}), rows, cols}, 1);             // [N, 3]
  in.txt_ids = at::zeros({kText, 3});                                  // [L, 3]
  return in;
}

int run(int argc, char** argv) {
  xb::Args args(argc, argv, {});
  args.check_known({"prepare", "dir", "steps", "warmup-steps", "patches", "threads", "out"});
  if (args.has("prepare")) {
    prepare(args.get("prepare", ""));
    return 0;
  }
  XF_CHECK(args.has("dir"), "--dir DIR is required (write it first with --prepare DIR)");
  const fs::path dir = args.get("dir", "");
  const int threads = static_cast<int>(args.get_int("threads", 1));
  const bool openblas = xb::set_threads(threads);
  const int steps = static_cast<int>(args.get_int("steps", 2));
  const int warmup_steps = static_cast<int>(args.get_int("warmup-steps", 1));
  XF_CHECK(steps >= 1 && warmup_steps >= 0, "--steps must be >= 1, --warmup-steps >= 0");

  auto world = std::make_shared<xfuser::parallel::MpiCommunicator>("world");
  const int p = world->size(), rank = world->rank();
  const int patches = static_cast<int>(args.get_int("patches", p));
  c10::InferenceMode guard;
  const FluxConfig config = medium_config();
  auto weights = xfuser::models::open_checkpoint(dir.string());

  std::shared_ptr<xfuser::parallel::ProcessGroups> groups;
  std::unique_ptr<FluxTransformer2DModel> model;
  const double t_load = xb::now_seconds();
  if (p == 1) {
    model = std::make_unique<FluxTransformer2DModel>(config);
    model->load(*weights, at::kFloat);
  } else {
    groups = std::make_shared<xfuser::parallel::ProcessGroups>(
        xfuser::parallel::WorldConfig::from_degrees(p, 1, 1, p, 1, 1, 1), world);
    const auto layers = xfuser::models::flux::pipefusion_stage_layers(config, p, {});
    model = std::make_unique<FluxTransformer2DModel>(
        config, xfuser::models::flux::pipefusion_stage_part(layers, rank));
    xfuser::models::LoadOptions partial;
    partial.allow_unexpected = true;
    model->load(*weights, at::kFloat, "", partial);
  }
  const double load_seconds = xb::now_seconds() - t_load;
  int64_t weight_bytes = 0;
  for (const auto& [name, slot] : model->named_parameters()) weight_bytes += slot->tensor.nbytes();
  // The memory map is lazy: touch every held tensor once so "after load" counts the weights.
  for (const auto& [name, slot] : model->named_parameters()) slot->tensor.sum().item<double>();
  const int64_t rss_after_load = current_rss_bytes();

  const FluxInputs in = make_inputs(config);
  std::vector<double> step_seconds;
  if (p == 1) {
    at::Tensor latents = in.hidden_states.clone();
    for (int i = 0; i < steps; ++i) {
      const double t0 = xb::now_seconds();
      FluxInputs step_in = in;
      step_in.hidden_states = latents;
      latents = latents - 0.1 * model->forward(step_in);
      step_seconds.push_back(xb::now_seconds() - t0);
    }
  } else {
    xfuser::models::flux::FluxPipeFusion pipe(*model, *groups, kGrid, kGrid, patches, warmup_steps,
                                              steps);
    at::Tensor latents = in.hidden_states.clone();
    for (int i = 0; i < steps; ++i) {
      const double t0 = xb::now_seconds();
      pipe.step(
          i, in, 1, [](const at::Tensor& out) { return out; },
          [](const at::Tensor& noise, const at::Tensor& x, const xfuser::models::dit::TokenRange&) {
            return x - 0.1 * noise;
          },
          latents);
      step_seconds.push_back(xb::now_seconds() - t0);
    }
  }
  const int64_t peak = peak_rss_bytes();

  // Gather [weight bytes, rss after load, peak rss, block begin, block end] from every rank.
  const auto& part = model->part();
  at::Tensor mine = at::tensor(
      std::vector<int64_t>{weight_bytes, rss_after_load, peak, part.block_begin, part.block_end},
      at::kLong);
  at::Tensor all = world->all_gather(mine, 0).view({p, 5});
  at::Tensor times = world->all_gather(at::tensor(step_seconds, at::kDouble), 0).view({p, steps});
  if (rank == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < p; ++r) {
      std::vector<double> t(times[r].data_ptr<double>(), times[r].data_ptr<double>() + steps);
      ranks.push_back({{"rank", r},
                       {"blocks", {all[r][3].item<int64_t>(), all[r][4].item<int64_t>()}},
                       {"transformer_weight_bytes", all[r][0].item<int64_t>()},
                       {"rss_after_load_bytes", all[r][1].item<int64_t>()},
                       {"peak_rss_bytes", all[r][2].item<int64_t>()},
                       {"step_seconds", t}});
    }
    nlohmann::json out = {{"benchmark", "memory_pipefusion"},
                          {"config", "medium"},
                          {"dtype", "fp32"},
                          {"pipefusion_degree", p},
                          {"patches", p == 1 ? 1 : patches},
                          {"steps", steps},
                          {"warmup_steps", p == 1 ? steps : warmup_steps},
                          {"load_seconds_rank0", load_seconds},
                          {"environment", xb::environment_json(threads, openblas)},
                          {"ranks", ranks}};
    xb::emit_json(args, out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_memory_pp: " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
