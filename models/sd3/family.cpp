// The SD3 family: SD3.5 (large, medium), SD3-medium and the embedded tiny-sd3 (StableDiffusion3-
// Pipeline), SD3Transformer2DModel for the component and DiT registries, and the tiny
// StableDiffusion3Pipeline layouts of `xfuser make-tiny`.
#include "models/registry.h"
#include "models/sd3/register.h"
#include "models/sd3/sd3_pipeline.h"
#include "models/sd3/tiny_sd3.h"

namespace xfuser::models::sd3 {

void register_family() {
  Family family;
  family.name = "sd3";
  family.models = model_specs();
  family.lora_components = {"transformer", "text_encoder", "text_encoder_2"};
  family.register_components = register_sd3_components;
  family.tiny_archs = {
      {"sd3",
       "SD3/SD3.5: CLIP-L + CLIP-G + T5 text encoders, SD3Transformer2DModel (dual attention, "
       "RMS QK norms), AutoencoderKL",
       [](const std::filesystem::path& dir, uint64_t seed) { write_tiny_sd3(dir, seed); }},
      {"sd3-no-t5", "SD3 without text_encoder_3 / tokenizer_3 (T5 embeddings replaced by zeros)",
       [](const std::filesystem::path& dir, uint64_t seed) {
         write_tiny_sd3_without_t5(dir, seed);
       }}};
  FamilyRegistry::add(std::move(family));
}

}  // namespace xfuser::models::sd3
