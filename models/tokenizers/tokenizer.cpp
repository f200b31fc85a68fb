#include "models/tokenizers/tokenizer.h"

#include "backends/error.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/byt5_tokenizer.h"
#include "models/tokenizers/clip_tokenizer.h"
#include "models/tokenizers/t5_tokenizer.h"

namespace xfuser::models::tokenizers {

std::vector<int64_t> Tokenizer::encode_ids(const std::string& text) const {
  return with_special_tokens(text_ids(text));
}

int64_t Tokenizer::num_special_tokens() const {
  return static_cast<int64_t>(with_special_tokens({}).size());
}

Encoding Tokenizer::encode(const std::string& text, int64_t max_length,
                           bool add_special_tokens) const {
  const int64_t num_special = add_special_tokens ? num_special_tokens() : 0;
  const std::string where = source_.empty() ? std::string() : " (" + source_ + ")";
  XF_CHECK(max_length >= num_special, kind(), " tokenizer", where, ": max_length ", max_length,
           " cannot hold the ", num_special, " special token(s)");
  std::vector<int64_t> ids = text_ids(text);
  // transformers' prepare_for_model (and the fast tokenizer's truncation with its post-processor):
  // drop text ids so ids + special tokens fit.
  const int64_t overflow = static_cast<int64_t>(ids.size()) + num_special - max_length;
  if (overflow > 0) {
    if (truncation_left_) {
      ids.erase(ids.begin(), ids.begin() + overflow);
    } else {
      ids.resize(ids.size() - static_cast<size_t>(overflow));
    }
  }
  Encoding out;
  out.input_ids = add_special_tokens ? with_special_tokens(std::move(ids)) : std::move(ids);
  out.attention_mask.assign(out.input_ids.size(), 1);
  if (static_cast<int64_t>(out.input_ids.size()) < max_length) {
    XF_CHECK(pad_id_.has_value(), kind(), " tokenizer", where,
             " has no pad token: cannot pad to max_length ", max_length,
             " (transformers raises too; set pad_token in tokenizer_config.json)");
    const size_t pad = static_cast<size_t>(max_length) - out.input_ids.size();
    if (padding_left_) {
      out.input_ids.insert(out.input_ids.begin(), pad, *pad_id_);
      out.attention_mask.insert(out.attention_mask.begin(), pad, 0);
    } else {
      out.input_ids.resize(static_cast<size_t>(max_length), *pad_id_);
      out.attention_mask.resize(static_cast<size_t>(max_length), 0);
    }
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

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir,
                                          const std::string& tokenizer_class) {
  XF_CONTEXT("loading the tokenizer in ", dir);
  XF_CHECK(std::filesystem::is_directory(dir), "tokenizer folder ", dir, " does not exist");
  namespace fs = std::filesystem;
  std::string cls = tokenizer_class;
  if (cls.empty() && fs::exists(dir / "tokenizer_config.json")) {
    const TokenizerFolder folder = TokenizerFolder::read(dir);
    const auto it = folder.config.find("tokenizer_class");
    if (it != folder.config.end() && it->is_string()) cls = it->get<std::string>();
  }
  const auto starts_with = [&cls](const char* prefix) { return cls.rfind(prefix, 0) == 0; };
  const bool clip_class = cls.empty() || starts_with("CLIPTokenizer");
  const bool t5_class = cls.empty() || starts_with("T5Tokenizer");
  if (clip_class && fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    return ClipTokenizer::from_dir(dir);
  }
  if (t5_class && fs::exists(dir / "spiece.model")) return T5Tokenizer::from_dir(dir);
  // ByT5 has no vocabulary file: its class (tokenizer_config.json or the caller's) decides.
  if (starts_with("ByT5Tokenizer")) return ByT5Tokenizer::from_dir(dir);
  // A CLIP or T5 class reads its slow tokenizer's files when the folder has them (the classes of
  // transformers 4); a folder saved by transformers 5 holds only tokenizer.json, read as
  // transformers 5's class reads it.
  const bool has_json = fs::exists(dir / "tokenizer.json");
  XF_CHECK(has_json || cls.empty() || !starts_with("CLIPTokenizer"), "tokenizer folder ", dir,
           ": tokenizer_class ", cls, " needs tokenizer.json or vocab.json + merges.txt (",
           fs::exists(dir / "vocab.json") ? "merges.txt" : "vocab.json", " is missing)");
  XF_CHECK(has_json || cls.empty() || !starts_with("T5Tokenizer"), "tokenizer folder ", dir,
           ": tokenizer_class ", cls, " needs tokenizer.json or spiece.model");
  if (has_json) return BpeTokenizer::from_dir(dir, cls);
  // Qwen2Tokenizer's save_pretrained writes no tokenizer.json: build it from the slow files.
  if (starts_with("Qwen2Tokenizer")) {
    XF_CHECK(fs::exists(dir / "vocab.json") || fs::exists(dir / "merges.txt"), "tokenizer folder ",
             dir, ": tokenizer_class ", cls,
             " needs tokenizer.json or vocab.json + merges.txt (it has none of them)");
    return BpeTokenizer::from_qwen2_slow_dir(dir, tokenizer_class);
  }
  XF_THROW("tokenizer folder ", dir,
           " has neither vocab.json + merges.txt (CLIP), spiece.model (T5), tokenizer.json nor "
           "a ByT5Tokenizer tokenizer_class in tokenizer_config.json",
           cls.empty() ? std::string() : " for its tokenizer_class " + cls);
}

}  // namespace xfuser::models::tokenizers
