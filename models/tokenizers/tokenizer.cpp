#include "models/tokenizers/tokenizer.h"

#include "backends/error.h"
#include "models/tokenizers/clip_tokenizer.h"
#include "models/tokenizers/t5_tokenizer.h"

namespace xfuser::models::tokenizers {

std::vector<int64_t> Tokenizer::encode_ids(const std::string& text) const {
  return with_special_tokens(text_ids(text));
}

int64_t Tokenizer::num_special_tokens() const {
  return static_cast<int64_t>(with_special_tokens({}).size());
}

Encoding Tokenizer::encode(const std::string& text, int64_t max_length) const {
  const int64_t num_special = num_special_tokens();
  XF_CHECK(max_length >= num_special, kind(), " tokenizer: max_length ", max_length,
           " cannot hold the ", num_special, " special token(s)");
  std::vector<int64_t> ids = text_ids(text);
  // transformers' prepare_for_model: drop ids from the right so ids + special tokens fit.
  const int64_t overflow = static_cast<int64_t>(ids.size()) + num_special - max_length;
  if (overflow > 0) ids.resize(ids.size() - static_cast<size_t>(overflow));
  Encoding out;
  out.input_ids = with_special_tokens(std::move(ids));
  out.attention_mask.assign(out.input_ids.size(), 1);
  if (static_cast<int64_t>(out.input_ids.size()) < max_length) {
    XF_CHECK(pad_id_.has_value(), kind(), " tokenizer has no pad token: cannot pad to ",
             max_length);
    out.input_ids.resize(static_cast<size_t>(max_length), *pad_id_);
    out.attention_mask.resize(static_cast<size_t>(max_length), 0);
  }
  return out;
}

std::vector<Encoding> Tokenizer::encode(const std::vector<std::string>& texts,
                                        int64_t max_length) const {
  std::vector<Encoding> out;
  out.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    XF_CONTEXT("tokenizing text ", i);
    out.push_back(encode(texts[i], max_length));
  }
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir) {
  XF_CONTEXT("loading the tokenizer in ", dir);
  XF_CHECK(std::filesystem::is_directory(dir), "tokenizer folder ", dir, " does not exist");
  if (std::filesystem::exists(dir / "vocab.json") && std::filesystem::exists(dir / "merges.txt")) {
    return ClipTokenizer::from_dir(dir);
  }
  if (std::filesystem::exists(dir / "spiece.model")) return T5Tokenizer::from_dir(dir);
  XF_THROW("tokenizer folder ", dir,
           " has neither vocab.json + merges.txt (CLIP) nor spiece.model (T5)");
}

}  // namespace xfuser::models::tokenizers
