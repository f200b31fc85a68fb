// Text tokenizers for the text encoders (CLIP byte-level BPE, T5 SentencePiece: equal to the
// transformers v4.44.2 slow tokenizers; tokenizer.json byte-level BPE for Llama 3 / Qwen2 /
// Mistral: equal to the fast ones, bpe_tokenizer.h) called as
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

  // "clip", "t5", "byt5" or "bpe".
  virtual std::string kind() const = 0;

  // tokenizer(text).input_ids: special tokens added, no truncation, no padding.
  std::vector<int64_t> encode_ids(const std::string& text) const;
  // Truncated to max_length (text ids dropped, special tokens kept; from the left when
  // truncation_side is "left") and padded with the pad id (on the left when padding_side is
  // "left": mask zeros first). add_special_tokens false: tokenizer(text, add_special_tokens=False,
  // ...), as a processor's apply_chat_template calls it (the template writes the bos itself).
  Encoding encode(const std::string& text, int64_t max_length,
                  bool add_special_tokens = true) const;
  std::vector<Encoding> encode(const std::vector<std::string>& texts, int64_t max_length) const;

  // Ids of the text without special tokens (tokenize + convert_tokens_to_ids).
  virtual std::vector<int64_t> text_ids(const std::string& text) const = 0;

  std::optional<int64_t> bos_id() const { return bos_id_; }
  std::optional<int64_t> eos_id() const { return eos_id_; }
  std::optional<int64_t> pad_id() const { return pad_id_; }
  bool padding_left() const { return padding_left_; }        // padding_side == "left"
  bool truncation_left() const { return truncation_left_; }  // truncation_side == "left"
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
  bool padding_left_ = false;     // transformers' padding_side == "left"
  bool truncation_left_ = false;  // truncation_side == "left"
  std::string source_;            // the folder or file, named in encode() errors when set
};

// Chooses the tokenizer from the folder's files and tokenizer_config.json's tokenizer_class:
// vocab.json + merges.txt with no class or a CLIP class -> CLIP; spiece.model with no class or a
// T5 class -> T5; a ByT5Tokenizer class -> ByT5 (byt5_tokenizer.h, no vocabulary file);
// otherwise tokenizer.json -> BpeTokenizer (Qwen2.5 folders carry vocab.json +
// merges.txt too: their class decides; a CLIP or T5 folder saved by transformers 5 has only
// tokenizer.json, read as transformers 5's class reads it); a Qwen2Tokenizer(Fast) class without
// tokenizer.json ->
// BpeTokenizer::from_qwen2_slow_dir (vocab.json + merges.txt + tokenizer_config.json).
// tokenizer_class, when given, overrides the config's (as diffusers' model_index.json does). Throws
// xfuser::Error naming the folder when none fits.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir,
                                          const std::string& tokenizer_class = "");

}  // namespace xfuser::models::tokenizers
