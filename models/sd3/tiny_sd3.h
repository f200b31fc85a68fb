// The tiny SD3 pipeline: a complete diffusers StableDiffusion3Pipeline folder (model_index.json,
// scheduler/, text_encoder/ (CLIP-L layout), text_encoder_2/ (CLIP-G layout: wider, erf GELU),
// text_encoder_3/ (T5), tokenizer/ and tokenizer_2/ (CLIP byte-level BPE), tokenizer_3/ (T5
// SentencePiece), transformer/ (SD3Transformer2DModel with a dual-attention layer and RMS QK
// norms, so the SD3.5 paths run), vae/ (AutoencoderKL, 16 latent channels, SD3's scaling and
// shift)) with seeded random weights. The tokenizers are the tiny FLUX pipeline's
// (models/flux/tiny_flux.h). Its images are noise-like: the weights are random.
//
// Sizes follow the pipeline's rules: the CLIP-L and CLIP-G hidden states (32 + 48) are
// concatenated and zero-padded to the T5 width 96 = joint_attention_dim; pooled_projection_dim
// 80 = CLIP-L projection 32 + CLIP-G projection 48.
#pragma once

#include <cstdint>
#include <filesystem>

namespace xfuser::models::sd3 {

// Writes the pipeline folder to `dir` (created; must not exist or be empty). Deterministic in
// `seed`: the same seed gives the same weight files.
void write_tiny_sd3(const std::filesystem::path& dir, uint64_t seed);

// The same without text_encoder_3 / tokenizer_3 (null in model_index.json): SD3 run without T5,
// whose text embeddings the pipeline replaces with zeros.
void write_tiny_sd3_without_t5(const std::filesystem::path& dir, uint64_t seed);

}  // namespace xfuser::models::sd3
