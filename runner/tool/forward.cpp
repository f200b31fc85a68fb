// `xfuser forward`: runs one component folder (diffusers / transformers layout) on named inputs
// read from a safetensors file and writes every output as float32 to another.
//
//   xfuser forward --model-dir DIR --inputs IN.safetensors --output OUT.safetensors
//                  [--dtype fp32|bf16|fp16] [--device auto|cpu|cuda] [--method forward|...]
//                  [--ulysses_degree U] [--ring_degree R] [--tensor_parallel_degree T]
// Under mpirun a diffusion transformer (FLUX, SD3: models/dit/dit.h) runs split over ulysses x ring
// x tp ranks (with tp > 1 each rank reads only its slices of the weights); the last rank writes the
// output.
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include "backends/attention.h"
#include "backends/device.h"
#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/threads.h"
#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/dit/dit_parallel.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "parallel/two_plane_communicator.h"
#include "parallel/world_config.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {
namespace {

struct ForwardOptions {
  std::string model_dir;
  std::string inputs;
  std::string output;
  std::string dtype = "fp32";
  std::string device = "auto";
  std::string comm_backend = "auto";
  std::string attention_backend;  // empty: XFUSER_ATTENTION_KERNEL, else auto
  std::string method = "forward";
  int ulysses_degree = 1;
  int ring_degree = 1;
  int tensor_parallel_degree = 1;
  double comm_timeout = 600.0;
};

void run_forward(const ForwardOptions& opts) {
  XF_CONTEXT("xfuser forward --model-dir ", opts.model_dir);
  configure_threads(1);  // OMP_NUM_THREADS, capped at the cores available
  c10::InferenceMode inference;
  const auto dtype = xfuser::backends::parse_dtype(opts.dtype);
  // Before any CUDA or NCCL call; --device cuda without one is an error on every rank.
  const c10::Device device = backends::select_device(opts.device);
  backends::set_default_attention_kernel(
      backends::resolve_attention_kernel(opts.attention_backend, device));
  backends::set_fp32_math(dtype, device);

  // Under mpirun (or with degrees > 1) the ranks split the work as xfuser-run does; every rank
  // computes the same output and the last one writes it. The groups come first: a
  // tensor-parallel model is built for its rank and reads only its slices.
  std::unique_ptr<parallel::MpiEnvironment> mpi;
  std::shared_ptr<parallel::ProcessGroups> groups;
  const bool under_mpirun =
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  const int degrees = opts.ulysses_degree * opts.ring_degree * opts.tensor_parallel_degree;
  if (under_mpirun || degrees > 1) {
    mpi = std::make_unique<parallel::MpiEnvironment>(nullptr, nullptr);
    const auto config = parallel::WorldConfig::from_degrees(
        mpi->size(), 1, 1, 1, opts.ulysses_degree, opts.ring_degree, opts.tensor_parallel_degree);
    if (mpi->size() > 1) {
      auto world = parallel::make_world_communicator(
          opts.comm_backend, device, mpi->local_size(), backends::probe_devices().visible_gpus,
          std::chrono::milliseconds(static_cast<int64_t>(opts.comm_timeout * 1000)));
      groups = std::make_shared<parallel::ProcessGroups>(config, world);
    }
  }

  models::register_builtin_components();
  std::shared_ptr<models::Component> component;
  if (groups && groups->config().tp() > 1) {
    component =
        models::dit::load_dit_transformer(opts.model_dir, dtype, groups.get(), {}, "", device);
  } else {
    component = models::load_component(opts.model_dir, dtype, device);
  }
  const auto methods = component->methods();
  bool known = false;
  std::string listing;
  for (const auto& m : methods) {
    known = known || m == opts.method;
    listing += (listing.empty() ? "" : ", ") + m;
  }
  XF_CHECK(known, "--method '", opts.method, "' is not a method of ", component->class_name(),
           " (methods: ", listing, ")");

  models::SafetensorsFile input_file(opts.inputs);
  models::TensorMap inputs;
  for (const auto& name : input_file.names()) {
    at::Tensor t = input_file.get(name);
    inputs[name] = at::isFloatingType(t.scalar_type()) ? t.to(device, dtype) : t.to(device);
  }
  spdlog::info("forward: {} ({}, {}) method {} on {} input(s) from {}", component->class_name(),
               opts.model_dir, opts.dtype, opts.method, inputs.size(), opts.inputs);

  models::TensorMap outputs;
  if (groups) {
    auto* dit = dynamic_cast<models::dit::DiTTransformer*>(component.get());
    std::string classes;
    for (const auto& name : models::dit::DiTRegistry::known_classes()) {
      classes += (classes.empty() ? "" : ", ") + name;
    }
    XF_CHECK(dit != nullptr && opts.method == "forward",
             "--ulysses_degree / --ring_degree / --tensor_parallel_degree: parallel forward "
             "supports the forward of a diffusion transformer (",
             classes, "), not ", component->class_name(), ".", opts.method);
    outputs = dit->forward_outputs(
        models::dit::sequence_parallel_forward(*dit, dit->parse_forward_inputs(inputs), *groups),
        inputs);
  } else {
    outputs = component->call(opts.method, inputs);
  }
  XF_CHECK(!outputs.empty(), component->class_name(), ".", opts.method, " returned no outputs");
  std::map<std::string, at::Tensor> to_save;
  for (const auto& [name, t] : outputs) {
    XF_CHECK(t.defined(), component->class_name(), ".", opts.method, " returned an undefined '",
             name, "'");
    to_save[name] = t.to(at::kFloat).contiguous();
    spdlog::info("forward: output {} {}", name, models::shape_string(t.sizes()));
  }
  if (!mpi || mpi->rank() == mpi->size() - 1) {
    models::save_safetensors(opts.output, to_save);
    spdlog::info("forward: wrote {} output(s) to {}", to_save.size(), opts.output);
  }
}

}  // namespace

void register_forward(CLI::App& app) {
  auto opts = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand(
      "forward", "Run one model component folder on inputs from a safetensors file");
  cmd->add_option("--model-dir", opts->model_dir,
                  "Component folder (config.json + safetensors weights)")
      ->required();
  cmd->add_option("--inputs", opts->inputs,
                  "safetensors file with the call's tensors under their keyword names")
      ->required();
  cmd->add_option("--output", opts->output, "safetensors file for the outputs (float32)")
      ->required();
  cmd->add_option("--dtype", opts->dtype, "Compute dtype: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--device", opts->device,
                  "Compute device: auto (cuda when this libtorch has CUDA and a GPU is visible), "
                  "cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--comm_backend", opts->comm_backend,
                  "Collectives of CUDA tensors under mpirun: nccl, mpi (through host memory) or "
                  "auto (as xfuser-run)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))
      ->capture_default_str();
  cmd->add_option("--attention_backend", opts->attention_backend,
                  "Attention kernel: auto, chunked, or on CUDA flash, efficient, cudnn (as "
                  "xfuser-run; default: XFUSER_ATTENTION_KERNEL, else auto)")
      ->check(CLI::IsMember({"auto", "chunked", "flash", "efficient", "cudnn"}));
  cmd->add_option("--method", opts->method, "Component method: forward, decode, ...")
      ->capture_default_str();
  cmd->add_option("--ulysses_degree", opts->ulysses_degree,
                  "Ulysses degree under mpirun (any diffusion transformer)")
      ->capture_default_str();
  cmd->add_option("--ring_degree", opts->ring_degree,
                  "Ring degree under mpirun (any diffusion transformer)")
      ->capture_default_str();
  cmd->add_option("--tensor_parallel_degree", opts->tensor_parallel_degree,
                  "Tensor parallel degree under mpirun (any diffusion transformer)")
      ->capture_default_str();
  cmd->add_option("--comm_timeout", opts->comm_timeout, "Seconds any collective may wait")
      ->capture_default_str();
  cmd->callback([opts] { run_forward(*opts); });
}

}  // namespace xfuser::runner::tool
