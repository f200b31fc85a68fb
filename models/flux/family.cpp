// The FLUX.1 family: FLUX.1-dev and the embedded tiny-flux, FluxTransformer2DModel, and the tiny
// FLUX layout of `xfuser make-tiny`.
#include <nlohmann/json.hpp>

#include "models/common/tiny_pipeline.h"
#include "models/dit/dit.h"
#include "models/flux/flux_lora.h"
#include "models/flux/flux_pipeline.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/weights/hub_cache.h"

namespace xfuser::models::flux {

void register_family() {
  Family family;
  family.name = "flux";
  family.models = model_specs();
  family.lora_components = {"transformer", "text_encoder"};
  family.lora_layouts = flux_lora_layouts();
  for (auto& spec : family.models) {
    if (spec.id == "tiny-shapes") {
      spec.embedded_dir = [] { return tiny_shapes_dir(); };
    } else if (spec.maturity == "embedded") {
      spec.embedded_dir = [] { return ensure_tiny_flux(0); };
    } else {
      spec.pipeline_classes = {spec.task == Task::kImageToImage ? "FluxKontextPipeline"
                                                                : "FluxPipeline"};
    }
  }
  family.register_components = [] {
    dit::register_dit_component("FluxTransformer2DModel", make_flux_dit);
  };
  family.tiny_archs = {
      {"flux", "FLUX.1: CLIP + T5 text encoders, FluxTransformer2DModel, AutoencoderKL",
       [](const std::filesystem::path& dir, uint64_t seed) { make_tiny_flux(dir, seed); }},
      {"flux-kontext",
       "FLUX.1-Kontext: the flux layout as a FluxKontextPipeline (image editing with a reference "
       "picture)",
       [](const std::filesystem::path& dir, uint64_t seed) {
         make_tiny_flux(dir, seed);
         // The same components; only the pipeline class differs (FluxKontextPipeline).
         nlohmann::json index = read_model_index(dir);
         index["_class_name"] = "FluxKontextPipeline";
         write_json_file(dir / "model_index.json", index);
       }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::flux
