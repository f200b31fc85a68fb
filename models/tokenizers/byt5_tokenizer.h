// ByT5's byte tokenizer, equal to transformers 4.57.1 ByT5Tokenizer (HunyuanVideo-1.5's
// tokenizer_2, for the glyph encoder): added tokens written in the text are matched first (<pad>
// 0, </s> 1 and <unk> 2 with lstrip / rstrip, then the additional special tokens <extra_id_i>),
// every other UTF-8 byte b becomes id b + 3; `</s>` is appended unless already last. len 384 with
// the 125 extra ids (259 + i for <extra_id_i>, in the order transformers adds them).
//
// Read from the folder as ByT5Tokenizer.from_pretrained reads it: tokenizer_config.json
// (added_tokens_decoder, extra_ids, additional_special_tokens, eos / unk / pad tokens),
// special_tokens_map.json and added_tokens.json; with none of them, the class defaults.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "models/tokenizers/special_tokens.h"
#include "models/tokenizers/tokenizer.h"

namespace xfuser::models::tokenizers {

class ByT5Tokenizer : public Tokenizer {
 public:
  static constexpr int64_t kOffset = 3;  // <pad>, </s>, <unk> come before the 256 bytes

  struct Options {
    std::string eos_token = "</s>";
    std::string unk_token = "<unk>";
    std::string pad_token = "<pad>";
    int64_t extra_ids = 125;
    std::vector<std::string> additional_special_tokens;  // empty: <extra_id_0..extra_ids-1>
    std::vector<AddedToken> added_tokens;                // the folder's, when it lists them
  };

  explicit ByT5Tokenizer(Options options);
  static std::unique_ptr<ByT5Tokenizer> from_dir(const std::filesystem::path& dir);

  std::string kind() const override { return "byt5"; }
  std::vector<int64_t> text_ids(const std::string& text) const override;
  int64_t size() const override;

 protected:
  std::vector<int64_t> with_special_tokens(std::vector<int64_t> ids) const override;

 private:
  int64_t size_with(const std::vector<AddedToken>& added) const;
  AddedTokenSplitter added_;
};

}  // namespace xfuser::models::tokenizers
