// The embedded tiny FLUX pipeline: a complete diffusers-format FLUX folder (model_index.json,
// scheduler/, text_encoder/ (CLIP), text_encoder_2/ (T5), tokenizer/ (byte-level BPE trained
// here on a built-in corpus), tokenizer_2/ (a SentencePiece unigram model trained with the
// sentencepiece library), transformer/, vae/) with seeded random weights. Same architecture and
// code path as FLUX.1-dev, small enough that 256x256 in 4 steps takes seconds on a CPU.
// Its images are noise-like: the weights are random.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace xfuser::models::flux {

// Writes the pipeline folder to `out` (created; must not exist or be empty). Deterministic in
// `seed`: the same seed gives byte-identical weight files.
void make_tiny_flux(const std::filesystem::path& out, uint64_t seed);

// The tiny pipeline folder in the cache ($XFUSER_CACHE, else $XDG_CACHE_HOME/xfuser, else
// ~/.cache/xfuser), created on first use. Safe when several processes ask at once: the folder
// is built under a temporary name and renamed.
std::filesystem::path ensure_tiny_flux(uint64_t seed = 0);

// The trained tiny-shapes pipeline folder (committed under models/flux/tiny_shapes, installed
// under <datadir>/xfuser/tiny_shapes): the source tree's, else the installed one (the configured
// prefix, else <the running program's folder>/../share). Throws naming the places looked at when
// none holds model_index.json.
std::filesystem::path tiny_shapes_dir();

// Byte-level BPE merges learned from `corpus` (CLIP's pre-tokenisation: lower case, words,
// `</w>` ends) by repeatedly merging the most frequent adjacent pair (ties: lexicographic).
// Returns (vocab in id order, merges in rank order); the vocab is CLIP's layout: the 256 byte
// symbols, the same with `</w>`, one entry per merge, then <|startoftext|> and <|endoftext|>.
std::pair<std::vector<std::string>, std::vector<std::pair<std::string, std::string>>>
train_byte_bpe(const std::vector<std::string>& corpus, int num_merges);

}  // namespace xfuser::models::flux
