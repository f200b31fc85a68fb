// T5's SentencePiece tokenizer, equal to transformers v4.44.2 T5Tokenizer (slow, legacy=True):
// added tokens (<extra_id_*>, </s>, <pad>, ...) matched in the text, each remaining piece encoded
// by the SentencePiece model, `</s>` appended (unless already last), no BOS.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "models/tokenizers/special_tokens.h"
#include "models/tokenizers/spm_library.h"
#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::tokenizers {

class T5Tokenizer : public Tokenizer {
 public:
  struct Options {
    std::string eos_token = "</s>";
    std::string unk_token = "<unk>";
    std::optional<std::string> pad_token = "<pad>";
    // Added tokens; when the folder lists none, `extra_ids` <extra_id_i> tokens are created at
    // piece_size + extra_ids - 1 - i as T5Tokenizer does.
    std::vector<std::string> additional_special_tokens;
    std::vector<AddedToken> added_tokens;
    bool has_added_token_info = false;
    int64_t extra_ids = 100;
  };

  T5Tokenizer(std::unique_ptr<SentencePieceModel> model, Options options);

  // Reads spiece.model and the special tokens of a tokenizer folder.
  static std::unique_ptr<T5Tokenizer> from_dir(const std::filesystem::path& dir);

  std::string kind() const override { return "t5"; }
  std::vector<int64_t> text_ids(const std::string& text) const override;
  int64_t size() const override;

  const SentencePieceModel& model() const { return *model_; }

 protected:
  std::vector<int64_t> with_special_tokens(std::vector<int64_t> ids) const override;

 private:
  int64_t size_with(const std::vector<AddedToken>& added) const;

  std::unique_ptr<SentencePieceModel> model_;
  AddedTokenSplitter added_;
};

}  // namespace xfuser::models::tokenizers
