#include "models/tokenizers/byt5_tokenizer.h"

#include <algorithm>
#include <map>
#include <set>

#include "backends/error.h"

namespace xfuser::models::tokenizers {
namespace {

// UTF-8 of the code point c < 0x100 (the token chr(c) of ByT5's vocabulary).
std::string latin1_char(int c) {
  std::string s;
  if (c < 0x80) {
    s.push_back(static_cast<char>(c));
  } else {
    s.push_back(static_cast<char>(0xC0 | (c >> 6)));
    s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return s;
}

AddedToken stripping_token(const std::string& content, int64_t id) {
  AddedToken token;  // ByT5Tokenizer wraps pad / eos / unk as AddedToken(lstrip=True, rstrip=True)
  token.content = content;
  token.id = id;
  token.lstrip = token.rstrip = true;
  return token;
}

}  // namespace

ByT5Tokenizer::ByT5Tokenizer(Options options) {
  XF_CHECK(options.extra_ids >= 0, "ByT5 tokenizer: extra_ids must be >= 0, got ",
           options.extra_ids);
  std::vector<std::string> additional = std::move(options.additional_special_tokens);
  if (options.extra_ids > 0 && additional.empty()) {
    for (int64_t i = 0; i < options.extra_ids; ++i) {
      additional.push_back("<extra_id_" + std::to_string(i) + ">");
    }
  } else if (options.extra_ids > 0) {
    std::set<std::string> extra;
    for (const auto& t : additional) {
      if (t.find("extra_id") != std::string::npos) extra.insert(t);
    }
    XF_CHECK(static_cast<int64_t>(extra.size()) == options.extra_ids, "ByT5 tokenizer: extra_ids (",
             options.extra_ids, ") and additional_special_tokens (", additional.size(),
             " given) disagree: the additional special tokens must include the ", options.extra_ids,
             " <extra_id_*> tokens (transformers raises the same)");
  }
  // {0: pad, 1: eos, 2: unk}, then the folder's added_tokens_decoder over them (by id).
  std::map<int64_t, AddedToken> by_id = {{0, stripping_token(options.pad_token, 0)},
                                         {1, stripping_token(options.eos_token, 1)},
                                         {2, stripping_token(options.unk_token, 2)}};
  for (auto& token : options.added_tokens) by_id[token.id] = std::move(token);
  std::vector<AddedToken> added;
  for (auto& [id, token] : by_id) added.push_back(std::move(token));
  // The special tokens not yet added take the next ids (len(tokenizer)), as
  // PreTrainedTokenizer.__init__ adds all_special_tokens_extended.
  std::vector<std::string> specials = {options.eos_token, options.unk_token, options.pad_token};
  specials.insert(specials.end(), additional.begin(), additional.end());
  add_special_tokens(
      added, specials, [](const std::string&) -> std::optional<int64_t> { return std::nullopt; },
      [this, &added] { return size_with(added); });
  added_ = AddedTokenSplitter(std::move(added));
  eos_id_ = added_.find(options.eos_token)->id;
  pad_id_ = added_.find(options.pad_token)->id;
}

std::unique_ptr<ByT5Tokenizer> ByT5Tokenizer::from_dir(const std::filesystem::path& dir) {
  XF_CONTEXT("loading the ByT5 tokenizer in ", dir);
  XF_CHECK(std::filesystem::is_directory(dir), "ByT5 tokenizer folder ", dir, " does not exist");
  const TokenizerFolder folder = TokenizerFolder::read(dir);
  Options options;
  if (auto t = folder.special_token("eos_token")) options.eos_token = *t;
  if (auto t = folder.special_token("unk_token")) options.unk_token = *t;
  if (auto t = folder.special_token("pad_token")) options.pad_token = *t;
  if (auto extra = folder.config.find("extra_ids");
      extra != folder.config.end() && !extra->is_null()) {
    XF_CHECK(extra->is_number_integer(), dir / "tokenizer_config.json",
             ": extra_ids must be an integer, got ", extra->dump());
    options.extra_ids = extra->get<int64_t>();
  }
  options.additional_special_tokens = folder.additional_special_tokens();
  options.added_tokens = folder.added_tokens;
  for (const auto& token : options.added_tokens) {
    XF_CHECK(token.id >= 0, dir, ": added token '", token.content, "' has a negative id ",
             token.id);
  }
  if (auto side = folder.config.find("padding_side"); side != folder.config.end()) {
    XF_CHECK(side->is_string() && (*side == "left" || *side == "right"),
             dir / "tokenizer_config.json", ": padding_side must be \"left\" or \"right\"");
  }
  if (auto side = folder.config.find("truncation_side"); side != folder.config.end()) {
    XF_CHECK(side->is_string() && (*side == "left" || *side == "right"),
             dir / "tokenizer_config.json", ": truncation_side must be \"left\" or \"right\"");
  }
  std::unique_ptr<ByT5Tokenizer> tokenizer;
  try {
    tokenizer = std::make_unique<ByT5Tokenizer>(std::move(options));
  } catch (const Error& e) {
    XF_THROW(dir / "tokenizer_config.json", " / special_tokens_map.json: ", e.what());
  }
  tokenizer->source_ = dir.string();
  if (auto side = folder.config.find("padding_side"); side != folder.config.end()) {
    tokenizer->padding_left_ = *side == "left";
  }
  if (auto side = folder.config.find("truncation_side"); side != folder.config.end()) {
    tokenizer->truncation_left_ = *side == "left";
  }
  return tokenizer;
}

int64_t ByT5Tokenizer::size() const { return size_with(added_.tokens()); }

int64_t ByT5Tokenizer::size_with(const std::vector<AddedToken>& added) const {
  // len(tokenizer): distinct keys of get_vocab(), i.e. chr(0..255) and the added contents.
  std::set<std::string> keys;
  for (int c = 0; c < 256; ++c) keys.insert(latin1_char(c));
  for (const auto& token : added) keys.insert(token.content);
  return static_cast<int64_t>(keys.size());
}

std::vector<int64_t> ByT5Tokenizer::text_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (const auto& piece : added_.split(text)) {
    if (piece.token != nullptr) {
      ids.push_back(piece.token->id);
      continue;
    }
    for (const unsigned char b : piece.text) ids.push_back(static_cast<int64_t>(b) + kOffset);
  }
  return ids;
}

std::vector<int64_t> ByT5Tokenizer::with_special_tokens(std::vector<int64_t> ids) const {
  // _add_eos_if_not_present.
  if (ids.empty() || ids.back() != *eos_id_) ids.push_back(*eos_id_);
  return ids;
}

}  // namespace xfuser::models::tokenizers
