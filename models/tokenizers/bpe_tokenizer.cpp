#include "models/tokenizers/bpe_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>

#include <unicode/brkiter.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include "backends/base64.h"
#include "backends/error.h"
#include "models/tokenizers/special_tokens.h"
#include "models/tokenizers/text_unicode.h"

namespace xfuser::models::tokenizers {
namespace bpe_detail {

// The BPE cache is bounded; clearing it changes nothing but speed.
constexpr size_t kMaxCacheEntries = 1 << 16;

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenization regex (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
const std::string* byte_symbols() {
  static const auto* table = [] {
    auto* symbols = new std::string[256];
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      unicode::append_utf8(symbols[b],
                           printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n));
      if (!printable) ++n;
    }
    return symbols;
  }();
  return table;
}

// Decodes the code point at byte offset i of valid UTF-8 (the length goes to *len).
char32_t decode_at(const std::string& s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t n = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : 4;
  n = std::min(n, s.size() - i);
  char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

// Start of the code point ending at byte offset end (> 0).
size_t previous_start(const std::string& s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

bool is_space(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// The regex crate's \w: Alphabetic, marks, decimal numbers, connector punctuation, Join_Control.
bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  const uint32_t mask = U_GET_GC_MASK(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (mask & U_GC_M_MASK) != 0 ||
         (mask & U_GC_ND_MASK) != 0 || (mask & U_GC_PC_MASK) != 0 ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

std::string where(const std::filesystem::path& file, const std::string& json_path) {
  return file.string() + ": " + json_path;
}

// A compiled regex; RegexPattern is immutable and shared across threads, each search makes its
// own matcher.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& context) {
    UParseError parse_error{};
    UErrorCode status = U_ZERO_ERROR;
    pattern_.reset(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse_error, status));
    XF_CHECK(U_SUCCESS(status) && pattern_ != nullptr, context, ": cannot compile the regex '",
             pattern, "' (", u_errorName(status), " at offset ", parse_error.offset, ")");
  }
  // Non-overlapping matches, leftmost first, as byte ranges of the UTF-8 text.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (text.empty()) return out;
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<UText, UText* (*)(UText*)> ut(
        utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status),
        utext_close);
    XF_CHECK(U_SUCCESS(status), "ICU cannot open the text: ", u_errorName(status));
    std::unique_ptr<icu::RegexMatcher> matcher(pattern_->matcher(status));
    XF_CHECK(U_SUCCESS(status), "ICU regex matcher: ", u_errorName(status));
    matcher->reset(ut.get());
    while (matcher->find(status) && U_SUCCESS(status)) {
      const int64_t start = matcher->start64(status);
      const int64_t end = matcher->end64(status);
      if (end > start) out.emplace_back(static_cast<size_t>(start), static_cast<size_t>(end));
    }
    XF_CHECK(U_SUCCESS(status), "ICU regex search failed: ", u_errorName(status));
    return out;
  }

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
};

}  // namespace

// SentencePiece's precompiled_charsmap: [u32 trie size in bytes][darts-clone double array of
// u32 units][NUL-separated replacement strings]. Read the way the `tokenizers` library's
// Precompiled normalizer reads it (its spm_precompiled crate).
class PrecompiledCharsMap {
 public:
  PrecompiledCharsMap(const std::string& blob, const std::string& context) {
    XF_CHECK(blob.size() >= 4, context, ": precompiled_charsmap is shorter than its header");
    uint32_t trie_bytes = 0;
    for (int i = 3; i >= 0; --i)
      trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(blob[i]);
    XF_CHECK(trie_bytes % 4 == 0 && trie_bytes <= blob.size() - 4, context,
             ": precompiled_charsmap's trie size ", trie_bytes, " does not fit its ", blob.size(),
             " bytes");
    units_.resize(trie_bytes / 4);
    for (size_t u = 0; u < units_.size(); ++u) {
      uint32_t v = 0;
      for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(blob[4 + 4 * u + i]);
      units_[u] = v;
    }
    normalized_ = blob.substr(4 + trie_bytes);
  }

  // The replacement of the shortest trie key that is a prefix of `chunk` (the library's
  // transform(): results[0] of the common-prefix search), nullopt when no key is.
  std::optional<std::string_view> transform(std::string_view chunk) const {
    if (units_.empty()) return std::nullopt;
    size_t node = offset(units_[0]);
    for (unsigned char c : chunk) {
      node ^= c;
      if (node >= units_.size()) return std::nullopt;
      const uint32_t unit = units_[node];
      if ((unit & ((1u << 31) | 0xFFu)) != c) return std::nullopt;  // label
      node ^= offset(unit);
      if ((unit >> 8) & 1u) {  // has a leaf: the value is an offset into the strings
        if (node >= units_.size()) return std::nullopt;
        const size_t start = units_[node] & ((1u << 31) - 1);
        if (start > normalized_.size()) return std::nullopt;
        const size_t end = normalized_.find('\0', start);
        return std::string_view(normalized_)
            .substr(start, (end == std::string::npos ? normalized_.size() : end) - start);
      }
    }
    return std::nullopt;
  }

  // Precompiled::normalize: per extended grapheme cluster, the whole cluster's replacement when
  // it is under 6 bytes and has one (a shorter key's replacement replaces the whole cluster, as
  // the library does), else each character's own.
  std::string apply(const std::string& text) const {
    if (text.empty() || units_.empty()) return text;
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::BreakIterator> graphemes(
        icu::BreakIterator::createCharacterInstance(icu::Locale::getRoot(), status));
    XF_CHECK(U_SUCCESS(status), "ICU grapheme iterator: ", u_errorName(status));
    std::unique_ptr<UText, UText* (*)(UText*)> ut(
        utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status),
        utext_close);
    XF_CHECK(U_SUCCESS(status), "ICU cannot open the text: ", u_errorName(status));
    graphemes->setText(ut.get(), status);
    XF_CHECK(U_SUCCESS(status), "ICU grapheme iterator: ", u_errorName(status));
    std::string out;
    out.reserve(text.size());
    int32_t start = graphemes->first();
    for (int32_t end = graphemes->next(); end != icu::BreakIterator::DONE;
         start = end, end = graphemes->next()) {
      const std::string_view cluster(text.data() + start, static_cast<size_t>(end - start));
      if (cluster.size() < 6) {
        if (const auto norm = transform(cluster)) {
          out += *norm;
          continue;
        }
      }
      for (size_t i = 0; i < cluster.size();) {
        size_t len = 0;
        decode_at(text, static_cast<size_t>(start) + i, &len);
        const std::string_view one = cluster.substr(i, len);
        const auto norm = transform(one);
        out += norm ? *norm : one;
        i += len;
      }
    }
    return out;
  }

 private:
  static size_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

  std::vector<uint32_t> units_;
  std::string normalized_;
};

// ---- normalizers ------------------------------------------------------------------------------

struct Normalizer {
  enum class Kind {
    kNfc,
    kNfd,
    kNfkc,
    kNfkd,
    kLowercase,
    kReplace,
    kPrepend,
    kPrecompiled,
    kStrip
  };
  struct Step {
    Kind kind;
    std::string literal;                            // Replace (String pattern), Prepend
    std::string content;                            // Replace
    std::shared_ptr<Regex> regex;                   // Replace (Regex pattern)
    std::shared_ptr<PrecompiledCharsMap> charsmap;  // Precompiled
    bool strip_left = true, strip_right = true;     // Strip
  };
  std::vector<Step> steps;

  std::string apply(std::string text) const {
    for (const auto& step : steps) text = apply_step(step, text);
    return text;
  }

  static std::string icu_normalize(const std::string& text, Kind kind) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = kind == Kind::kNfc    ? icu::Normalizer2::getNFCInstance(status)
                                : kind == Kind::kNfd  ? icu::Normalizer2::getNFDInstance(status)
                                : kind == Kind::kNfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                      : icu::Normalizer2::getNFKDInstance(status);
    XF_CHECK(U_SUCCESS(status), "ICU normaliser unavailable: ", u_errorName(status));
    const icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(text), status);
    XF_CHECK(U_SUCCESS(status), "ICU normalisation failed: ", u_errorName(status));
    std::string utf8;
    out.toUTF8String(utf8);
    return utf8;
  }

  static std::string apply_step(const Step& step, const std::string& text) {
    switch (step.kind) {
      case Kind::kNfc:
      case Kind::kNfd:
      case Kind::kNfkc:
      case Kind::kNfkd:
        return icu_normalize(text, step.kind);
      case Kind::kLowercase: {
        // Rust's char::to_lowercase one character at a time (no Final_Sigma context).
        std::string out;
        for (char32_t cp : unicode::utf8_to_utf32(text)) {
          icu::UnicodeString one(static_cast<UChar32>(cp));
          one.toLower(icu::Locale::getRoot());
          one.toUTF8String(out);
        }
        return out;
      }
      case Kind::kReplace: {
        std::string out;
        size_t prev = 0;
        if (step.regex) {
          for (const auto& [s, e] : step.regex->find_all(text)) {
            out.append(text, prev, s - prev);
            out += step.content;
            prev = e;
          }
        } else if (!step.literal.empty()) {
          for (size_t pos = text.find(step.literal); pos != std::string::npos;
               pos = text.find(step.literal, prev)) {
            out.append(text, prev, pos - prev);
            out += step.content;
            prev = pos + step.literal.size();
          }
        }
        out.append(text, prev, std::string::npos);
        return out;
      }
      case Kind::kPrepend:
        return text.empty() ? text : step.literal + text;
      case Kind::kPrecompiled:
        return step.charsmap ? step.charsmap->apply(text) : text;
      case Kind::kStrip: {
        size_t begin = 0, end = text.size();
        while (step.strip_left && begin < end) {
          size_t len = 0;
          if (!is_space(decode_at(text, begin, &len))) break;
          begin += len;
        }
        while (step.strip_right && end > begin) {
          const size_t prev = previous_start(text, end);
          size_t len = 0;
          if (!is_space(decode_at(text, prev, &len))) break;
          end = prev;
        }
        return text.substr(begin, end - begin);
      }
    }
    return text;
  }
};

// ---- pre-tokenizers ---------------------------------------------------------------------------

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel, kWhitespaceSplit, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind = Kind::kSplit;
    // Split
    std::shared_ptr<Regex> regex;
    std::string literal;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    // ByteLevel
    bool add_prefix_space = false;
    // Metaspace
    std::string replacement;
    Prepend prepend = Prepend::kAlways;
    bool split = true;
  };
  std::vector<Step> steps;

  // NormalizedString::split with a pattern's find_matches (ranges + whether each is a match).
  static void split(const std::string& text, const std::vector<std::pair<size_t, size_t>>& found,
                    Behavior behavior, bool invert, std::vector<std::string>& out,
                    std::vector<size_t>* starts = nullptr) {
    struct Range {
      size_t start, end;
      bool match;
    };
    std::vector<Range> matches;
    size_t prev = 0;
    for (const auto& [s, e] : found) {
      if (prev != s) matches.push_back({prev, s, invert});
      matches.push_back({s, e, !invert});
      prev = e;
    }
    if (prev != text.size()) matches.push_back({prev, text.size(), invert});
    std::vector<std::pair<size_t, size_t>> kept;
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kIsolated:
        for (const auto& m : matches) kept.emplace_back(m.start, m.end);
        break;
      case Behavior::kRemoved:
        for (const auto& m : matches) {
          if (!m.match) kept.emplace_back(m.start, m.end);
        }
        break;
      case Behavior::kContiguous:
        for (const auto& m : matches) {
          if (m.match == previous_match && !kept.empty()) {
            kept.back().second = m.end;
          } else {
            kept.emplace_back(m.start, m.end);
          }
          previous_match = m.match;
        }
        break;
      case Behavior::kMergedWithPrevious:
        for (const auto& m : matches) {
          if (m.match && !previous_match && !kept.empty()) {
            kept.back().second = m.end;
          } else {
            kept.emplace_back(m.start, m.end);
          }
          previous_match = m.match;
        }
        break;
      case Behavior::kMergedWithNext:
        for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
          if (it->match && !previous_match && !kept.empty()) {
            kept.back().first = it->start;
          } else {
            kept.emplace_back(it->start, it->end);
          }
          previous_match = it->match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
    }
    for (const auto& [s, e] : kept) {
      if (e <= s) continue;
      out.push_back(text.substr(s, e - s));
      if (starts != nullptr) starts->push_back(s);
    }
  }

  static std::vector<std::pair<size_t, size_t>> find_literal(const std::string& text,
                                                             const std::string& literal) {
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t pos = text.find(literal); pos != std::string::npos;
         pos = text.find(literal, pos + literal.size())) {
      out.emplace_back(pos, pos + literal.size());
    }
    return out;
  }

  // at_text_start: the text begins at offset 0 of the whole input (Metaspace's "first" scheme
  // prepends only to the piece there).
  std::vector<std::string> apply(const std::string& text, bool at_text_start = true) const {
    std::vector<std::string> pieces;
    std::vector<bool> first;  // the piece starts at offset 0 of the input
    if (!text.empty()) {
      pieces.push_back(text);
      first.push_back(at_text_start);
    }
    for (const auto& step : steps) {
      std::vector<std::string> next;
      std::vector<bool> next_first;
      const auto split_piece = [&](const std::string& piece, bool piece_first,
                                   const std::vector<std::pair<size_t, size_t>>& found,
                                   Behavior behavior, bool invert) {
        std::vector<size_t> starts;
        split(piece, found, behavior, invert, next, &starts);
        for (size_t start : starts) next_first.push_back(piece_first && start == 0);
      };
      for (size_t k = 0; k < pieces.size(); ++k) {
        std::string& piece = pieces[k];
        switch (step.kind) {
          case Kind::kSplit:
            split_piece(
                piece, first[k],
                step.regex ? step.regex->find_all(piece) : find_literal(piece, step.literal),
                step.behavior, step.invert);
            break;
          case Kind::kWhitespaceSplit: {
            // WhitespaceSplit: split on char::is_whitespace, the whitespace removed.
            std::vector<std::pair<size_t, size_t>> spaces;
            for (size_t i = 0; i < piece.size();) {
              size_t len = 0;
              if (is_space(decode_at(piece, i, &len))) spaces.emplace_back(i, i + len);
              i += len;
            }
            split_piece(piece, first[k], spaces, Behavior::kRemoved, false);
            break;
          }
          case Kind::kMetaspace: {
            std::string replaced;
            for (size_t pos = 0;;) {
              const size_t space = piece.find(' ', pos);
              replaced.append(piece, pos,
                              space == std::string::npos ? std::string::npos : space - pos);
              if (space == std::string::npos) break;
              replaced += step.replacement;
              pos = space + 1;
            }
            const bool starts_with = replaced.rfind(step.replacement, 0) == 0;
            if (!starts_with && (step.prepend == Prepend::kAlways ||
                                 (step.prepend == Prepend::kFirst && first[k]))) {
              replaced.insert(0, step.replacement);
            }
            if (step.split) {
              split_piece(replaced, first[k], find_literal(replaced, step.replacement),
                          Behavior::kMergedWithNext, false);
            } else if (!replaced.empty()) {
              next.push_back(std::move(replaced));
              next_first.push_back(first[k]);
            }
            break;
          }
          case Kind::kByteLevel: {
            if (step.add_prefix_space && piece.rfind(' ', 0) != 0) piece.insert(0, " ");
            std::vector<std::string> parts;
            if (step.regex) {
              split(piece, step.regex->find_all(piece), Behavior::kIsolated, false, parts);
            } else {
              parts.push_back(std::move(piece));
            }
            const std::string* symbols = byte_symbols();
            for (size_t p = 0; p < parts.size(); ++p) {
              std::string mapped;
              mapped.reserve(parts[p].size() * 2);
              for (unsigned char b : parts[p]) mapped += symbols[b];
              next.push_back(std::move(mapped));
              next_first.push_back(first[k] && p == 0);
            }
            break;
          }
        }
      }
      pieces = std::move(next);
      first = std::move(next_first);
    }
    return pieces;
  }
};

// ---- tokenizer.json parsing ---------------------------------------------------------------------

namespace {

std::string type_of(const Json& node, const std::filesystem::path& file, const std::string& path) {
  XF_CHECK(node.is_object() && node.contains("type") && node["type"].is_string(), where(file, path),
           " must be an object with a string 'type'");
  return node["type"].get<std::string>();
}

bool bool_field(const Json& node, const char* key, bool fallback, const std::filesystem::path& file,
                const std::string& path) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  XF_CHECK(it->is_boolean(), where(file, path + "." + key), " must be a boolean");
  return it->get<bool>();
}

std::string string_field(const Json& node, const char* key, const std::filesystem::path& file,
                         const std::string& path) {
  const auto it = node.find(key);
  XF_CHECK(it != node.end() && it->is_string(), where(file, path + "." + key), " must be a string");
  return it->get<std::string>();
}

// A Split / Replace pattern: {"String": s} or {"Regex": r}.
void read_pattern(const Json& node, const std::filesystem::path& file, const std::string& path,
                  std::shared_ptr<Regex>& regex, std::string& literal) {
  XF_CHECK(node.is_object() && node.size() == 1, where(file, path),
           " must be {\"String\": ...} or {\"Regex\": ...}");
  if (node.contains("Regex") && node["Regex"].is_string()) {
    regex = std::make_shared<Regex>(node["Regex"].get<std::string>(), where(file, path));
  } else if (node.contains("String") && node["String"].is_string()) {
    literal = node["String"].get<std::string>();
  } else {
    XF_THROW(where(file, path), " must be {\"String\": ...} or {\"Regex\": ...}, got ",
             node.dump());
  }
}

void read_normalizer(const Json& node, const std::filesystem::path& file, const std::string& path,
                     Normalizer& out) {
  if (node.is_null()) return;
  const std::string type = type_of(node, file, path);
  using Kind = Normalizer::Kind;
  Normalizer::Step step{};
  if (type == "Sequence") {
    XF_CHECK(node.contains("normalizers") && node["normalizers"].is_array(),
             where(file, path + ".normalizers"), " must be a list");
    for (size_t i = 0; i < node["normalizers"].size(); ++i) {
      read_normalizer(node["normalizers"][i], file,
                      path + ".normalizers[" + std::to_string(i) + "]", out);
    }
    return;
  } else if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    XF_CHECK(node.contains("pattern"), where(file, path + ".pattern"), " is missing");
    read_pattern(node["pattern"], file, path + ".pattern", step.regex, step.literal);
    step.content = string_field(node, "content", file, path);
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.literal = string_field(node, "prepend", file, path);
  } else if (type == "Precompiled") {
    step.kind = Kind::kPrecompiled;
    const auto it = node.find("precompiled_charsmap");
    XF_CHECK(it != node.end(), where(file, path + ".precompiled_charsmap"), " is missing");
    if (!it->is_null()) {
      const std::string context = where(file, path + ".precompiled_charsmap");
      XF_CHECK(it->is_string(), context, " must be a base64 string");
      const std::string blob = backends::base64_decode(it->get<std::string>(), context);
      // The library treats an empty charsmap as no normalisation.
      if (!blob.empty()) step.charsmap = std::make_shared<PrecompiledCharsMap>(blob, context);
    }
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.strip_left = bool_field(node, "strip_left", true, file, path);
    step.strip_right = bool_field(node, "strip_right", true, file, path);
  } else {
    XF_THROW(where(file, path + ".type"), ": normalizer '", type,
             "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, "
             "Precompiled, Strip, Sequence)");
  }
  out.steps.push_back(std::move(step));
}

void read_pre_tokenizer(const Json& node, const std::filesystem::path& file,
                        const std::string& path, PreTokenizer& out) {
  if (node.is_null()) return;
  const std::string type = type_of(node, file, path);
  PreTokenizer::Step step;
  if (type == "Sequence") {
    XF_CHECK(node.contains("pretokenizers") && node["pretokenizers"].is_array(),
             where(file, path + ".pretokenizers"), " must be a list");
    for (size_t i = 0; i < node["pretokenizers"].size(); ++i) {
      read_pre_tokenizer(node["pretokenizers"][i], file,
                         path + ".pretokenizers[" + std::to_string(i) + "]", out);
    }
    return;
  } else if (type == "Split") {
    XF_CHECK(node.contains("pattern"), where(file, path + ".pattern"), " is missing");
    read_pattern(node["pattern"], file, path + ".pattern", step.regex, step.literal);
    const std::string behavior = string_field(node, "behavior", file, path);
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      XF_THROW(where(file, path + ".behavior"), ": unknown split behavior '", behavior, "'");
    }
    step.invert = bool_field(node, "invert", false, file, path);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizer::Kind::kByteLevel;
    step.add_prefix_space = bool_field(node, "add_prefix_space", true, file, path);
    if (bool_field(node, "use_regex", true, file, path)) {
      step.regex = std::make_shared<Regex>(kGpt2Pattern, where(file, path));
    }
  } else if (type == "WhitespaceSplit") {
    step.kind = PreTokenizer::Kind::kWhitespaceSplit;
  } else if (type == "Metaspace") {
    step.kind = PreTokenizer::Kind::kMetaspace;
    step.replacement = string_field(node, "replacement", file, path);
    XF_CHECK(!step.replacement.empty(), where(file, path + ".replacement"), " is empty");
    if (node.contains("prepend_scheme") && !node["prepend_scheme"].is_null()) {
      const std::string scheme = string_field(node, "prepend_scheme", file, path);
      if (scheme == "always") {
        step.prepend = PreTokenizer::Prepend::kAlways;
      } else if (scheme == "first") {
        step.prepend = PreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        step.prepend = PreTokenizer::Prepend::kNever;
      } else {
        XF_THROW(where(file, path + ".prepend_scheme"), ": unknown scheme '", scheme,
                 "' (always, first or never)");
      }
    } else {
      // Files written before prepend_scheme existed say add_prefix_space.
      step.prepend = bool_field(node, "add_prefix_space", true, file, path)
                         ? PreTokenizer::Prepend::kAlways
                         : PreTokenizer::Prepend::kNever;
    }
    step.split = bool_field(node, "split", true, file, path);
  } else {
    XF_THROW(where(file, path + ".type"), ": pre-tokenizer '", type,
             "' is not supported (supported: Split, ByteLevel, WhitespaceSplit, Metaspace, "
             "Sequence)");
  }
  out.steps.push_back(std::move(step));
}

}  // namespace
}  // namespace bpe_detail

using bpe_detail::Json;

namespace {

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  XF_CHECK(in.good(), "cannot open ", path);
  // Parsing from memory is several times faster than from the stream (Llama 3's file is 9 MB).
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return nlohmann::json::parse(content);
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("cannot parse ", path, ": ", e.what());
  }
}

}  // namespace

namespace {

// transformers 5's CLIPTokenizer keeps tokenizer.json's vocabulary and merges and builds the rest
// itself: NFC, whitespace runs to ' ', lower case; CLIP's split regex and byte-level symbols; BPE
// with '</w>' word ends and the config's unk token (the post-processor is set from the config's
// bos / eos in read_folder_config).
void rebuild_as_clip(nlohmann::json& json, const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "tokenizer.json";
  XF_CHECK(json.is_object() && json.contains("model") && json["model"].is_object() &&
               json["model"].value("type", "BPE") == "BPE",
           file.string(), ": model: CLIPTokenizer needs a BPE model");
  std::string unk = "<|endoftext|>";
  const TokenizerFolder folder = TokenizerFolder::read(dir);
  if (auto token = folder.special_token("unk_token")) unk = *token;
  nlohmann::json& model = json["model"];
  model["dropout"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "</w>";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["unk_token"] = unk;
  json["normalizer"] = {{"type", "Sequence"},
                        {"normalizers",
                         {{{"type", "NFC"}},
                          {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                          {{"type", "Lowercase"}}}}};
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|"
            "[\\p{N}]|[^\\s\\p{L}\\p{N}]+"}}},
         {"behavior", "Removed"},
         {"invert", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  json["post_processor"] = nullptr;
}

// transformers 5's T5Tokenizer (T5 and UMT5 folders): tokenizer.json's Unigram pieces with unk id
// 2 (the class fixes it), its precompiled_charsmap as the only normaliser, whitespace split then
// Metaspace ("always" prepend); the "$A </s>" template is set in read_folder_config.
void rebuild_as_t5(nlohmann::json& json) {
  XF_CHECK(json.is_object() && json.contains("model") && json["model"].is_object() &&
               json["model"].value("type", "") == "Unigram",
           "tokenizer.json: model: T5Tokenizer needs a Unigram model");
  nlohmann::json& model = json["model"];
  model["unk_id"] = 2;
  model["byte_fallback"] = false;
  nlohmann::json charsmap;
  std::function<void(const nlohmann::json&)> find = [&](const nlohmann::json& node) {
    if (!node.is_object()) return;
    if (node.value("type", "") == "Precompiled" && node.contains("precompiled_charsmap") &&
        charsmap.is_null()) {
      charsmap = node;
    }
    if (node.contains("normalizers") && node["normalizers"].is_array()) {
      for (const auto& child : node["normalizers"]) find(child);
    }
  };
  if (json.contains("normalizer")) find(json["normalizer"]);
  json["normalizer"] = charsmap;
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "WhitespaceSplit"}},
                             {{"type", "Metaspace"},
                              {"replacement", "\u2581"},
                              {"prepend_scheme", "always"},
                              {"split", true}}}}};
  json["post_processor"] = nullptr;
}

}  // namespace

BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer::BpeTokenizer(const nlohmann::json& json, const std::filesystem::path& file)
    : file_(file),
      normalizer_(std::make_unique<bpe_detail::Normalizer>()),
      pre_tokenizer_(std::make_unique<bpe_detail::PreTokenizer>()) {
  using bpe_detail::where;
  source_ = file.string();
  XF_CHECK(json.is_object(), file, " is not a JSON object");
  // ---- model ----
  XF_CHECK(json.contains("model") && json["model"].is_object(), where(file, "model"),
           " is missing: tokenizer.json needs a model");
  const Json& model = json["model"];
  const std::string model_type = model.contains("type") && model["type"].is_string()
                                     ? model["type"].get<std::string>()
                                     : std::string("BPE");
  XF_CHECK(model_type == "BPE" || model_type == "Unigram", where(file, "model.type"), ": model '",
           model_type, "' is not supported (BPE or Unigram)");
  if (model_type == "Unigram") {
    read_unigram(model);
  } else {
    XF_CHECK(model.contains("vocab") && model["vocab"].is_object(), where(file, "model.vocab"),
             " must be an object token -> id");
    vocab_.reserve(model["vocab"].size());
    for (const auto& [token, id] : model["vocab"].items()) {
      XF_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                   id.get<int64_t>() < std::numeric_limits<int32_t>::max(),
               where(file, "model.vocab"), ": id of '", token, "' is not a non-negative integer");
      vocab_[token] = id.get<int64_t>();
    }
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      XF_CHECK(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0,
               where(file, "model.dropout"), ": BPE dropout is not supported (it is random)");
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      unk_token_ = model["unk_token"].get<std::string>();
    }
    fuse_unk_ = bpe_detail::bool_field(model, "fuse_unk", false, file, "model");
    byte_fallback_ = bpe_detail::bool_field(model, "byte_fallback", false, file, "model");
    ignore_merges_ = bpe_detail::bool_field(model, "ignore_merges", false, file, "model");
    if (model.contains("continuing_subword_prefix") &&
        model["continuing_subword_prefix"].is_string()) {
      continuing_subword_prefix_ = model["continuing_subword_prefix"].get<std::string>();
    }
    if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string()) {
      end_of_word_suffix_ = model["end_of_word_suffix"].get<std::string>();
    }
    XF_CHECK(model.contains("merges") && model["merges"].is_array(), where(file, "model.merges"),
             " must be a list");
    const Json& merges = model["merges"];
    merges_.reserve(merges.size());
    const auto vocab_id = [&](const std::string& token, size_t rank) {
      const auto it = vocab_.find(token);
      XF_CHECK(it != vocab_.end(), where(file, "model.merges[" + std::to_string(rank) + "]"), ": '",
               token, "' is not in the vocabulary");
      return it->second;
    };
    int64_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const Json& merge = merges[i];
      std::string a, b;
      if (merge.is_string()) {
        const std::string line = merge.get<std::string>();
        if (line.rfind("#version", 0) == 0) continue;
        const size_t space = line.find(' ');
        XF_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                 where(file, "model.merges[" + std::to_string(i) + "]"), ": '", line,
                 "' is not two tokens separated by one space");
        a = line.substr(0, space);
        b = line.substr(space + 1);
      } else {
        XF_CHECK(
            merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
            where(file, "model.merges[" + std::to_string(i) + "]"),
            " must be \"a b\" or [\"a\", \"b\"]");
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      }
      const size_t prefix = continuing_subword_prefix_.size();
      XF_CHECK(b.size() >= prefix, where(file, "model.merges[" + std::to_string(i) + "]"), ": '", b,
               "' is shorter than the continuing_subword_prefix");
      const int64_t new_id = vocab_id(a + b.substr(prefix), i);
      merges_[pair_key(vocab_id(a, i), vocab_id(b, i))] = {rank++, new_id};  // last rank wins
    }
  }
  // ---- normalizer, pre-tokenizer ----
  bpe_detail::read_normalizer(json.value("normalizer", Json()), file, "normalizer", *normalizer_);
  bpe_detail::read_pre_tokenizer(json.value("pre_tokenizer", Json()), file, "pre_tokenizer",
                                 *pre_tokenizer_);
  // ---- added tokens ----
  if (json.contains("added_tokens") && !json["added_tokens"].is_null()) {
    XF_CHECK(json["added_tokens"].is_array(), where(file, "added_tokens"), " must be a list");
    for (size_t i = 0; i < json["added_tokens"].size(); ++i) {
      const Json& entry = json["added_tokens"][i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      XF_CHECK(entry.is_object() && entry.contains("id") && entry["id"].is_number_integer(),
               where(file, path), " needs an integer 'id'");
      Added token;
      token.id = entry["id"].get<int64_t>();
      token.content = bpe_detail::string_field(entry, "content", file, path);
      XF_CHECK(!token.content.empty(), where(file, path), ": empty content");
      token.special = bpe_detail::bool_field(entry, "special", false, file, path);
      token.single_word = bpe_detail::bool_field(entry, "single_word", false, file, path);
      token.lstrip = bpe_detail::bool_field(entry, "lstrip", false, file, path);
      token.rstrip = bpe_detail::bool_field(entry, "rstrip", false, file, path);
      token.normalized = bpe_detail::bool_field(entry, "normalized", !token.special, file, path);
      if (auto it = added_by_content_.find(token.content); it != added_by_content_.end()) {
        added_[it->second] = token;
      } else {
        added_by_content_[token.content] = added_.size();
        added_.push_back(token);
      }
    }
  }
  refresh_added();
  // ---- post-processor ----
  template_.push_back({true, {}});
  std::function<void(const Json&, const std::string&)> read_processor =
      [&](const Json& node, const std::string& path) {
        if (node.is_null()) return;
        const std::string type = bpe_detail::type_of(node, file, path);
        std::vector<TemplateItem> items;
        if (type == "Sequence") {
          XF_CHECK(node.contains("processors") && node["processors"].is_array(),
                   where(file, path + ".processors"), " must be a list");
          for (size_t i = 0; i < node["processors"].size(); ++i) {
            read_processor(node["processors"][i], path + ".processors[" + std::to_string(i) + "]");
          }
          return;
        } else if (type == "ByteLevel") {
          return;  // offsets only
        } else if (type == "TemplateProcessing") {
          XF_CHECK(node.contains("single") && node["single"].is_array(),
                   where(file, path + ".single"), " must be a list");
          const Json& specials = node.value("special_tokens", Json::object());
          for (size_t i = 0; i < node["single"].size(); ++i) {
            const Json& piece = node["single"][i];
            const std::string ppath = path + ".single[" + std::to_string(i) + "]";
            if (piece.contains("Sequence")) {
              XF_CHECK(piece["Sequence"].value("id", "") == "A", where(file, ppath),
                       ": the single template can only hold sequence A");
              items.push_back({true, {}});
            } else if (piece.contains("SpecialToken")) {
              const std::string name = piece["SpecialToken"].value("id", "");
              XF_CHECK(specials.contains(name) && specials[name].contains("ids") &&
                           specials[name]["ids"].is_array(),
                       where(file, ppath), ": special token '", name, "' is missing from ", path,
                       ".special_tokens");
              items.push_back({false, specials[name]["ids"].get<std::vector<int64_t>>()});
            } else {
              XF_THROW(where(file, ppath),
                       " must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
            }
          }
        } else if (type == "RobertaProcessing" || type == "BertProcessing") {
          for (const char* key : {"cls", "sep"}) {
            XF_CHECK(node.contains(key) && node[key].is_array() && node[key].size() == 2 &&
                         node[key][1].is_number_integer(),
                     where(file, path + "." + key), " must be [token, id]");
          }
          items = {{false, {node["cls"][1].get<int64_t>()}},
                   {true, {}},
                   {false, {node["sep"][1].get<int64_t>()}}};
        } else {
          XF_THROW(where(file, path + ".type"), ": post-processor '", type,
                   "' is not supported (supported: TemplateProcessing, RobertaProcessing, "
                   "BertProcessing, ByteLevel, Sequence)");
        }
        // Compose: this processor wraps what the previous ones produced.
        std::vector<TemplateItem> composed;
        for (auto& item : items) {
          if (item.sequence) {
            composed.insert(composed.end(), template_.begin(), template_.end());
          } else {
            composed.push_back(std::move(item));
          }
        }
        template_ = std::move(composed);
      };
  read_processor(json.value("post_processor", Json()), "post_processor");
  model_max_length_ = std::numeric_limits<int64_t>::max();
}

void BpeTokenizer::read_unigram(const nlohmann::json& model) {
  using bpe_detail::where;
  model_kind_ = ModelKind::kUnigram;
  XF_CHECK(model.contains("vocab") && model["vocab"].is_array() && !model["vocab"].empty(),
           where(file_, "model.vocab"), " must be a non-empty list of [piece, score]");
  const Json& vocab = model["vocab"];
  XF_CHECK(vocab.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           where(file_, "model.vocab"), ": ", vocab.size(), " pieces is too many");
  vocab_.reserve(vocab.size());
  unigram_scores_.reserve(vocab.size());
  unigram_min_score_ = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab.size(); ++i) {
    const Json& entry = vocab[i];
    XF_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number(),
             where(file_, "model.vocab[" + std::to_string(i) + "]"), " must be [piece, score]");
    const std::string piece = entry[0].get<std::string>();
    const double score = entry[1].get<double>();
    XF_CHECK(std::isfinite(score), where(file_, "model.vocab[" + std::to_string(i) + "]"),
             ": the score of '", piece, "' is not finite");
    vocab_[piece] = static_cast<int64_t>(i);  // a repeated piece keeps its last id, as the library
    unigram_scores_.push_back(score);
    unigram_min_score_ = std::min(unigram_min_score_, score);
    max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
  }
  if (model.contains("unk_id") && !model["unk_id"].is_null()) {
    XF_CHECK(model["unk_id"].is_number_integer() && model["unk_id"].get<int64_t>() >= 0 &&
                 model["unk_id"].get<int64_t>() < static_cast<int64_t>(vocab.size()),
             where(file_, "model.unk_id"), " must be an id in [0, ", vocab.size(), ")");
    unigram_unk_id_ = model["unk_id"].get<int64_t>();
  }
  byte_fallback_ = bpe_detail::bool_field(model, "byte_fallback", false, file_, "model");
}

// Unigram::encode_optimized: the best-scoring path through the lattice of vocabulary pieces (a
// character no piece covers costs the lowest score minus 10 as unk), ties kept by the first
// (longest) piece found; consecutive unknown pieces fuse into one, which becomes byte-fallback
// pieces where the model has them, else the unk id.
std::vector<int64_t> BpeTokenizer::unigram_word(const std::string& word) const {
  std::vector<int64_t> ids;
  if (word.empty()) return ids;
  constexpr double kUnkPenalty = 10.0;
  const double unk_score = unigram_min_score_ - kUnkPenalty;
  struct Node {
    double score = 0.0;
    int64_t start = -1;
    int64_t id = -1;
  };
  const size_t n = word.size();
  std::vector<Node> best(n + 1);
  const auto relax = [&best](size_t end, size_t start, int64_t id, double score) {
    Node& node = best[end];
    if (node.start < 0 || score > node.score) node = {score, static_cast<int64_t>(start), id};
  };
  for (size_t start = 0; start < n;) {
    const double here = best[start].score;
    size_t char_len = 0;
    bpe_detail::decode_at(word, start, &char_len);
    bool single = false;
    for (size_t len = 1; len <= max_piece_bytes_ && start + len <= n; ++len) {
      const auto it = vocab_.find(word.substr(start, len));
      if (it == vocab_.end()) continue;
      relax(start + len, start, it->second,
            here + unigram_scores_[static_cast<size_t>(it->second)]);
      single = single || len == char_len;
    }
    if (!single) {
      XF_CHECK(unigram_unk_id_.has_value(), file_.string(),
               ": the Unigram model has no unk_id and no piece covers the text at byte ", start,
               " of '", word, "'");
      relax(start + char_len, start, *unigram_unk_id_, here + unk_score);
    }
    start += char_len;
  }
  std::vector<std::string> pieces;
  std::string unknown;  // fused run of unknown pieces, read backwards
  for (size_t end = n; end > 0;) {
    const Node& node = best[end];
    const auto start = static_cast<size_t>(node.start);
    if (unigram_unk_id_ && node.id == *unigram_unk_id_) {
      unknown.insert(0, word, start, end - start);
    } else {
      if (!unknown.empty()) pieces.push_back(std::move(unknown));
      unknown.clear();
      pieces.push_back(word.substr(start, end - start));
    }
    end = start;
  }
  if (!unknown.empty()) pieces.push_back(std::move(unknown));
  std::reverse(pieces.begin(), pieces.end());
  for (const auto& piece : pieces) {
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      ids.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (unsigned char b : piece) {
        static const char* kHex = "0123456789ABCDEF";
        const auto it = vocab_.find(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == piece.size()) {
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    XF_CHECK(unigram_unk_id_.has_value(), file_.string(), ": the Unigram model has no unk_id");
    ids.push_back(*unigram_unk_id_);
  }
  return ids;
}

void BpeTokenizer::add_token(Added token) {
  if (auto it = added_by_content_.find(token.content); it != added_by_content_.end()) {
    const Added& old = added_[it->second];
    if (old.special == token.special && old.single_word == token.single_word &&
        old.lstrip == token.lstrip && old.rstrip == token.rstrip &&
        old.normalized == token.normalized) {
      return;
    }
    token.id = old.id;
    added_[it->second] = std::move(token);
    return;
  }
  if (auto it = vocab_.find(token.content); it != vocab_.end()) {
    token.id = it->second;
  } else {
    // AddedVocabulary::add_tokens: past the model's vocabulary and every added id.
    const auto vocab_size = static_cast<int64_t>(vocab_.size());
    int64_t max_id = -1;
    for (const auto& t : added_) max_id = std::max(max_id, t.id);
    token.id = max_id < 0 ? vocab_size
                          : (max_id >= vocab_size || vocab_size == 0 ? max_id + 1 : vocab_size);
  }
  added_by_content_[token.content] = added_.size();
  added_.push_back(std::move(token));
}

void BpeTokenizer::refresh_added() {
  for (int normalized = 0; normalized < 2; ++normalized) {
    Trie& trie = trie_[normalized];
    trie.entries.clear();
    trie.by_first_byte.assign(256, {});
    for (size_t i = 0; i < added_.size(); ++i) {
      if (added_[i].normalized != (normalized == 1)) continue;
      std::string content =
          normalized == 1 ? normalizer_->apply(added_[i].content) : added_[i].content;
      if (content.empty()) continue;
      trie.by_first_byte[static_cast<unsigned char>(content[0])].push_back(trie.entries.size());
      trie.entries.emplace_back(std::move(content), i);
    }
    for (auto& bucket : trie.by_first_byte) {
      // Longest first; among equal lengths the first added (aho-corasick's pattern order).
      std::stable_sort(bucket.begin(), bucket.end(), [&trie](size_t a, size_t b) {
        return trie.entries[a].first.size() > trie.entries[b].first.size();
      });
    }
  }
}

// AddedVocabulary::find_matches: leftmost-longest matches, single_word / lstrip / rstrip.
std::vector<BpeTokenizer::Segment> BpeTokenizer::split_added(const std::string& text,
                                                             bool normalized) const {
  using bpe_detail::decode_at;
  using bpe_detail::previous_start;
  const Trie& trie = trie_[normalized ? 1 : 0];
  std::vector<Segment> out;
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t match_start = std::string::npos;
    const std::pair<std::string, size_t>* match = nullptr;
    for (size_t i = pos; i < text.size() && match == nullptr; ++i) {
      for (size_t index : trie.by_first_byte[static_cast<unsigned char>(text[i])]) {
        const auto& entry = trie.entries[index];
        if (text.compare(i, entry.first.size(), entry.first) == 0) {
          match = &entry;
          match_start = i;
          break;
        }
      }
    }
    if (match == nullptr) break;
    size_t start = match_start;
    size_t stop = match_start + match->first.size();
    pos = stop;
    const Added& token = added_[match->second];
    if (split_special_tokens_ && token.special) continue;  // encode_special_tokens
    if (token.single_word) {
      size_t len = 0;
      const bool start_space = start == 0 || !bpe_detail::is_word_char(decode_at(
                                                 text, previous_start(text, start), &len));
      const bool stop_space =
          stop == text.size() || !bpe_detail::is_word_char(decode_at(text, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = previous_start(text, new_start);
        size_t len = 0;
        if (!bpe_detail::is_space(decode_at(text, prev, &len))) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t len = 0;
        if (!bpe_detail::is_space(decode_at(text, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) {
      out.push_back({text.substr(start_offset, start - start_offset), -1, start_offset == 0});
    }
    out.push_back({std::string(), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1, start_offset == 0});
  return out;
}

std::vector<BpeTokenizer::Segment> BpeTokenizer::extract_and_normalize(
    const std::string& text) const {
  std::vector<Segment> out;
  for (auto& raw : split_added(text, false)) {
    if (raw.id >= 0) {
      out.push_back(std::move(raw));
      continue;
    }
    const std::string normalized = normalizer_->apply(raw.text);
    for (auto& piece : split_added(normalized, true)) {
      piece.at_start = piece.at_start && raw.at_start;
      if (piece.id >= 0 || !piece.text.empty()) out.push_back(std::move(piece));
    }
  }
  return out;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& text, bool at_start) const {
  return pre_tokenizer_->apply(text, at_start);
}

// BPE::merge_word + Word::merge_all: symbols from the characters (byte_fallback, unk, fuse_unk),
// then merges popped from a priority queue by (rank, position).
std::vector<int64_t> BpeTokenizer::merge_word(const std::string& word) const {
  struct Symbol {
    int64_t id;
    int64_t prev, next;
    size_t len;
  };
  std::vector<Symbol> symbols;
  // A pending unk symbol (fuse_unk grows it): id and byte length.
  bool has_unk = false;
  int64_t unk_id = 0;
  size_t unk_len = 0;
  const auto add = [&symbols](int64_t id, size_t len) {
    const auto n = static_cast<int64_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, len});
  };
  size_t i = 0;
  while (i < word.size()) {
    size_t len = 0;
    bpe_detail::decode_at(word, i, &len);
    const bool is_first = i == 0;
    const bool is_last = i + len >= word.size();
    std::string s = word.substr(i, len);
    i += len;
    if (!is_first) s = continuing_subword_prefix_ + s;
    if (is_last) s += end_of_word_suffix_;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (has_unk) {
        add(unk_id, unk_len);
        has_unk = false;
      }
      add(it->second, len);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (unsigned char b : s) {
        static const char* kHex = "0123456789ABCDEF";
        const std::string code = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
        const auto it = vocab_.find(code);
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == s.size()) {
        for (int64_t id : bytes) add(id, 1);
        continue;
      }
    }
    if (unk_token_) {
      const auto it = vocab_.find(*unk_token_);
      XF_CHECK(it != vocab_.end(), file_.string(), ": the unk_token '", *unk_token_,
               "' is not in the vocabulary");
      if (has_unk && fuse_unk_) {
        unk_len += len;
      } else {
        if (has_unk) add(unk_id, unk_len);
        has_unk = true;
        unk_id = it->second;
        unk_len = len;
      }
    }
  }
  if (has_unk) add(unk_id, unk_len);
  if (!symbols.empty()) symbols.back().next = -1;

  struct Merge {
    size_t pos;
    int64_t rank;
    int64_t new_id;
    bool operator<(const Merge& o) const {  // max-heap on (lowest rank, lowest position)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Merge> queue;
  const auto lookup = [this](int64_t a, int64_t b) -> const std::pair<int64_t, int64_t>* {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = lookup(symbols[k].id, symbols[k + 1].id)) {
      queue.push({k, m->first, m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next == -1) continue;
    const auto next_pos = static_cast<size_t>(current.next);
    const Symbol right = symbols[next_pos];
    const auto* target = lookup(current.id, right.id);
    if (target == nullptr || target->second != top.new_id) continue;  // expired entry
    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
    }
    if (current.prev >= 0) {
      const auto prev = static_cast<size_t>(current.prev);
      if (const auto* m = lookup(symbols[prev].id, current.id)) {
        queue.push({prev, m->first, m->second});
      }
    }
    if (current.next >= 0 && static_cast<size_t>(current.next) < symbols.size()) {
      if (const auto* m = lookup(current.id, symbols[static_cast<size_t>(current.next)].id)) {
        queue.push({top.pos, m->first, m->second});
      }
    }
  }
  std::vector<int64_t> ids;
  for (const auto& s : symbols) {
    if (s.len != 0) ids.push_back(s.id);
  }
  return ids;
}

const std::vector<int64_t>& BpeTokenizer::bpe(const std::string& word,
                                              std::vector<int64_t>& scratch) const {
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      scratch.assign(1, it->second);
      return scratch;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      scratch = it->second;
      return scratch;
    }
  }
  scratch = model_kind_ == ModelKind::kUnigram ? unigram_word(word) : merge_word(word);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= bpe_detail::kMaxCacheEntries) cache_.clear();
  cache_.emplace(word, scratch);
  return scratch;
}

std::vector<int64_t> BpeTokenizer::text_ids(const std::string& text) const {
  unicode::utf8_to_utf32(text);  // rejects invalid UTF-8 with the byte offset
  std::vector<int64_t> ids;
  std::vector<int64_t> scratch;
  for (const auto& segment : extract_and_normalize(text)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    for (const auto& word : pre_tokenize(segment.text, segment.at_start)) {
      const auto& word_ids = bpe(word, scratch);
      ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    }
  }
  return ids;
}

std::vector<std::string> BpeTokenizer::tokenize(const std::string& text) const {
  std::unordered_map<int64_t, std::string> names;
  for (const auto& [token, id] : vocab_) names.emplace(id, token);
  for (const auto& t : added_) names[t.id] = t.content;
  std::vector<std::string> out;
  for (int64_t id : text_ids(text)) out.push_back(names[id]);
  return out;
}

std::optional<int64_t> BpeTokenizer::token_to_id(const std::string& token) const {
  if (const auto it = added_by_content_.find(token); it != added_by_content_.end()) {
    return added_[it->second].id;
  }
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

int64_t BpeTokenizer::size() const {
  // get_vocab_size(with_added_tokens=True): distinct contents of the vocabulary and added tokens.
  int64_t extra = 0;
  for (const auto& t : added_) extra += vocab_.count(t.content) == 0 ? 1 : 0;
  return static_cast<int64_t>(vocab_.size()) + extra;
}

std::vector<int64_t> BpeTokenizer::with_special_tokens(std::vector<int64_t> ids) const {
  std::vector<int64_t> out;
  out.reserve(ids.size() + template_.size());
  for (const auto& item : template_) {
    if (item.sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  return out;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_dir(const std::filesystem::path& dir,
                                                     const std::string& tokenizer_class) {
  XF_CONTEXT("loading the tokenizer.json tokenizer in ", dir);
  const std::filesystem::path file = dir / "tokenizer.json";
  XF_CHECK(std::filesystem::exists(file), "tokenizer folder ", dir, " has no tokenizer.json");
  nlohmann::json json = read_json_file(file);
  std::string cls = tokenizer_class;
  if (cls.empty() && std::filesystem::exists(dir / "tokenizer_config.json")) {
    const nlohmann::json config = read_json_file(dir / "tokenizer_config.json");
    if (config.is_object() && config.contains("tokenizer_class") &&
        config["tokenizer_class"].is_string()) {
      cls = config["tokenizer_class"].get<std::string>();
    }
  }
  const auto is_class = [&cls](const char* name) {
    return cls == name || cls == std::string(name) + "Fast";
  };
  if (is_class("CLIPTokenizer")) rebuild_as_clip(json, dir);
  if (is_class("T5Tokenizer")) rebuild_as_t5(json);
  auto tokenizer = std::make_unique<BpeTokenizer>(json, file);
  tokenizer->source_ = dir.string();
  read_folder_config(*tokenizer, dir, tokenizer_class);
  return tokenizer;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_qwen2_slow_dir(
    const std::filesystem::path& dir, const std::string& tokenizer_class) {
  XF_CONTEXT("loading the slow Qwen2Tokenizer files in ", dir);
  const std::filesystem::path vocab_file = dir / "vocab.json";
  const std::filesystem::path merges_file = dir / "merges.txt";
  const std::filesystem::path config_file = dir / "tokenizer_config.json";
  XF_CHECK(std::filesystem::exists(vocab_file), "tokenizer folder ", dir,
           " has no vocab.json (a Qwen2Tokenizer without tokenizer.json needs vocab.json + "
           "merges.txt)");
  XF_CHECK(std::filesystem::exists(merges_file), "tokenizer folder ", dir,
           " has no merges.txt (a Qwen2Tokenizer without tokenizer.json needs vocab.json + "
           "merges.txt)");
  Json vocab = read_json_file(vocab_file);
  XF_CHECK(vocab.is_object(), vocab_file.string(), " must be an object of token -> id");
  for (const auto& [token, id] : vocab.items()) {
    XF_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, vocab_file.string(), ": the id of '",
             token, "' is not a non-negative integer");
  }

  // Qwen2Tokenizer.__init__: lines stripped, a leading "#version:" line and empty lines skipped,
  // each merge is line.split() (two tokens).
  Json merges = Json::array();
  {
    std::ifstream in(merges_file, std::ios::binary);
    XF_CHECK(in.good(), "cannot open ", merges_file);
    std::string line;
    for (size_t number = 1; std::getline(in, line); ++number) {
      const auto is_space = [](char c) {
        return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
      };
      std::vector<std::string> parts;
      for (size_t i = 0; i < line.size();) {
        while (i < line.size() && is_space(line[i])) ++i;
        size_t j = i;
        while (j < line.size() && !is_space(line[j])) ++j;
        if (j > i) parts.push_back(line.substr(i, j - i));
        i = j;
      }
      if (parts.empty() || (number == 1 && parts[0].rfind("#version:", 0) == 0)) continue;
      XF_CHECK(parts.size() == 2, merges_file.string(), ":", number, ": '", line,
               "' is not two tokens separated by white space");
      for (const auto& part : parts) {
        XF_CHECK(vocab.contains(part), merges_file.string(), ":", number, ": '", part,
                 "' is not in vocab.json");
      }
      XF_CHECK(vocab.contains(parts[0] + parts[1]), merges_file.string(), ":", number,
               ": the merged token '", parts[0] + parts[1], "' is not in vocab.json");
      merges.push_back(Json::array({parts[0], parts[1]}));
    }
  }

  // transformers' Qwen2Converter.
  Json json;
  json["normalizer"] = {{"type", "NFC"}};
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array(
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}})}};
  json["post_processor"] = {{"type", "ByteLevel"},
                            {"add_prefix_space", true},
                            {"trim_offsets", false},
                            {"use_regex", true}};
  json["model"] = {
      {"type", "BPE"},          {"unk_token", nullptr},      {"fuse_unk", false},
      {"byte_fallback", false}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}};
  // The slow tokenizer keeps added_tokens_decoder's ids as written.
  json["added_tokens"] = Json::array();
  if (std::filesystem::exists(config_file)) {
    const Json config = read_json_file(config_file);
    XF_CHECK(config.is_object(), config_file.string(), " must be an object");
    if (const auto it = config.find("added_tokens_decoder");
        it != config.end() && it->is_object()) {
      for (const auto& [id_text, entry] : it->items()) {
        const std::string path = "added_tokens_decoder." + id_text;
        XF_CHECK(entry.is_object(), bpe_detail::where(config_file, path), " must be an object");
        Json token = entry;
        try {
          size_t used = 0;
          token["id"] = std::stoll(id_text, &used);
          if (used != id_text.size()) throw std::invalid_argument(id_text);
        } catch (const std::exception&) {
          XF_THROW(bpe_detail::where(config_file, path), ": the id is not an integer");
        }
        XF_CHECK(token.contains("content") && token["content"].is_string() &&
                     !token["content"].get<std::string>().empty(),
                 bpe_detail::where(config_file, path), " needs a non-empty string 'content'");
        json["added_tokens"].push_back(std::move(token));
      }
    }
  }
  auto tokenizer = std::make_unique<BpeTokenizer>(json, vocab_file);
  tokenizer->source_ = dir.string();
  read_folder_config(*tokenizer, dir, tokenizer_class);
  return tokenizer;
}

void BpeTokenizer::read_folder_config(BpeTokenizer& tok, const std::filesystem::path& dir,
                                      const std::string& tokenizer_class) {
  BpeTokenizer* tokenizer = &tok;
  const TokenizerFolder folder = TokenizerFolder::read(dir);
  const std::filesystem::path config_file = dir / "tokenizer_config.json";

  // The transformers class: its special-token defaults, padding side and post-processor.
  std::string cls = tokenizer_class;
  if (cls.empty() && folder.config.contains("tokenizer_class") &&
      folder.config["tokenizer_class"].is_string()) {
    cls = folder.config["tokenizer_class"].get<std::string>();
  }
  std::string base = cls;
  if (base.size() > 4 && base.compare(base.size() - 4, 4, "Fast") == 0) {
    base.resize(base.size() - 4);
  }
  enum class Family { kGeneric, kLlama, kQwen2, kClip, kT5 };
  Family family = Family::kGeneric;
  if (base.empty() || base == "PreTrainedTokenizer" || base == "TokenizersBackend") {
    family = Family::kGeneric;  // TokenizersBackend: transformers 5's name for tokenizer.json as is
  } else if (base == "CLIPTokenizer") {
    family = Family::kClip;
  } else if (base == "T5Tokenizer") {
    family = Family::kT5;
  } else if (base == "LlamaTokenizer" || base == "CodeLlamaTokenizer") {
    family = Family::kLlama;
  } else if (base == "Qwen2Tokenizer") {
    family = Family::kQwen2;
  } else {
    XF_THROW(config_file.string(), ": tokenizer_class '", cls,
             "' is not supported with tokenizer.json (supported: PreTrainedTokenizerFast, "
             "TokenizersBackend, LlamaTokenizerFast, Qwen2TokenizerFast, CLIPTokenizer, "
             "T5Tokenizer and their slow / fast names)");
  }

  const char* keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                        "pad_token", "cls_token", "mask_token"};
  std::map<std::string, std::optional<std::string>> specials;
  for (const char* key : keys) {
    if (folder.mentions(key)) {
      specials[key] = folder.special_token(key);
    } else if (family == Family::kLlama) {
      if (std::string(key) == "unk_token") specials[key] = "<unk>";
      if (std::string(key) == "bos_token") specials[key] = "<s>";
      if (std::string(key) == "eos_token") specials[key] = "</s>";
    } else if (family == Family::kQwen2) {
      if (std::string(key) == "unk_token" || std::string(key) == "eos_token" ||
          std::string(key) == "pad_token") {
        specials[key] = "<|endoftext|>";
      }
    } else if (family == Family::kClip) {
      if (std::string(key) == "bos_token") specials[key] = "<|startoftext|>";
      if (std::string(key) == "unk_token" || std::string(key) == "eos_token" ||
          std::string(key) == "pad_token") {
        specials[key] = "<|endoftext|>";
      }
    } else if (family == Family::kT5) {
      if (std::string(key) == "eos_token") specials[key] = "</s>";
      if (std::string(key) == "unk_token") specials[key] = "<unk>";
      if (std::string(key) == "pad_token") specials[key] = "<pad>";
    }
  }
  std::vector<std::string> all_specials;
  for (const char* key : keys) {
    if (specials.count(key) && specials[key]) all_specials.push_back(*specials[key]);
  }
  std::vector<std::string> additional = folder.additional_special_tokens();
  if (family == Family::kT5 &&
      std::none_of(additional.begin(), additional.end(), [](const std::string& t) {
        return t.find("<extra_id_") != std::string::npos;
      })) {
    // T5Tokenizer.__init__: extra_ids sentinel tokens <extra_id_0> ... when none are listed.
    int64_t extra_ids = 100;
    if (const auto it = folder.config.find("extra_ids"); it != folder.config.end()) {
      XF_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() <= 100000,
               config_file.string(), ": extra_ids must be an integer in [0, 100000]");
      extra_ids = it->get<int64_t>();
    }
    for (int64_t i = 0; i < extra_ids; ++i) {
      additional.push_back("<extra_id_" + std::to_string(i) + ">");
    }
  }
  for (const auto& t : additional) all_specials.push_back(t);

  // PreTrainedTokenizerFast.__init__: the config's added_tokens_decoder entries the backend lacks
  // (or holds with other flags), then special tokens not yet added.
  if (folder.config.contains("added_tokens_decoder")) {
    const Json& decoder = folder.config["added_tokens_decoder"];
    XF_CHECK(decoder.is_object(), config_file.string(), ": added_tokens_decoder must be an object");
    std::vector<std::pair<int64_t, Added>> entries;
    for (const auto& [id_text, entry] : decoder.items()) {
      const std::string path = "added_tokens_decoder." + id_text;
      XF_CHECK(entry.is_object(), bpe_detail::where(config_file, path), " must be an object");
      Added token;
      try {
        token.id = std::stoll(id_text);
      } catch (const std::exception&) {
        XF_THROW(bpe_detail::where(config_file, path), ": the id is not an integer");
      }
      token.content = bpe_detail::string_field(entry, "content", config_file, path);
      token.special = bpe_detail::bool_field(entry, "special", false, config_file, path);
      token.single_word = bpe_detail::bool_field(entry, "single_word", false, config_file, path);
      token.lstrip = bpe_detail::bool_field(entry, "lstrip", false, config_file, path);
      token.rstrip = bpe_detail::bool_field(entry, "rstrip", false, config_file, path);
      token.normalized =
          bpe_detail::bool_field(entry, "normalized", !token.special, config_file, path);
      entries.emplace_back(token.id, std::move(token));
    }
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [id, token] : entries) {
      if (!token.content.empty()) {
        token.special = token.special || std::find(all_specials.begin(), all_specials.end(),
                                                   token.content) != all_specials.end();
        tokenizer->add_token(std::move(token));
      }
    }
  }
  for (const auto& content : all_specials) {
    if (tokenizer->added_by_content_.count(content) || content.empty()) continue;
    Added token;
    token.content = content;
    token.special = true;
    token.normalized = false;
    tokenizer->add_token(std::move(token));
  }
  tokenizer->refresh_added();

  const auto id_of = [&](const std::string& key) -> std::optional<int64_t> {
    if (!specials.count(key) || !specials[key]) return std::nullopt;
    if (auto id = tokenizer->token_to_id(*specials[key])) return id;
    if (specials.count("unk_token") && specials["unk_token"]) {
      return tokenizer->token_to_id(*specials["unk_token"]);
    }
    return std::nullopt;
  };
  tokenizer->bos_id_ = id_of("bos_token");
  tokenizer->eos_id_ = id_of("eos_token");
  tokenizer->pad_id_ = id_of("pad_token");

  const auto config_bool = [&](const char* key, bool fallback) {
    return bpe_detail::bool_field(folder.config, key, fallback, config_file, "");
  };
  const auto config_side = [&](const char* key, const std::string& fallback) {
    const auto it = folder.config.find(key);
    if (it == folder.config.end() || it->is_null()) return fallback == "left";
    XF_CHECK(it->is_string() && (*it == "left" || *it == "right"), config_file.string(), ": ", key,
             " must be \"left\" or \"right\"");
    return *it == "left";
  };
  tokenizer->padding_left_ =
      config_side("padding_side", family == Family::kLlama ? "left" : "right");
  tokenizer->truncation_left_ = config_side("truncation_side", "right");
  tokenizer->split_special_tokens_ = config_bool("split_special_tokens", false);
  if (const auto it = folder.config.find("model_max_length");
      it != folder.config.end() && it->is_number()) {
    const double v = it->get<double>();
    tokenizer->model_max_length_ =
        v >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
  }

  if (family == Family::kClip) {
    // CLIPTokenizer: RobertaProcessing(sep = eos, cls = bos).
    XF_CHECK(tokenizer->bos_id_ && tokenizer->eos_id_, config_file.string(),
             ": CLIPTokenizer needs a bos_token and an eos_token in its vocabulary");
    tokenizer->template_ = {
        {false, {*tokenizer->bos_id_}}, {true, {}}, {false, {*tokenizer->eos_id_}}};
  }
  if (family == Family::kT5) {
    // T5Tokenizer: TemplateProcessing "$A </s>" with the eos token's id.
    XF_CHECK(tokenizer->eos_id_, config_file.string(), ": T5Tokenizer needs an eos_token");
    tokenizer->template_ = {{true, {}}, {false, {*tokenizer->eos_id_}}};
  }
  if (family == Family::kLlama) {
    // LlamaTokenizerFast.update_post_processor replaces tokenizer.json's post-processor.
    const auto prefix = folder.config.find("add_prefix_space");
    XF_CHECK(prefix == folder.config.end() || prefix->is_null(), config_file.string(),
             ": add_prefix_space makes LlamaTokenizerFast rebuild from the slow tokenizer, "
             "which is not supported");
    const bool add_bos = config_bool("add_bos_token", true);
    const bool add_eos = config_bool("add_eos_token", false);
    XF_CHECK(!add_bos || tokenizer->bos_id_, config_file.string(),
             ": add_bos_token = True but there is no bos_token");
    XF_CHECK(!add_eos || tokenizer->eos_id_, config_file.string(),
             ": add_eos_token = True but there is no eos_token");
    tokenizer->template_.clear();
    if (add_bos) tokenizer->template_.push_back({false, {*tokenizer->bos_id_}});
    tokenizer->template_.push_back({true, {}});
    if (add_eos) tokenizer->template_.push_back({false, {*tokenizer->eos_id_}});
  }
}

}  // namespace xfuser::models::tokenizers
