// The tiny HunyuanVideo-1.5 pipelines `xfuser make-tiny --arch hunyuan-video15` /
// `hunyuan-video15-i2v` write (and the embedded tiny-hunyuan-video15 model runs): a diffusers
// HunyuanVideo15Pipeline / HunyuanVideo15ImageToVideoPipeline folder (0.36.0 layout) with seeded
// random weights: a 3-layer Qwen2_5_VLTextModel (hidden 24) with a Qwen2Tokenizer tokenizer.json
// (NFC, Qwen2's split regex, byte-level BPE learned here from the pipeline's system message and a
// few captions, the Qwen special tokens after the merges), a ByT5-style T5EncoderModel with its
// ByT5Tokenizer, HunyuanVideo15Transformer3DModel (2 blocks, 1 refiner block),
// AutoencoderKLHunyuanVideo15 (16x spatial, 4x temporal), FlowMatchEuler (shift 5) and
// ClassifierFreeGuidance (6); the i2v folder adds a SiglipVisionModel image_encoder/ and its
// SiglipImageProcessor feature_extractor/ (meanflow transformer, target_size 48). Same seed ->
// byte-identical folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace xfuser::models::hunyuan_video15 {

void write_tiny_hunyuan_video15(const std::filesystem::path& dir, uint64_t seed,
                                bool image_to_video);

// The tokenizer.json the writer puts in tokenizer/ (deterministic; no seed).
std::string tiny_hunyuan_video15_tokenizer_json();

}  // namespace xfuser::models::hunyuan_video15
