#include "models/tokenizers/bpe_trainer.h"

#include <map>
#include <memory>

#include <unicode/regex.h>
#include <unicode/utext.h>

#include "backends/error.h"

namespace xfuser::models::tokenizers {
using nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode, in its order: printable bytes first, then the rest as 256 + n.
std::vector<std::pair<int, std::string>> byte_symbols() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  std::vector<bool> seen(256, false);
  for (int b : bs) seen[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (!seen[b]) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::vector<std::pair<int, std::string>> out;
  for (size_t i = 0; i < bs.size(); ++i) out.emplace_back(bs[i], utf8(cs[i]));
  return out;
}

json added_token(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

std::vector<std::string> split_isolated(const std::string& text, const std::string& pattern) {
  UParseError parse_error{};
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexPattern> compiled(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse_error, status));
  XF_CHECK(U_SUCCESS(status) && compiled != nullptr, "BPE trainer: cannot compile the regex '",
           pattern, "' (", u_errorName(status), " at offset ", parse_error.offset, ")");
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::unique_ptr<UText, UText* (*)(UText*)> ut(
      utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status),
      utext_close);
  XF_CHECK(U_SUCCESS(status), "ICU cannot open the text: ", u_errorName(status));
  std::unique_ptr<icu::RegexMatcher> matcher(compiled->matcher(status));
  XF_CHECK(U_SUCCESS(status), "ICU regex matcher: ", u_errorName(status));
  matcher->reset(ut.get());
  size_t last = 0;
  while (matcher->find(status) && U_SUCCESS(status)) {
    const auto start = static_cast<size_t>(matcher->start64(status));
    const auto end = static_cast<size_t>(matcher->end64(status));
    if (end <= start) continue;
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = end;
  }
  XF_CHECK(U_SUCCESS(status), "ICU regex search failed: ", u_errorName(status));
  if (last < text.size()) out.push_back(text.substr(last));
  return out;
}

std::string train_byte_level_bpe(const std::string& corpus, const BpeTrainerOptions& options) {
  XF_CHECK(!options.split_pattern.empty(), "BPE trainer: split_pattern is empty");
  XF_CHECK(options.num_merges >= 0, "BPE trainer: num_merges ", options.num_merges, " < 0");
  const auto symbols = byte_symbols();
  std::map<int, std::string> byte_to_symbol(symbols.begin(), symbols.end());
  std::map<std::vector<std::string>, int64_t> words;
  const auto pieces =
      options.pieces ? options.pieces(corpus) : split_isolated(corpus, options.split_pattern);
  for (const auto& piece : pieces) {
    std::vector<std::string> w;
    for (unsigned char c : piece) w.push_back(byte_to_symbol.at(c));
    ++words[w];
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (int m = 0; m < options.num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> counts;
    for (const auto& [w, freq] : words) {
      for (size_t k = 0; k + 1 < w.size(); ++k) counts[{w[k], w[k + 1]}] += freq;
    }
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;  // ties: the first (lexicographic)
    }
    if (best->second < 2) break;
    const auto pair = best->first;
    merges.push_back(pair);
    std::map<std::vector<std::string>, int64_t> merged;
    for (const auto& [w, freq] : words) {
      std::vector<std::string> out;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == pair.first && w[k + 1] == pair.second) {
          out.push_back(pair.first + pair.second);
          ++k;
        } else {
          out.push_back(w[k]);
        }
      }
      merged[out] += freq;
    }
    words = std::move(merged);
  }
  json vocab = json::object();
  json added = json::array();
  int64_t id = 0;
  auto add_specials = [&] {
    for (const auto& special : options.special_tokens) {
      XF_CHECK(!vocab.contains(special), "BPE trainer: special token '", special,
               "' is already in the vocabulary");
      added.push_back(added_token(id, special));
      vocab[special] = id++;
    }
  };
  if (options.specials_first) add_specials();
  for (const auto& [b, symbol] : symbols) vocab[symbol] = id++;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    // A merge whose result is already a token (another pair made it) keeps its first id.
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  if (!options.specials_first) {
    // Specials after the merges: in added_tokens only (the vocab holds the learned tokens).
    for (const auto& special : options.special_tokens) added.push_back(added_token(id++, special));
  }
  json tokenizer = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer",
                     {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"},
                         {"pattern", {{"Regex", options.split_pattern}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", true},
                         {"use_regex", false}}}}}},
                    {"post_processor", options.post_processor},
                    {"decoder",
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}}},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", true},
                      {"vocab", vocab},
                      {"merges", merge_list}}}};
  return tokenizer.dump(2) + "\n";
}

}  // namespace xfuser::models::tokenizers
