// Tokenizers read from Hugging Face's tokenizer.json (the "fast" format), equal to the `tokenizers`
// library (0.19.1 behind transformers v4.44.2, 0.23.3 behind transformers 5.24) called as
//   tokenizer(texts, padding="max_length", max_length=N, truncation=True).
// Targets Llama 3 (HunyuanVideo's llava-llama-3 text encoder), Qwen2 / Qwen2.5, Mistral's tekken
// tokenizer.json, and the CLIP and T5 / UMT5 folders transformers 5 saves (tokenizer.json alone).
// The pipeline, as the library runs it:
//   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest, with
//      single_word / lstrip / rstrip), the rest is normalized (NFC, NFKC, Lowercase, Replace,
//      Prepend, Strip, SentencePiece's Precompiled charsmap per grapheme cluster, Sequence), then
//      added tokens with normalized=true are cut out;
//   2. the pre-tokenizer splits each piece: Split (ICU regex with the Oniguruma meaning of the
//      patterns these files use, or a literal; every SplitDelimiterBehavior, invert), ByteLevel
//      (add_prefix_space, GPT-2's regex when use_regex, bytes_to_unicode), WhitespaceSplit,
//      Metaspace (always / first / never prepend, split), Sequence;
//   3. the model: BPE by merge rank (the library's priority-queue order), ignore_merges,
//      byte_fallback (<0xXX>), unk_token / fuse_unk, continuing_subword_prefix,
//      end_of_word_suffix; or Unigram (the best-scoring segmentation, unknown characters fused
//      into one unk, byte_fallback); a per-word cache;
//   4. the post-processor (TemplateProcessing's single template, Roberta, Bert, ByteLevel,
//      Sequence) adds the special tokens; truncation drops text ids first so they always fit.
// transformers' side comes from tokenizer_config.json / special_tokens_map.json: special tokens
// missing from the added vocabulary are added (with the class's defaults, e.g. Qwen2's
// <|endoftext|> pad), LlamaTokenizerFast rebuilds the template from add_bos_token /
// add_eos_token, padding_side (LlamaTokenizerFast: left) and truncation_side. transformers 5's
// CLIPTokenizer and T5Tokenizer keep only the file's vocabulary (and merges) and build the rest
// as their class does (from_dir does the same).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::tokenizers {

namespace bpe_detail {
struct Normalizer;
struct PreTokenizer;
}  // namespace bpe_detail

class BpeTokenizer : public Tokenizer {
 public:
  // One entry of tokenizer.json's added_tokens (and of added_tokens_decoder).
  struct Added {
    std::string content;
    int64_t id = 0;
    bool special = false;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
  };

  // Parses tokenizer.json (`file` names it in errors). Without the folder's config files: the
  // post-processor as written, no pad token, right padding.
  BpeTokenizer(const nlohmann::json& tokenizer_json, const std::filesystem::path& file);
  ~BpeTokenizer() override;

  // Reads tokenizer.json and the folder's tokenizer_config.json / special_tokens_map.json as
  // transformers does. tokenizer_class overrides the config's (diffusers' model_index.json names
  // the class it loads, e.g. LlamaTokenizerFast).
  static std::unique_ptr<BpeTokenizer> from_dir(const std::filesystem::path& dir,
                                                const std::string& tokenizer_class = "");
  // Qwen2's slow tokenizer files (vocab.json + merges.txt + tokenizer_config.json, no
  // tokenizer.json, as save_pretrained of transformers' Qwen2Tokenizer writes them): the same
  // tokenizer as transformers' Qwen2Converter builds from them (NFC, Qwen2's pre-tokenizer regex,
  // byte-level BPE by merge rank, no unk), with added_tokens_decoder's tokens at their ids; the
  // rest as from_dir. Equal to the slow Qwen2Tokenizer of transformers 4.57.1.
  static std::unique_ptr<BpeTokenizer> from_qwen2_slow_dir(const std::filesystem::path& dir,
                                                           const std::string& tokenizer_class = "");

  std::string kind() const override { return "bpe"; }
  std::vector<int64_t> text_ids(const std::string& text) const override;
  int64_t size() const override;

  // The model's tokens for the text (added tokens written in it kept whole), without special
  // tokens of the post-processor.
  std::vector<std::string> tokenize(const std::string& text) const;
  std::optional<int64_t> token_to_id(const std::string& token) const;
  int64_t model_max_length() const { return model_max_length_; }
  bool padding_left() const { return padding_left_; }

 protected:
  std::vector<int64_t> with_special_tokens(std::vector<int64_t> ids) const override;

 private:
  struct Segment {
    std::string text;       // ordinary text (normalized)
    int64_t id = -1;        // >= 0: an added token
    bool at_start = false;  // ordinary text that starts at offset 0 of the input
  };
  struct TemplateItem {
    bool sequence = false;
    std::vector<int64_t> ids;  // the special token's ids
  };

  // from_dir's reading of tokenizer_config.json / special_tokens_map.json.
  static void read_folder_config(BpeTokenizer& tokenizer, const std::filesystem::path& dir,
                                 const std::string& tokenizer_class);
  void add_token(Added token);  // tokenizers' AddedVocabulary::add_tokens for one token
  void refresh_added();
  std::vector<Segment> split_added(const std::string& text, bool normalized) const;
  std::vector<Segment> extract_and_normalize(const std::string& text) const;
  std::vector<std::string> pre_tokenize(const std::string& text, bool at_start) const;
  // The model's ids for one pre-tokenized word (cached): BPE merges or the Unigram lattice.
  const std::vector<int64_t>& bpe(const std::string& word, std::vector<int64_t>& scratch) const;
  std::vector<int64_t> merge_word(const std::string& word) const;
  std::vector<int64_t> unigram_word(const std::string& word) const;
  void read_unigram(const nlohmann::json& model);

  std::filesystem::path file_;
  std::unique_ptr<bpe_detail::Normalizer> normalizer_;
  std::unique_ptr<bpe_detail::PreTokenizer> pre_tokenizer_;

  // BPE (merges by rank) or Unigram (the best-scoring segmentation, SentencePiece's model).
  enum class ModelKind { kBpe, kUnigram };
  ModelKind model_kind_ = ModelKind::kBpe;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<double> unigram_scores_;  // by id
  std::optional<int64_t> unigram_unk_id_;
  double unigram_min_score_ = 0.0;
  size_t max_piece_bytes_ = 0;
  std::vector<std::string> id_to_token_;  // model ids (empty strings where the vocab has holes)
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges_;  // (a, b) -> (rank, new id)
  std::optional<std::string> unk_token_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  std::vector<Added> added_;  // in insertion order
  std::unordered_map<std::string, size_t> added_by_content_;
  // Per trie (non-normalized, normalized): token indices bucketed by first byte, longest first;
  // contents matched in the normalized trie are the normalized contents.
  struct Trie {
    std::vector<std::pair<std::string, size_t>> entries;
    std::vector<std::vector<size_t>> by_first_byte;
  };
  Trie trie_[2];

  std::vector<TemplateItem> template_;
  int64_t model_max_length_ = 0;
  bool split_special_tokens_ = false;  // special added tokens in the text are not matched

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace xfuser::models::tokenizers
