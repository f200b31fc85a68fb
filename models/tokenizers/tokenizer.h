// Text tokenizers for the text encoders (CLIP byte-level BPE, T5 SentencePiece), equal to the
// transformers v4.44.2 slow tokenizers called as
//   tokenizer(texts, padding="max_length", max_length=N, truncation=True).
// Free of torch: ids are std::vector<int64_t>.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/tokenizers/special_tokens.h"

namespace xfuser::models::tokenizers {

struct Encoding {
  std::vector<int64_t> input_ids;       // [max_length]
  std::vector<int64_t> attention_mask;  // [max_length], 1 = real token (special tokens included)
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "clip" or "t5".
  virtual std::string kind() const = 0;

  // tokenizer(text).input_ids: special tokens added, no truncation, no padding.
  std::vector<int64_t> encode_ids(const std::string& text) const;
  // Truncated to max_length (keeping the closing special token) and right-padded with the pad id.
  Encoding encode(const std::string& text, int64_t max_length) const;
  std::vector<Encoding> encode(const std::vector<std::string>& texts, int64_t max_length) const;

  // Ids of the text without special tokens (tokenize + convert_tokens_to_ids).
  virtual std::vector<int64_t> text_ids(const std::string& text) const = 0;

  std::optional<int64_t> bos_id() const { return bos_id_; }
  std::optional<int64_t> eos_id() const { return eos_id_; }
  std::optional<int64_t> pad_id() const { return pad_id_; }
  // Number of ids, added tokens included (len(tokenizer)).
  virtual int64_t size() const = 0;

 protected:
  // build_inputs_with_special_tokens for one sequence.
  virtual std::vector<int64_t> with_special_tokens(std::vector<int64_t> ids) const = 0;
  // How many ids with_special_tokens adds to an empty sequence.
  int64_t num_special_tokens() const;

  std::optional<int64_t> bos_id_;
  std::optional<int64_t> eos_id_;
  std::optional<int64_t> pad_id_;
};

// Chooses the tokenizer from the folder's files: vocab.json + merges.txt -> CLIP,
// spiece.model -> T5. Throws xfuser::Error naming the folder when neither is present.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir);

}  // namespace xfuser::models::tokenizers
