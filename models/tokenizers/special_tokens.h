// What a tokenizer folder says about special and added tokens (tokenizer_config.json,
// special_tokens_map.json, added_tokens.json), and transformers' splitting of a text on the added
// tokens written in it (PreTrainedTokenizer.tokenize: trie split, lstrip/rstrip/single_word).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace xfuser::models::tokenizers {

// transformers' AddedToken with its id.
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool special = true;
};

struct TokenizerFolder {
  std::filesystem::path dir;
  nlohmann::json config = nlohmann::json::object();  // tokenizer_config.json, {} when absent
  std::vector<AddedToken> added_tokens;              // added_tokens_decoder, else added_tokens.json
  bool has_added_token_info = false;                 // either source was present

  // Reads the JSON files of a tokenizer folder (all optional).
  static TokenizerFolder read(const std::filesystem::path& dir);

  // The content of a special token ("bos_token", "pad_token", ...): special_tokens_map.json wins
  // over tokenizer_config.json; nullopt when neither names it (or it is null).
  std::optional<std::string> special_token(const std::string& key) const;
  // Whether either file mentions the key at all (an explicit null counts).
  bool mentions(const std::string& key) const;
  // additional_special_tokens (special_tokens_map.json wins over tokenizer_config.json).
  std::vector<std::string> additional_special_tokens() const;

 private:
  nlohmann::json special_map_ = nlohmann::json::object();
};

// Splits text around added tokens, as transformers does before running the model tokenizer.
class AddedTokenSplitter {
 public:
  AddedTokenSplitter() = default;
  explicit AddedTokenSplitter(std::vector<AddedToken> tokens);

  struct Piece {
    std::string text;
    const AddedToken* token = nullptr;  // non-null: the piece is this added token
  };
  // Leftmost-longest matches of added-token contents; pieces stripped of the whitespace an
  // lstrip/rstrip token eats; empty ordinary pieces dropped.
  std::vector<Piece> split(const std::string& text) const;

  const AddedToken* find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  std::map<std::string, size_t, std::less<>> by_content_;
  std::vector<std::vector<size_t>> by_first_byte_;  // [256] -> token indices, longest first
};

// transformers' PreTrainedTokenizer.__init__ (_add_tokens of all_special_tokens_extended): each
// special token not yet among the added tokens becomes one, with its vocabulary id (vocab_id),
// else the next free id (size(), i.e. len(tokenizer)).
void add_special_tokens(std::vector<AddedToken>& added, const std::vector<std::string>& specials,
                        const std::function<std::optional<int64_t>(const std::string&)>& vocab_id,
                        const std::function<int64_t()>& size);

// Python str.lstrip()/rstrip() on UTF-8 (str.isspace characters).
std::string python_lstrip(const std::string& text);
std::string python_rstrip(const std::string& text);

}  // namespace xfuser::models::tokenizers
