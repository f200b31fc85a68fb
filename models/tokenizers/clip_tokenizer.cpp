#include "models/tokenizers/clip_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "backends/error.h"
#include "models/tokenizers/text_unicode.h"

namespace xfuser::models::tokenizers {
namespace {

// CLIPTokenizer reads at most this many merges (49152 - 256 - 2).
constexpr size_t kMaxMerges = 49152 - 256 - 2;
// The BPE cache is bounded; clearing it changes nothing but speed.
constexpr size_t kMaxCacheEntries = 1 << 16;
constexpr const char* kWordEnd = "</w>";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
void build_byte_symbols(std::string (&symbols)[256]) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    std::string s;
    unicode::append_utf8(s, printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n));
    if (!printable) ++n;
    symbols[b] = std::move(s);
  }
}

// BasicTokenizer._is_chinese_char.
bool is_cjk(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// Python str.split() with no argument.
std::vector<std::u32string> split_python_whitespace(const std::u32string& text) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && unicode::is_python_space(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !unicode::is_python_space(text[i])) ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

std::u32string join_space(const std::vector<std::u32string>& parts) {
  std::u32string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back(U' ');
    out += parts[i];
  }
  return out;
}

// The regex runs with re.IGNORECASE: a character belongs to \p{L} / \p{N} when one of its case
// variants does, and literal letters compare case-folded.
bool letter_ci(char32_t cp) { return unicode::any_case_variant(cp, unicode::is_letter); }
bool number_ci(char32_t cp) { return unicode::any_case_variant(cp, unicode::is_number); }

bool literal_at(const std::u32string& text, size_t pos, std::u32string_view literal) {
  if (pos + literal.size() > text.size()) return false;
  for (size_t k = 0; k < literal.size(); ++k) {
    if (unicode::fold_case(text[pos + k]) != unicode::fold_case(literal[k])) return false;
  }
  return true;
}

}  // namespace

ClipTokenizer::ClipTokenizer(std::unordered_map<std::string, int64_t> vocab,
                             std::vector<std::pair<std::string, std::string>> merges,
                             Options options)
    : vocab_(std::move(vocab)), unk_token_(options.unk_token) {
  build_byte_symbols(byte_symbols_);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // dict(zip(merges, range(n))): a repeated pair keeps its last rank.
    ranks_[merges[rank].first + " " + merges[rank].second] = static_cast<int64_t>(rank);
  }
  std::vector<AddedToken> added = std::move(options.added_tokens);
  std::vector<std::string> specials = {options.bos_token, options.eos_token, options.unk_token};
  if (options.pad_token) specials.push_back(*options.pad_token);
  for (auto& t : options.additional_special_tokens) specials.push_back(t);
  add_special_tokens(
      added, specials,
      [this](const std::string& token) -> std::optional<int64_t> {
        const auto it = vocab_.find(token);
        return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
      },
      [this, &added] { return size_with(added); });
  added_ = AddedTokenSplitter(std::move(added));
  cache_["<|startoftext|>"] = {"<|startoftext|>"};
  cache_["<|endoftext|>"] = {"<|endoftext|>"};
  bos_id_ = token_to_id(options.bos_token);
  eos_id_ = token_to_id(options.eos_token);
  if (options.pad_token) pad_id_ = token_to_id(*options.pad_token);
}

std::unique_ptr<ClipTokenizer> ClipTokenizer::from_dir(const std::filesystem::path& dir) {
  XF_CONTEXT("loading the CLIP tokenizer in ", dir);
  std::unordered_map<std::string, int64_t> vocab;
  {
    std::ifstream in(dir / "vocab.json");
    XF_CHECK(in.good(), "cannot open ", dir / "vocab.json");
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      XF_THROW("cannot parse ", dir / "vocab.json", ": ", e.what());
    }
    XF_CHECK(json.is_object(), dir / "vocab.json", " is not a JSON object");
    std::unordered_map<int64_t, std::string> tokens;
    for (const auto& [token, id] : json.items()) {
      XF_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, dir / "vocab.json", ": id of '",
               token, "' is not a non-negative integer (", id.dump(), ")");
      const auto [it, fresh] = tokens.emplace(id.get<int64_t>(), token);
      XF_CHECK(fresh, dir / "vocab.json", ": '", token, "' and '", it->second,
               "' have the same id ", id.get<int64_t>());
      vocab[token] = id.get<int64_t>();
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  {
    std::ifstream in(dir / "merges.txt", std::ios::binary);
    XF_CHECK(in.good(), "cannot open ", dir / "merges.txt");
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string content = buffer.str();
    const std::string file = (dir / "merges.txt").string();
    // The file is UTF-8 (the symbols are byte-level BPE's printable stand-ins); a malformed
    // sequence is an error at its line, not a symbol that silently never matches.
    const auto valid_utf8 = [](std::string_view text) {
      try {
        unicode::utf8_to_utf32(text);
        return true;
      } catch (const xfuser::Error&) {
        return false;
      }
    };
    if (!valid_utf8(content)) {
      size_t begin = 0;
      for (size_t line = 1;; ++line) {
        const size_t end = content.find('\n', begin);
        XF_CHECK(valid_utf8(std::string_view(content).substr(begin, end - begin)), file, ":", line,
                 ": not valid UTF-8");
        if (end == std::string::npos) break;
        begin = end + 1;
      }
    }
    // read().strip().split("\n")[1:kMaxMerges + 1]: the first line (the #version header) is
    // always skipped. transformers takes every other line as merge.split(), so a line that is
    // not two symbols would silently never match: here it is an error naming the line.
    const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    size_t b = 0, e = content.size();
    while (b < e && is_space(content[b])) ++b;
    while (e > b && is_space(content[e - 1])) --e;
    std::istringstream lines(content.substr(b, e - b));
    std::string line;
    size_t line_no = 0;
    const size_t leading_lines =
        static_cast<size_t>(std::count(content.begin(), content.begin() + b, '\n'));
    while (std::getline(lines, line)) {
      if (line_no++ == 0) continue;
      if (merges.size() >= kMaxMerges) break;
      std::istringstream fields(line);
      std::string first, second, extra;
      XF_CHECK((fields >> first >> second) && !(fields >> extra), file, ":",
               line_no + leading_lines, ": '", line,
               "' is not a merge: two symbols separated by a space");
      merges.emplace_back(std::move(first), std::move(second));
    }
  }
  const TokenizerFolder folder = TokenizerFolder::read(dir);
  Options options;
  if (auto t = folder.special_token("bos_token")) options.bos_token = *t;
  if (auto t = folder.special_token("eos_token")) options.eos_token = *t;
  if (auto t = folder.special_token("unk_token")) options.unk_token = *t;
  if (folder.mentions("pad_token")) options.pad_token = folder.special_token("pad_token");
  options.additional_special_tokens = folder.additional_special_tokens();
  options.added_tokens = folder.added_tokens;
  // An added token that is also in vocab.json must have the same id there: transformers would
  // take the added token's, and vocab.json's entry would silently never be produced.
  for (const AddedToken& t : options.added_tokens) {
    const auto it = vocab.find(t.content);
    XF_CHECK(it == vocab.end() || it->second == t.id, "CLIP tokenizer: the added token '",
             t.content, "' has id ", t.id, " in the folder's tokenizer config but ", it->second,
             " in ", (dir / "vocab.json").string());
  }
  // The tokens every encoding uses must have ids the text model knows: in vocab.json or among
  // the folder's added tokens. (transformers would append a new id past the vocabulary, which the
  // text model then rejects as an input id far from the cause.)
  std::vector<std::pair<std::string, std::string>> used = {{"bos_token", options.bos_token},
                                                           {"eos_token", options.eos_token},
                                                           {"unk_token", options.unk_token}};
  if (options.pad_token) used.emplace_back("pad_token", *options.pad_token);
  for (const auto& entry : used) {
    const std::string& token = entry.second;
    const bool added = std::any_of(options.added_tokens.begin(), options.added_tokens.end(),
                                   [&](const AddedToken& t) { return t.content == token; });
    XF_CHECK(vocab.count(token) || added, "CLIP tokenizer: the ", entry.first, " '", token,
             "' is not in ", (dir / "vocab.json").string(),
             " (nor an added token of the folder): the vocabulary does not match the "
             "tokenizer's special tokens");
  }
  return std::make_unique<ClipTokenizer>(std::move(vocab), std::move(merges), std::move(options));
}

int64_t ClipTokenizer::size() const { return size_with(added_.tokens()); }

int64_t ClipTokenizer::size_with(const std::vector<AddedToken>& added) const {
  // len(tokenizer): distinct keys of the vocabulary and the added tokens.
  std::set<std::string> extra;
  for (const auto& token : added) {
    if (vocab_.count(token.content) == 0) extra.insert(token.content);
  }
  return static_cast<int64_t>(vocab_.size() + extra.size());
}

int64_t ClipTokenizer::token_to_id(const std::string& token) const {
  if (const AddedToken* added = added_.find(token)) return added->id;
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  const auto unk = vocab_.find(unk_token_);
  XF_CHECK(unk != vocab_.end(), "CLIP tokenizer: token '", token,
           "' is not in the vocabulary and neither is the unk token '", unk_token_, "'");
  return unk->second;
}

std::u32string ClipTokenizer::normalize(const std::u32string& text) {
  // BasicTokenizer._clean_text: drop NUL, U+FFFD and category C* (except \t\n\r); whitespace
  // (\t\n\r, ' ', Zs) becomes ' '.
  std::u32string cleaned;
  cleaned.reserve(text.size());
  for (char32_t cp : text) {
    const bool whitespace_char = cp == U'\t' || cp == U'\n' || cp == U'\r';
    if (cp == 0 || cp == 0xFFFD || (!whitespace_char && unicode::is_other(cp))) continue;
    if (whitespace_char || cp == U' ' || unicode::is_space_separator(cp)) {
      cleaned.push_back(U' ');
    } else {
      cleaned.push_back(cp);
    }
  }
  // _tokenize_chinese_chars.
  std::u32string spaced;
  spaced.reserve(cleaned.size());
  for (char32_t cp : cleaned) {
    if (is_cjk(cp)) {
      spaced.push_back(U' ');
      spaced.push_back(cp);
      spaced.push_back(U' ');
    } else {
      spaced.push_back(cp);
    }
  }
  // NFC, whitespace split, lower-case each token (no accent stripping, no punctuation split),
  // then whitespace_tokenize(" ".join(...)) and the caller's " ".join.
  std::vector<std::u32string> tokens = split_python_whitespace(unicode::nfc(spaced));
  for (auto& token : tokens) token = unicode::to_lower(token);
  return join_space(split_python_whitespace(join_space(tokens)));
}

std::vector<std::u32string> ClipTokenizer::pre_tokenize(const std::u32string& text) {
  // <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
  // with re.IGNORECASE; alternatives tried in order at each position, as re.findall does.
  static const std::u32string_view kLiterals[] = {
      U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (const auto& literal : kLiterals) {
      if (literal_at(text, i, literal)) {
        out.emplace_back(text.substr(i, literal.size()));
        i += literal.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    const char32_t cp = text[i];
    if (letter_ci(cp)) {
      size_t j = i + 1;
      while (j < text.size() && letter_ci(text[j])) ++j;
      out.emplace_back(text.substr(i, j - i));
      i = j;
    } else if (number_ci(cp)) {
      out.emplace_back(1, cp);
      ++i;
    } else if (!unicode::is_white_space(cp)) {
      size_t j = i + 1;
      while (j < text.size() && !unicode::is_white_space(text[j]) && !letter_ci(text[j]) &&
             !number_ci(text[j])) {
        ++j;
      }
      out.emplace_back(text.substr(i, j - i));
      i = j;
    } else {
      ++i;  // whitespace matches nothing
    }
  }
  return out;
}

std::vector<std::string> ClipTokenizer::bpe(const std::string& token) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(token); it != cache_.end()) return it->second;
  }
  // Symbols: the token's characters (each one byte's symbol), `</w>` on the last.
  std::vector<std::string> word;
  const std::u32string chars = unicode::utf8_to_utf32(token);
  for (char32_t cp : chars) {
    std::string s;
    unicode::append_utf8(s, cp);
    word.push_back(std::move(s));
  }
  XF_CHECK(!word.empty(), "CLIP BPE on an empty token");
  word.back() += kWordEnd;
  if (word.size() == 1) return word;

  while (word.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    size_t best = 0;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      const auto it = ranks_.find(word[k] + " " + word[k + 1]);
      if (it != ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[best];
    const std::string second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == first && word[k + 1] == second) {
        merged.push_back(first + second);
        k += 2;
      } else {
        merged.push_back(word[k]);
        ++k;
      }
    }
    word = std::move(merged);
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) {
    cache_.clear();
    cache_["<|startoftext|>"] = {"<|startoftext|>"};
    cache_["<|endoftext|>"] = {"<|endoftext|>"};
  }
  cache_.emplace(token, word);
  return word;
}

std::vector<std::string> ClipTokenizer::tokenize_ordinary(const std::string& text) const {
  std::vector<std::string> tokens;
  const std::u32string normalized = normalize(unicode::utf8_to_utf32(text));
  for (const auto& piece : pre_tokenize(normalized)) {
    std::string encoded;
    for (unsigned char byte : unicode::utf32_to_utf8(piece)) encoded += byte_symbols_[byte];
    for (auto& token : bpe(encoded)) tokens.push_back(std::move(token));
  }
  return tokens;
}

std::vector<std::string> ClipTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> tokens;
  for (const auto& piece : added_.split(text)) {
    if (piece.token != nullptr) {
      tokens.push_back(piece.text);
    } else {
      for (auto& token : tokenize_ordinary(piece.text)) tokens.push_back(std::move(token));
    }
  }
  return tokens;
}

std::vector<int64_t> ClipTokenizer::text_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const auto& token : tokenize(text)) ids.push_back(token_to_id(token));
  return ids;
}

std::vector<int64_t> ClipTokenizer::with_special_tokens(std::vector<int64_t> ids) const {
  ids.insert(ids.begin(), *bos_id_);
  ids.push_back(*eos_id_);
  return ids;
}

}  // namespace xfuser::models::tokenizers
