// The tiny FLUX.2 pipeline `xfuser make-tiny --arch flux2` writes (and the embedded tiny-flux2
// model runs): a diffusers Flux2Pipeline folder (0.36.0 layout) with seeded random weights: a
// 30-layer Mistral3ForConditionalGeneration text encoder (hidden 16; FLUX.2 stacks hidden_states
// 10, 20, 30) with its tiny Pixtral vision tower and projector, a PixtralProcessor tokenizer/
// (Tekken-style byte-level BPE learned here from a built-in corpus and FLUX.2's system message,
// the control tokens first, left padding, the v7 chat template), Flux2Transformer2DModel (1 double
// + 1 single block), AutoencoderKLFlux2 (4 latent channels, 2x2 patches, batch-norm statistics)
// and FlowMatchEuler with dynamic shifting. Same seed -> byte-identical folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace xfuser::models::flux2 {

void write_tiny_flux2(const std::filesystem::path& dir, uint64_t seed);

// The tokenizer.json the writer puts in tokenizer/ (deterministic; no seed).
std::string tiny_flux2_tokenizer_json();

}  // namespace xfuser::models::flux2
