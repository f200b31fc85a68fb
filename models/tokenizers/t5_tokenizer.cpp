#include "models/tokenizers/t5_tokenizer.h"

#include <algorithm>
#include <set>

#include "backends/error.h"

namespace xfuser::models::tokenizers {

T5Tokenizer::T5Tokenizer(std::unique_ptr<SentencePieceModel> model, Options options)
    : model_(std::move(model)) {
  XF_CHECK(model_ != nullptr, "T5 tokenizer needs a SentencePiece model");
  std::vector<AddedToken> added = std::move(options.added_tokens);
  if (!options.has_added_token_info && added.empty()) {
    const int64_t pieces = model_->piece_size();
    for (int64_t i = 0; i < options.extra_ids; ++i) {
      AddedToken token;
      token.content = "<extra_id_" + std::to_string(i) + ">";
      token.id = pieces + options.extra_ids - 1 - i;
      token.lstrip = token.rstrip = true;
      added.push_back(std::move(token));
    }
  }
  std::vector<std::string> specials = {options.eos_token, options.unk_token};
  if (options.pad_token) specials.push_back(*options.pad_token);
  for (auto& t : options.additional_special_tokens) specials.push_back(t);
  add_special_tokens(
      added, specials,
      [this](const std::string& token) -> std::optional<int64_t> {
        if (!model_->has_piece(token)) return std::nullopt;
        return model_->piece_to_id(token);
      },
      [this, &added] { return size_with(added); });
  added_ = AddedTokenSplitter(std::move(added));
  eos_id_ = added_.find(options.eos_token)->id;
  if (options.pad_token) pad_id_ = added_.find(*options.pad_token)->id;
}

std::unique_ptr<T5Tokenizer> T5Tokenizer::from_dir(const std::filesystem::path& dir) {
  XF_CONTEXT("loading the T5 tokenizer in ", dir);
  const TokenizerFolder folder = TokenizerFolder::read(dir);
  if (auto legacy = folder.config.find("legacy");
      legacy != folder.config.end() && !legacy->is_null()) {
    XF_CHECK(legacy->is_boolean(), dir / "tokenizer_config.json", ": legacy must be a boolean");
    XF_CHECK(legacy->get<bool>(), dir / "tokenizer_config.json",
             ": legacy=false T5 tokenization is not supported (only transformers' legacy "
             "behaviour, its default)");
  }
  if (auto kwargs = folder.config.find("sp_model_kwargs");
      kwargs != folder.config.end() && !kwargs->is_null()) {
    XF_CHECK(kwargs->is_object() && kwargs->empty(), dir / "tokenizer_config.json",
             ": sp_model_kwargs ", kwargs->dump(), " are not supported");
  }
  Options options;
  if (auto t = folder.special_token("eos_token")) options.eos_token = *t;
  if (auto t = folder.special_token("unk_token")) options.unk_token = *t;
  if (folder.mentions("pad_token")) options.pad_token = folder.special_token("pad_token");
  options.additional_special_tokens = folder.additional_special_tokens();
  options.added_tokens = folder.added_tokens;
  options.has_added_token_info = folder.has_added_token_info;
  if (auto extra = folder.config.find("extra_ids");
      extra != folder.config.end() && extra->is_number_integer()) {
    options.extra_ids = extra->get<int64_t>();
  }
  return std::make_unique<T5Tokenizer>(SentencePieceModel::load(dir / "spiece.model"),
                                       std::move(options));
}

int64_t T5Tokenizer::size() const { return size_with(added_.tokens()); }

int64_t T5Tokenizer::size_with(const std::vector<AddedToken>& added) const {
  // len(tokenizer): distinct keys of the piece vocabulary and the added tokens.
  std::set<std::string> extra;
  for (const auto& token : added) {
    if (!model_->has_piece(token.content)) extra.insert(token.content);
  }
  return model_->piece_size() + static_cast<int64_t>(extra.size());
}

std::vector<int64_t> T5Tokenizer::text_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& piece : added_.split(text)) {
    if (piece.token != nullptr) {
      ids.push_back(piece.token->id);
      continue;
    }
    for (int64_t id : model_->encode(piece.text)) ids.push_back(id);
  }
  return ids;
}

std::vector<int64_t> T5Tokenizer::with_special_tokens(std::vector<int64_t> ids) const {
  // _add_eos_if_not_present.
  if (ids.empty() || ids.back() != *eos_id_) ids.push_back(*eos_id_);
  return ids;
}

}  // namespace xfuser::models::tokenizers
