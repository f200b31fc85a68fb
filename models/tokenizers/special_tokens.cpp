#include "models/tokenizers/special_tokens.h"

#include <algorithm>
#include <fstream>

#include "backends/error.h"
#include "models/tokenizers/text_unicode.h"

namespace xfuser::models::tokenizers {
namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "cannot open ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("cannot parse ", path, ": ", e.what());
  }
}

bool flag(const nlohmann::json& obj, const char* key, bool fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  XF_CHECK(it->is_boolean(), "added token field '", key, "' must be a boolean");
  return it->get<bool>();
}

// A special token entry is a string, {"content": ...} or {"__type": "AddedToken", ...}.
std::optional<std::string> token_content(const nlohmann::json& value, const std::string& key) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  XF_CHECK(value.is_object() && value.contains("content") && value["content"].is_string(),
           "special token '", key, "' must be a string or an object with a 'content' string");
  return value["content"].get<std::string>();
}

// Byte length of the UTF-8 code point starting with lead byte b.
size_t utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  return 4;
}

}  // namespace

TokenizerFolder TokenizerFolder::read(const std::filesystem::path& dir) {
  TokenizerFolder folder;
  folder.dir = dir;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    folder.config = read_json(dir / "tokenizer_config.json");
    XF_CHECK(folder.config.is_object(), dir / "tokenizer_config.json", " is not a JSON object");
  }
  if (std::filesystem::exists(dir / "special_tokens_map.json")) {
    folder.special_map_ = read_json(dir / "special_tokens_map.json");
    XF_CHECK(folder.special_map_.is_object(), dir / "special_tokens_map.json",
             " is not a JSON object");
  }
  if (folder.config.contains("added_tokens_decoder")) {
    const auto& decoder = folder.config["added_tokens_decoder"];
    XF_CHECK(decoder.is_object(), "tokenizer_config.json: added_tokens_decoder must be an object");
    for (const auto& [id_text, entry] : decoder.items()) {
      AddedToken token;
      try {
        token.id = std::stoll(id_text);
      } catch (const std::exception&) {
        XF_THROW("tokenizer_config.json: added token id '", id_text, "' is not an integer");
      }
      XF_CHECK(entry.is_object() && entry.contains("content") && entry["content"].is_string(),
               "tokenizer_config.json: added token ", id_text, " lacks a 'content' string");
      token.content = entry["content"].get<std::string>();
      token.lstrip = flag(entry, "lstrip", false);
      token.rstrip = flag(entry, "rstrip", false);
      token.single_word = flag(entry, "single_word", false);
      token.special = flag(entry, "special", true);
      folder.added_tokens.push_back(std::move(token));
    }
    folder.has_added_token_info = true;
  } else if (std::filesystem::exists(dir / "added_tokens.json")) {
    const auto added = read_json(dir / "added_tokens.json");
    XF_CHECK(added.is_object(), dir / "added_tokens.json", " is not a JSON object");
    for (const auto& [content, id] : added.items()) {
      XF_CHECK(id.is_number_integer(), "added_tokens.json: id of '", content,
               "' is not an integer");
      AddedToken token;
      token.content = content;
      token.id = id.get<int64_t>();
      folder.added_tokens.push_back(std::move(token));
    }
    folder.has_added_token_info = true;
  }
  std::sort(folder.added_tokens.begin(), folder.added_tokens.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return folder;
}

std::optional<std::string> TokenizerFolder::special_token(const std::string& key) const {
  if (special_map_.contains(key)) return token_content(special_map_[key], key);
  if (config.contains(key)) return token_content(config[key], key);
  return std::nullopt;
}

bool TokenizerFolder::mentions(const std::string& key) const {
  return special_map_.contains(key) || config.contains(key);
}

std::vector<std::string> TokenizerFolder::additional_special_tokens() const {
  // transformers 5 writes the list as extra_special_tokens (a dict there names model-specific
  // tokens, e.g. {"image_token": "<image>"}: its values are special tokens too).
  const nlohmann::json* list = nullptr;
  std::string key;
  for (const char* name : {"additional_special_tokens", "extra_special_tokens"}) {
    if (list != nullptr) break;
    if (special_map_.contains(name)) {
      list = &special_map_[name];
    } else if (config.contains(name)) {
      list = &config[name];
    }
    key = name;
  }
  std::vector<std::string> out;
  if (list == nullptr || list->is_null()) return out;
  XF_CHECK(list->is_array() || (key == "extra_special_tokens" && list->is_object()),
           (dir / "tokenizer_config.json").string(), ": ", key, " must be a list");
  for (const auto& [name, entry] : list->items()) {
    if (auto content = token_content(entry, key)) out.push_back(*content);
  }
  return out;
}

void add_special_tokens(std::vector<AddedToken>& added, const std::vector<std::string>& specials,
                        const std::function<std::optional<int64_t>(const std::string&)>& vocab_id,
                        const std::function<int64_t()>& size) {
  for (const auto& content : specials) {
    const bool known = std::any_of(added.begin(), added.end(),
                                   [&](const AddedToken& t) { return t.content == content; });
    if (known) continue;
    AddedToken token;
    token.content = content;
    token.id = vocab_id(content).value_or(size());
    added.push_back(std::move(token));
  }
}

AddedTokenSplitter::AddedTokenSplitter(std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)), by_first_byte_(256) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    XF_CHECK(!tokens_[i].content.empty(), "added token ", tokens_[i].id, " has empty content");
    by_content_[tokens_[i].content] = i;  // a later duplicate wins, as in a Python dict
  }
  for (const auto& [content, index] : by_content_) {
    by_first_byte_[static_cast<unsigned char>(content[0])].push_back(index);
  }
  for (auto& bucket : by_first_byte_) {
    std::sort(bucket.begin(), bucket.end(), [this](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedTokenSplitter::find(std::string_view content) const {
  const auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

std::vector<AddedTokenSplitter::Piece> AddedTokenSplitter::split(const std::string& text) const {
  std::vector<Piece> pieces;
  if (tokens_.empty()) {
    if (!text.empty()) pieces.push_back({text, nullptr});
    return pieces;
  }
  // 1. Trie split: the earliest match, the longest one at that position.
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t index : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const auto& content = tokens_[index].content;
      if (text.compare(i, content.size(), content) == 0) {
        match = &tokens_[index];
        break;
      }
    }
    if (match == nullptr) {
      i += utf8_length(static_cast<unsigned char>(text[i]));
      continue;
    }
    if (i > start) pieces.push_back({text.substr(start, i - start), nullptr});
    pieces.push_back({match->content, match});
    i += match->content.size();
    start = i;
  }
  if (start < text.size()) pieces.push_back({text.substr(start), nullptr});

  // 2. Whitespace eaten by lstrip/rstrip tokens; single_word glueing (transformers' order).
  for (size_t k = 0; k < pieces.size(); ++k) {
    const AddedToken* token = pieces[k].token;
    if (token == nullptr) continue;
    Piece* left = k > 0 ? &pieces[k - 1] : nullptr;
    Piece* right = k + 1 < pieces.size() ? &pieces[k + 1] : nullptr;
    if (token->rstrip && right != nullptr && !right->text.empty()) {
      right->text = python_lstrip(right->text);
    }
    if (token->lstrip && left != nullptr && !left->text.empty()) {
      left->text = python_rstrip(left->text);
    }
    if (token->single_word && left != nullptr && !left->text.empty() && left->text.back() != ' ') {
      left->text += pieces[k].text;
      left->token = nullptr;
      pieces[k].text.clear();
      pieces[k].token = nullptr;
    } else if (token->single_word && right != nullptr && !right->text.empty() &&
               right->text.front() != ' ') {
      right->text = pieces[k].text + right->text;
      right->token = nullptr;
      pieces[k].text.clear();
      pieces[k].token = nullptr;
    }
  }
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    if (!piece.text.empty()) out.push_back(std::move(piece));
  }
  return out;
}

std::string python_lstrip(const std::string& text) {
  const std::u32string cps = unicode::utf8_to_utf32(text);
  size_t b = 0;
  while (b < cps.size() && unicode::is_python_space(cps[b])) ++b;
  return unicode::utf32_to_utf8(std::u32string_view(cps).substr(b));
}

std::string python_rstrip(const std::string& text) {
  const std::u32string cps = unicode::utf8_to_utf32(text);
  size_t e = cps.size();
  while (e > 0 && unicode::is_python_space(cps[e - 1])) --e;
  return unicode::utf32_to_utf8(std::u32string_view(cps).substr(0, e));
}

}  // namespace xfuser::models::tokenizers
