// `xfuser validate <xfuser-run flags> [--world_size N]`: checks a run without running it: flags
// and values, the model's capabilities, the degrees against the world size, the pipeline folder,
// every component's config and weight headers against the model's parameters, the LoRA adapters
// against the components they adapt, the tokenizers.
// Weights are memory-mapped views, so no tensor data is read.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/image/clip_image_processor.h"
#include "models/lora_adapters.h"
#include "models/registry.h"
#include "models/tokenizers/tokenizer.h"
#include "models/weights/component_folder.h"
#include "parallel/world_config.h"
#include "runner/run_config.h"
#include "runner/runner.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {
namespace fs = std::filesystem;

namespace {

void validate(const CLI::App& cmd, const RunConfig& config, int world_size) {
  Runner runner(config);
  const ResolvedArgs args = runner.preprocess_args();
  const auto mesh = parallel::WorldConfig::from_degrees(
      world_size, config.data_parallel_degree, config.use_cfg_parallel ? 2 : 1,
      config.pipefusion_parallel_degree, config.ulysses_degree, config.ring_degree,
      config.tensor_parallel_degree);
  std::cout << "flags: ok (" << args.spec->id << ", " << args.request.height << "x"
            << args.request.width << ", " << args.request.num_inference_steps << " steps, "
            << args.config.dtype << ")\n";
  std::cout << "mesh: ok (" << mesh.to_string() << ")\n";
  const fs::path dir = resolve_model_dir(args);
  std::cout << "pipeline: " << dir.string() << "\n";
  // The same check xfuser-run makes before loading: layout against the configs, and memory.
  if (const auto memory = check_before_loading(args, dir, run_layout(args))) {
    auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
    std::cout << "layout: ok\nmemory: ok (about " << mib(memory->total()) << " per rank: weights "
              << mib(memory->weights) << ", activations " << mib(memory->activations()) << ")\n";
  }
  nlohmann::json index;
  {
    std::ifstream in(dir / "model_index.json");
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      XF_THROW("malformed ", (dir / "model_index.json").string(), ": ", e.what());
    }
  }
  models::register_builtin_components();
  // LoRA adapters: read as the run reads them, and planned against each adapted component's
  // declared parameters (names, Linear layers, shapes), as its load would.
  const models::RunLora lora =
      models::read_run_lora(*args.spec, args.lora, args.lora_fused, c10::Device(c10::kCPU));
  std::set<std::string> adapted;
  for (const auto& [name, entry] : index.items()) {
    if (name.empty() || name[0] == '_' || !entry.is_array()) continue;
    // [null, null]: a component the pipeline class has but this folder leaves out.
    if (!entry.empty() && entry[0].is_null()) continue;
    const fs::path sub = dir / name;
    if (fs::exists(sub / "config.json")) {
      auto folder = models::open_component_folder(sub.string());
      const auto names = folder.weights->names();
      XF_CHECK(!names.empty(), sub.string(), " has no tensors");
      const auto dtype = folder.weights->info(names.front()).dtype;
      // Strict load over memory-mapped views: shapes and names checked, data not read.
      auto component = models::load_component(sub.string(), dtype);
      std::cout << name << ": ok (" << component->class_name() << ", "
                << component->num_parameters() << " parameters)\n";
      if (auto it = lora.components.find(name); it != lora.components.end()) {
        XF_CONTEXT("checking the LoRA adapters of ", sub.string());
        const auto plan = models::plan_lora(*component, *it->second, /*partial=*/false);
        std::cout << name << ": LoRA ok (" << it->second->entries.size() << " updates of "
                  << plan.size() << " parameters)\n";
        adapted.insert(name);
      }
    } else if (fs::exists(sub / "vocab.json") || fs::exists(sub / "spiece.model") ||
               fs::exists(sub / "tokenizer.json") || fs::exists(sub / "tokenizer_config.json")) {
      // CLIP / GPT-2 BPE, sentencepiece, a tokenizers-library file alone (Llama's fast
      // tokenizer, Mistral's Tekken-style processor folder), or a configuration alone (ByT5).
      auto tok = models::tokenizers::load_tokenizer(sub);
      std::cout << name << ": ok (" << tok->kind() << " tokenizer, " << tok->size() << " ids)\n";
    } else if (fs::exists(sub / "scheduler_config.json")) {
      // Read by the check above, with the reader the run uses.
      std::cout << name << ": ok\n";
    } else if (fs::exists(sub / "preprocessor_config.json")) {
      // An image processor (Wan 2.1's CLIPImageProcessor, HunyuanVideo-1.5's SigLIP one), read as
      // the run reads it.
      models::image::ClipImageProcessorConfig::from_file(
          (sub / "preprocessor_config.json").string());
      std::cout << name << ": ok (image processor)\n";
    } else if (fs::exists(sub / "guider_config.json")) {
      // HunyuanVideo-1.5's guider: read by the flags' check above (its guidance_scale is a
      // default of the run).
      std::cout << name << ": ok (guider)\n";
    } else {
      XF_THROW(sub.string(),
               " (listed in model_index.json) has no config.json, tokenizer files, "
               "scheduler_config.json, preprocessor_config.json or guider_config.json");
    }
  }
  for (const auto& [name, part] : lora.components) {
    XF_CHECK(adapted.count(name), "--lora ", part->entries.front().adapter->path,
             ": the adapter adapts '", name, "', which ", args.spec->id, " (", dir.string(),
             ") does not load");
  }
  std::cout << "valid\n";
}

}  // namespace

void register_validate(CLI::App& app) {
  auto config = std::make_shared<RunConfig>();
  auto world_size = std::make_shared<int>(0);
  auto* cmd = app.add_subcommand(
      "validate", "Check xfuser-run flags, the mesh and the weights without running anything");
  add_run_flags(*cmd, *config);
  cmd->add_option("--world_size", *world_size,
                  "Ranks the run will have (default: from mpirun's environment, else 1)");
  cmd->callback([cmd, config, world_size] {
    int world = *world_size;
    if (world <= 0) {
      const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
      world = env ? std::atoi(env) : 1;
    }
    validate(*cmd, *config, world);
  });
}

}  // namespace xfuser::runner::tool
