// A small deterministic byte-level BPE trainer for the tiny pipeline writers (`xfuser make-tiny`):
// learns merges from a built-in corpus and writes a Hugging Face tokenizer.json (Split regex +
// ByteLevel(use_regex=False) pre-tokenizer, ByteLevel decoder, BPE with ignore_merges).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace xfuser::models::tokenizers {

struct BpeTrainerOptions {
  // The Split pre-tokenizer regex (Isolated): the corpus is split with it by ICU, as
  // BpeTokenizer splits text at encode time.
  std::string split_pattern;
  std::vector<std::string> special_tokens;
  bool specials_first = false;              // ids 0..n-1 (Tekken) or after the merges (Llama 3)
  nlohmann::json post_processor = nullptr;  // tokenizer.json's "post_processor" (null: none)
  int num_merges = 400;
  // Splits the corpus into the pieces merges are learned within, instead of split_pattern (which
  // tokenizer.json still names). Only for a writer whose merges were first learned that way.
  std::function<std::vector<std::string>(const std::string&)> pieces;
};

// Pieces of `text` under `pattern` (matches and the gaps between them, in order): the Split
// pre-tokenizer's Isolated behaviour, on the ICU regex engine BpeTokenizer uses.
std::vector<std::string> split_isolated(const std::string& text, const std::string& pattern);

// tokenizer.json learned from `corpus` (most frequent adjacent pair first, ties lexicographic;
// stops early when no pair occurs twice). Vocabulary: the 256 byte symbols, one token per new
// merge result, the special tokens first or last. Deterministic.
std::string train_byte_level_bpe(const std::string& corpus, const BpeTrainerOptions& options);

}  // namespace xfuser::models::tokenizers
