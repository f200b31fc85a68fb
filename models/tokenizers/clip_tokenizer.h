// CLIP's byte-level BPE tokenizer, equal to transformers v4.44.2 CLIPTokenizer (slow) without
// ftfy: BasicTokenizer clean-up (control characters dropped, whitespace to ' ', spaces around CJK
// ideographs, NFC, lower case, no accent stripping), CLIP's split regex, bytes_to_unicode, BPE
// merges by rank with `</w>` word ends, <|startoftext|> X <|endoftext|>.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/tokenizers/special_tokens.h"
#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::tokenizers {

class ClipTokenizer : public Tokenizer {
 public:
  struct Options {
    std::string bos_token = "<|startoftext|>";
    std::string eos_token = "<|endoftext|>";
    std::string unk_token = "<|endoftext|>";
    std::optional<std::string> pad_token = "<|endoftext|>";
    std::vector<std::string> additional_special_tokens;
    std::vector<AddedToken> added_tokens;
  };

  // vocab: token -> id (vocab.json); merges: ranked pairs (merges.txt without its header line).
  ClipTokenizer(std::unordered_map<std::string, int64_t> vocab,
                std::vector<std::pair<std::string, std::string>> merges, Options options);

  // Reads vocab.json, merges.txt and the special tokens of a tokenizer folder.
  static std::unique_ptr<ClipTokenizer> from_dir(const std::filesystem::path& dir);

  std::string kind() const override { return "clip"; }
  std::vector<int64_t> text_ids(const std::string& text) const override;
  int64_t size() const override;

  // tokenizer.tokenize(text): BPE tokens (added tokens written in the text kept whole).
  std::vector<std::string> tokenize(const std::string& text) const;
  // The text clean-up the BPE sees (BasicTokenizer output joined by ' ').
  static std::u32string normalize(const std::u32string& text);
  // CLIP's split regex: the substrings re.findall returns.
  static std::vector<std::u32string> pre_tokenize(const std::u32string& normalized);

 protected:
  std::vector<int64_t> with_special_tokens(std::vector<int64_t> ids) const override;

 private:
  std::vector<std::string> bpe(const std::string& token) const;
  std::vector<std::string> tokenize_ordinary(const std::string& text) const;
  int64_t token_to_id(const std::string& token) const;
  int64_t size_with(const std::vector<AddedToken>& added) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int64_t> ranks_;  // "first second" -> rank
  std::string unk_token_;
  AddedTokenSplitter added_;
  std::string byte_symbols_[256];

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;
};

}  // namespace xfuser::models::tokenizers
