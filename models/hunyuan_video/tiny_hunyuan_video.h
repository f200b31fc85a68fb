// The tiny HunyuanVideo pipeline `xfuser make-tiny --arch hunyuan-video` writes (and the embedded
// tiny-hunyuan-video model runs): a diffusers HunyuanVideoPipeline folder with seeded random
// weights in the real layout: a LlamaModel text encoder with its Llama 3 style tokenizer.json
// (byte-level BPE learned here from a built-in corpus and the prompt template, the Llama 3
// pre-tokenizer regex, ignore_merges, <|begin_of_text|> added by the post-processor, the header /
// eot special tokens, a <pad> token), CLIPTextModel and CLIP tokenizer as tokenizer_2 (the tiny
// FLUX pipeline's), HunyuanVideoTransformer3DModel (token refiner, double and single blocks,
// embedded guidance), the causal AutoencoderKLHunyuanVideo (8x spatial, 4x temporal) and
// FlowMatchEuler with HunyuanVideo's shift 7.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace xfuser::models::hunyuan_video {

void write_tiny_hunyuan_video(const std::filesystem::path& dir, uint64_t seed);

// The tokenizer.json of a Llama 3 style byte-level BPE tokenizer learned from `text` with
// `num_merges` merges (most frequent adjacent pair first, ties lexicographic); the vocabulary is
// the 256 byte symbols, one token per merge, then the special tokens. Deterministic.
std::string tiny_llama3_tokenizer_json(const std::string& text, int num_merges);

}  // namespace xfuser::models::hunyuan_video
