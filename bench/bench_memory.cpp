// bench_memory: what one rank holds of the FLUX transformer under a model-splitting strategy,
// against one rank holding it all. Every rank reports the bytes of the transformer weights it
// holds and its peak resident memory (ru_maxrss) after loading and after one forward.
//
//   bench_memory --write-weights DIR [--config small|medium] [--dtype bf16|fp32]
//       writes DIR/transformer/{config.json, diffusion_pytorch_model.safetensors} (seeded random
//       weights of bench_flux's config) and exits; run it once, in its own process, so no rank
//       of the measured runs ever held the whole model for writing.
//   [mpirun -np N] bench_memory --weights DIR [--strategy none|tp] [--dtype bf16|fp32]
//                               [--format as_loaded|fp8_storage|fp8_gemms]
//                               [--offload none|model|sequential]
//                               [--forward 0|1] [--threads T] [--out FILE]
//       none: one rank loads everything (the baseline; N must be 1);
//       --format: the weights as loaded, or in fp8 (docs/fp8.md), on one rank or split;
//       --offload: CPU offload of the transformer (models/common/offload.h); the JSON gets the
//         parameter bytes on the device at their peak, as the offloader accounts them (on the
//         CPU the device is the host: what a GPU would hold of the weights);
//       tp:   tensor parallel over the N ranks: each reads only its slices from the mmapped file.
//       fsdp: FSDP over the N ranks (models/common/fsdp.h), the forward under Ulysses N: each
//         reads only its row chunks; the JSON gets the parameter bytes held at the peak (chunks
//         + the gathered blocks) and the bound, as the sharder accounts them.
//       (pp: PipeFusion stages, added with PipeFusion.)
// Rank 0 writes the JSON (stdout without --out). bench/run_memory runs the whole comparison.
#include <fstream>
#include <iostream>

#include <sys/resource.h>

#include "bench/bench_common.h"
#include "models/common/fsdp.h"
#include "models/common/offload.h"
#include "models/dit/dit_parallel.h"
#include "models/flux/flux_parallel.h"
#include "models/flux/flux_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"

namespace xb = xfuser::bench;
namespace fs = std::filesystem;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

namespace {

struct Size {
  std::string name;
  int64_t heads, double_blocks, single_blocks, grid, text_tokens;
};

// bench_flux's small and medium configs (head dim 128).
Size find_size(const std::string& name) {
  for (const Size& s : {Size{"small", 4, 4, 8, 32, 128}, Size{"medium", 8, 8, 16, 32, 256}}) {
    if (s.name == name) return s;
  }
  XF_THROW("--config: unknown config '", name, "' (small, medium)");
}

nlohmann::json config_json(const Size& s) {
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", 1},
          {"in_channels", 64},
          {"num_layers", s.double_blocks},
          {"num_single_layers", s.single_blocks},
          {"attention_head_dim", 128},
          {"num_attention_heads", s.heads},
          {"joint_attention_dim", 512},
          {"pooled_projection_dim", 128},
          {"guidance_embeds", true},
          {"axes_dims_rope", {16, 56, 56}},
          {"bench_config", s.name},
          {"bench_grid", s.grid},
          {"bench_text_tokens", s.text_tokens}};
}

void write_weights(const fs::path& dir, const Size& s, c10::ScalarType dtype) {
  const fs::path t = dir / "transformer";
  fs::create_directories(t);
  const nlohmann::json config = config_json(s);
  FluxTransformer2DModel model(FluxConfig::from_json(config, "bench"));
  model.init_random(7, 0.02, dtype);
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, slot] : model.named_parameters()) state[name] = slot->tensor;
  xfuser::models::save_safetensors((t / "diffusion_pytorch_model.safetensors").string(), state);
  std::ofstream(t / "config.json") << config.dump(2) << "\n";
  std::cerr << "bench_memory: wrote " << model.num_parameters() << " parameters ("
            << xb::dtype_name(dtype) << ") to " << t.string() << "\n";
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// "RssAnon" / "RssFile" of /proc/self/status in bytes (0 when absent).
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

FluxInputs make_inputs(const FluxConfig& c, int64_t grid, int64_t text, c10::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const int64_t n = grid * grid;
  FluxInputs in;
  in.hidden_states = at::empty({1, n, c.in_channels}).normal_(0.0, 1.0, gen).to(dtype);
  in.encoder_hidden_states =
      at::empty({1, text, c.joint_attention_dim}).normal_(0.0, 1.0, gen).to(dtype);
  in.pooled_projections = at::empty({1, c.pooled_projection_dim}).normal_(0.0, 1.0, gen).to(dtype);
  in.timestep = at::full({1}, 0.5);
  in.guidance = at::full({1}, 3.5);
  auto rows = at::arange(grid, at::kFloat).repeat_interleave(grid);
  auto cols = at::arange(grid, at::kFloat).repeat({grid});
  in.img_ids = at::stack({at::zeros({n}), rows, cols}, 1);
  in.txt_ids = at::zeros({text, 3});
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {});
    args.check_known({"write-weights", "weights", "config", "dtype", "strategy", "format",
                      "offload", "forward", "threads", "out"});
    const auto dtype = xb::parse_dtype(args.get("dtype", "bf16"));
    if (args.has("write-weights")) {
      write_weights(args.get("write-weights", ""), find_size(args.get("config", "medium")), dtype);
      return 0;
    }
    XF_CHECK(args.has("weights"), "give --write-weights DIR or --weights DIR");
    const std::string strategy = args.get("strategy", "none");
    const bool run_forward = args.get_int("forward", 1) != 0;
    const int threads = static_cast<int>(args.get_int("threads", 1));
    xb::set_threads(threads);
    c10::InferenceMode guard;

    xfuser::parallel::MpiEnvironment mpi(&argc, &argv);
    auto world = std::make_shared<xfuser::parallel::MpiCommunicator>("world");
    std::shared_ptr<xfuser::parallel::ProcessGroups> groups;
    if (strategy == "none") {
      XF_CHECK(mpi.size() == 1, "--strategy none is the one-rank baseline (got ", mpi.size(),
               " ranks)");
    } else if (strategy == "tp") {
      XF_CHECK(mpi.size() > 1, "--strategy tp needs mpirun -np N with N > 1");
      groups = std::make_shared<xfuser::parallel::ProcessGroups>(
          xfuser::parallel::WorldConfig::from_degrees(mpi.size(), 1, 1, 1, 1, 1, mpi.size()),
          world);
    } else if (strategy == "fsdp") {
      XF_CHECK(mpi.size() > 1, "--strategy fsdp needs mpirun -np N with N > 1");
      groups = std::make_shared<xfuser::parallel::ProcessGroups>(
          xfuser::parallel::WorldConfig::from_degrees(mpi.size(), 1, 1, 1, mpi.size(), 1, 1),
          world);
      groups->create_fsdp_group();
    } else {
      // PipeFusion ("pp") plugs in here: build its groups and load only this stage's blocks.
      XF_THROW("--strategy: unknown strategy '", strategy, "' (none, tp, fsdp)");
    }

    const fs::path dir = fs::path(args.get("weights", "")) / "transformer";
    nlohmann::json config;
    {
      std::ifstream in(dir / "config.json");
      XF_CHECK(in.good(), "cannot read ", (dir / "config.json").string(),
               " (write it with --write-weights)");
      config = nlohmann::json::parse(in);
    }
    const double t0 = xb::now_seconds();
    const std::string format = args.get("format", "as_loaded");
    xfuser::models::WeightFormat weights;
    if (format == "fp8_storage") {
      weights.kind = xfuser::models::WeightFormat::Kind::kFp8Storage;
    } else if (format == "fp8_gemms") {
      weights.kind = xfuser::models::WeightFormat::Kind::kFp8Scaled;
    } else {
      XF_CHECK(format == "as_loaded", "--format: unknown format '", format,
               "' (as_loaded, fp8_storage, fp8_gemms)");
    }
    std::unique_ptr<xfuser::models::FsdpSharder> sharder;
    std::shared_ptr<xfuser::models::flux::FluxTransformer2DModel> model;
    if (strategy == "fsdp") {
      sharder =
          std::make_unique<xfuser::models::FsdpSharder>(*groups->fsdp(), c10::Device(c10::kCPU));
      xfuser::models::LoadOptions rows;
      sharder->configure(rows);
      model = std::dynamic_pointer_cast<xfuser::models::flux::FluxTransformer2DModel>(
          xfuser::models::dit::load_dit_transformer(
              dir.string(), dtype, groups.get(), {}, "FluxTransformer2DModel",
              c10::Device(c10::kCPU), weights, rows.row_part, rows.row_parts));
      sharder->add_component("transformer", model, model->block_list_prefixes());
    } else {
      model =
          xfuser::models::flux::load_flux_transformer(dir.string(), dtype, groups.get(), weights);
    }
    const double load_seconds = xb::now_seconds() - t0;
    const int64_t weight_bytes = model->parameter_bytes();
    const std::string offload = args.get("offload", "none");
    std::unique_ptr<xfuser::models::Offloader> offloader;
    if (offload != "none") {
      XF_CHECK(offload == "model" || offload == "sequential", "--offload: unknown mode '", offload,
               "' (none, model, sequential)");
      offloader = std::make_unique<xfuser::models::Offloader>(
          offload == "model" ? xfuser::models::OffloadMode::kModel
                             : xfuser::models::OffloadMode::kSequential,
          c10::Device(c10::kCPU));
      offloader->add_component("transformer", model, model->block_list_prefixes());
    }
    const int64_t rss_after_load = peak_rss_bytes();

    double forward_seconds = 0;
    if (run_forward) {
      const FluxInputs inputs = make_inputs(model->config(), config.at("bench_grid").get<int64_t>(),
                                            config.at("bench_text_tokens").get<int64_t>(), dtype);
      const double t1 = xb::now_seconds();
      at::Tensor out =
          groups ? xfuser::models::flux::sequence_parallel_forward(*model, inputs, *groups)
                 : model->forward(inputs);
      forward_seconds = xb::now_seconds() - t1;
      XF_CHECK(at::isfinite(out.to(at::kFloat)).all().item<bool>(), "non-finite forward output");
    }
    // [weight bytes, peak RSS after load, peak RSS, RssAnon, RssFile, load s, forward s]
    at::Tensor mine =
        at::tensor(
            {static_cast<double>(weight_bytes), static_cast<double>(rss_after_load),
             static_cast<double>(peak_rss_bytes()), static_cast<double>(status_bytes("RssAnon")),
             static_cast<double>(status_bytes("RssFile")), load_seconds, forward_seconds},
            at::kDouble)
            .unsqueeze(0);
    at::Tensor all = world->size() > 1 ? world->all_gather(mine, 0) : mine;  // [P, 7]
    if (mpi.rank() == 0) {
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < all.size(0); ++r) {
        auto v = [&](int k) { return all[r][k].item<double>(); };
        ranks.push_back({{"rank", r},
                         {"transformer_weight_bytes", static_cast<int64_t>(v(0))},
                         {"peak_rss_bytes_after_load", static_cast<int64_t>(v(1))},
                         {"peak_rss_bytes", static_cast<int64_t>(v(2))},
                         {"rss_anon_bytes_at_end", static_cast<int64_t>(v(3))},
                         {"rss_file_bytes_at_end", static_cast<int64_t>(v(4))},
                         {"load_seconds", v(5)},
                         {"forward_seconds", v(6)}});
      }
      nlohmann::json offload_json = {{"mode", offload}};
      if (offloader) {
        const auto o = offloader->stats();
        offload_json["peak_device_parameter_bytes"] = o.peak_resident_bytes;
        offload_json["bound_bytes"] = o.bound_bytes;
        offload_json["streamed_blocks"] = o.blocks;
        offload_json["largest_block_bytes"] = o.largest_block_bytes;
        offload_json["resident_part_bytes"] = o.largest_resident_part_bytes;
        offload_json["onload_bytes"] = o.onload_bytes;
      }
      nlohmann::json fsdp_json = nullptr;
      if (sharder) {
        const auto f = sharder->stats();
        fsdp_json = {{"group_size", f.group_size},
                     {"model_parameter_bytes", f.model_bytes},
                     {"shard_bytes", f.shard_bytes},
                     {"replicated_bytes", f.replicated_bytes},
                     {"peak_parameter_bytes", f.peak_resident_bytes},
                     {"bound_bytes", f.bound_bytes},
                     {"largest_block_bytes", f.largest_block_bytes},
                     {"rest_bytes", f.largest_rest_bytes},
                     {"gathers", f.gathers},
                     {"gather_bytes", f.gather_bytes}};
      }
      nlohmann::json out = {{"benchmark", "parallel_memory"},
                            {"fsdp", fsdp_json},
                            {"strategy", strategy},
                            {"format", format},
                            {"offload", offload_json},
                            {"ranks_count", mpi.size()},
                            {"dtype", xb::dtype_name(dtype)},
                            {"config", config.value("bench_config", std::string("?"))},
                            {"parameters_per_rank", model->num_parameters()},
                            {"forward", run_forward},
                            {"environment", xb::environment_json(threads, true)},
                            {"ranks", ranks}};
      xb::emit_json(args, out);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_memory: " << e.what() << "\n";
    return 1;
  }
}
