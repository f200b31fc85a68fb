#include "models/wan/wan_prompt.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "backends/error.h"
#include "models/tokenizers/text_unicode.h"

namespace xfuser::models::wan {
namespace {

#include "models/wan/html_entities.inc"

namespace u = tokenizers::unicode;

const std::u32string_view* find_entity(std::string_view name) {
  auto it = std::lower_bound(std::begin(kEntities), std::end(kEntities), name,
                             [](const auto& e, std::string_view n) { return e.first < n; });
  if (it == std::end(kEntities) || it->first != name) return nullptr;
  return &it->second;
}

bool is_ascii_digit(char32_t c) { return c >= U'0' && c <= U'9'; }
bool is_hex_digit(char32_t c) {
  return is_ascii_digit(c) || (c >= U'a' && c <= U'f') || (c >= U'A' && c <= U'F');
}

// Python's html._invalid_codepoints.
bool invalid_codepoint(uint64_t cp) {
  if ((cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) ||
      (cp >= 0x7F && cp <= 0x9F) || (cp >= 0xFDD0 && cp <= 0xFDEF)) {
    return true;
  }
  return (cp & 0xFFFE) == 0xFFFE && cp <= 0x10FFFF;
}

// The replacement of a numeric reference's value, as html._replace_charref.
std::u32string numeric_replacement(uint64_t num) {
  for (const auto& [from, to] : kInvalidCharrefs) {
    if (from == num) return std::u32string(1, to);
  }
  if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return U"\uFFFD";
  if (invalid_codepoint(num)) return U"";
  return std::u32string(1, static_cast<char32_t>(num));
}

// One html.unescape pass over code points: _charref =
// &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)
std::u32string unescape(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    size_t j = i + 1;
    if (j < s.size() && s[j] == U'#') {
      const bool hex = j + 1 < s.size() && (s[j + 1] == U'x' || s[j + 1] == U'X');
      size_t k = j + (hex ? 2 : 1);
      const size_t digits_begin = k;
      uint64_t num = 0;
      bool big = false;
      while (k < s.size() && (hex ? is_hex_digit(s[k]) : is_ascii_digit(s[k]))) {
        const char32_t c = s[k];
        const uint64_t d = is_ascii_digit(c) ? c - U'0' : (c | 0x20) - U'a' + 10;
        if (num > 0x7FFFFFFF) big = true;  // beyond any code point: saturate
        if (!big) num = num * (hex ? 16 : 10) + d;
        ++k;
      }
      if (k == digits_begin) {  // "&#" without digits: not a reference
        out.push_back(s[i++]);
        continue;
      }
      if (k < s.size() && s[k] == U';') ++k;
      out += numeric_replacement(big ? 0x110000 : num);
      i = k;
      continue;
    }
    // A name: up to 32 characters other than \t \n \f space < & # ;, then an optional ';'.
    size_t k = j;
    while (k < s.size() && k - j < 32) {
      const char32_t c = s[k];
      if (c == U'\t' || c == U'\n' || c == U'\f' || c == U' ' || c == U'<' || c == U'&' ||
          c == U'#' || c == U';') {
        break;
      }
      ++k;
    }
    if (k == j) {
      out.push_back(s[i++]);
      continue;
    }
    if (k < s.size() && s[k] == U';') ++k;
    // The matched name as UTF-8 (the table's keys are ASCII; a non-ASCII name never matches).
    const std::u32string name(s.begin() + static_cast<std::ptrdiff_t>(j),
                              s.begin() + static_cast<std::ptrdiff_t>(k));
    const std::string key = u::utf32_to_utf8(name);
    if (const auto* value = find_entity(key)) {
      out += *value;
    } else {
      // The longest prefix (at least 2 characters) that is a name, as html._replace_charref.
      bool found = false;
      for (size_t x = name.size() - 1; x > 1; --x) {
        if (const auto* value = find_entity(u::utf32_to_utf8(name.substr(0, x)))) {
          out += *value;
          out += name.substr(x);
          found = true;
          break;
        }
      }
      if (!found) {
        out.push_back(U'&');
        out += name;
      }
    }
    i = k;
  }
  return out;
}

// ftfy's LIGATURES.
std::u32string_view ligature(char32_t c) {
  switch (c) {
    case U'\u0132':
      return U"IJ";
    case U'\u0133':
      return U"ij";
    case U'\u0149':
      return U"\u02BCn";
    case U'\u01F1':
      return U"DZ";
    case U'\u01F2':
      return U"Dz";
    case U'\u01F3':
      return U"dz";
    case U'\u01C4':
      return U"D\u017D";
    case U'\u01C5':
      return U"D\u017E";
    case U'\u01C6':
      return U"d\u017E";
    case U'\u01C7':
      return U"LJ";
    case U'\u01C8':
      return U"Lj";
    case U'\u01C9':
      return U"lj";
    case U'\u01CA':
      return U"NJ";
    case U'\u01CB':
      return U"Nj";
    case U'\u01CC':
      return U"nj";
    case U'\uFB00':
      return U"ff";
    case U'\uFB01':
      return U"fi";
    case U'\uFB02':
      return U"fl";
    case U'\uFB03':
      return U"ffi";
    case U'\uFB04':
      return U"ffl";
    case U'\uFB05':
      return U"\u017Ft";
    case U'\uFB06':
      return U"st";
    default:
      return {};
  }
}

// ftfy's CONTROL_CHARS (remove_control_chars).
bool removed_control(char32_t c) {
  return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F ||
         (c >= 0x206A && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

bool is_ascii_alnum(char32_t c) {
  return is_ascii_digit(c) || (c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z');
}

// ftfy.fixes.unescape_html: only references matching &#?[0-9A-Za-z]{1,24}; are decoded, a named
// one when it is an HTML5 name, a numeric one as html.unescape decodes it. (ftfy also decodes
// all-caps spellings of some Latin-letter names, such as &EACUTE;; those are left as written.)
std::u32string ftfy_unescape(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == U'&') {
      size_t j = i + 1;
      const bool numeric = j < s.size() && s[j] == U'#';
      if (numeric) ++j;
      size_t k = j;
      while (k < s.size() && k - j < 24 && is_ascii_alnum(s[k])) ++k;
      if (k > j && k < s.size() && s[k] == U';') {
        const std::u32string ref(s.begin() + static_cast<std::ptrdiff_t>(i),
                                 s.begin() + static_cast<std::ptrdiff_t>(k + 1));
        if (numeric) {
          const std::u32string decoded = unescape(ref);
          out += decoded.find(U';') == std::u32string::npos ? decoded : ref;
        } else if (const auto* value =
                       find_entity(u::utf32_to_utf8(ref.substr(1)))) {  // the name with its ';'
          out += *value;
        } else {
          out += ref;
        }
        i = k + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// ftfy.fix_text's fixes for well-formed text, in its order, on one segment (a line with its
// '\n'). `unescape_html` is ftfy's "auto": on until a segment holds '<', then off for the rest.
std::u32string ftfy_fix_segment(std::u32string s, bool& unescape_html) {
  if (unescape_html && s.find(U'<') != std::u32string::npos) unescape_html = false;
  if (unescape_html) s = ftfy_unescape(s);
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    // fix_line_breaks: \r\n, \r, U+2028, U+2029, U+0085 -> \n.
    if (c == U'\r') {
      if (i + 1 < s.size() && s[i + 1] == U'\n') ++i;
      out.push_back(U'\n');
      continue;
    }
    if (c == 0x2028 || c == 0x2029 || c == 0x85) {
      out.push_back(U'\n');
      continue;
    }
    if (removed_control(c)) continue;
    if (auto lig = ligature(c); !lig.empty()) {
      out += lig;
      continue;
    }
    // fix_character_width: U+3000 -> ' ', U+FF01..U+FFEF -> NFKC.
    if (c == 0x3000) {
      out.push_back(U' ');
      continue;
    }
    if (c >= 0xFF01 && c <= 0xFFEF) {
      out += u::nfkc(std::u32string(1, c));
      continue;
    }
    // uncurl_quotes.
    if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) {
      out.push_back(U'\'');
      continue;
    }
    if (c >= 0x201C && c <= 0x201F) {
      out.push_back(U'"');
      continue;
    }
    out.push_back(c);
  }
  return u::nfc(out);
}

// ftfy.fix_text: segment by segment, each a line of the input with its '\n'.
std::u32string ftfy_fix_text(const std::u32string& s) {
  std::u32string out;
  bool unescape_html = true;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(U'\n', pos);
    end = end == std::u32string::npos ? s.size() : end + 1;
    out += ftfy_fix_segment(s.substr(pos, end - pos), unescape_html);
    pos = end;
  }
  return out;
}

bool is_space(char32_t c) { return u::is_python_space(c); }

}  // namespace

std::string html_unescape(const std::string& text) {
  if (text.find('&') == std::string::npos) return text;
  return u::utf32_to_utf8(unescape(u::utf8_to_utf32(text)));
}

std::string prompt_clean(const std::string& text) {
  XF_CONTEXT("cleaning the prompt as WanPipeline's prompt_clean");
  std::u32string s = ftfy_fix_text(u::utf8_to_utf32(text));
  s = unescape(unescape(s));
  // whitespace_clean(...strip()): runs of whitespace to one space, then strip.
  std::u32string out;
  out.reserve(s.size());
  bool space = false;
  for (char32_t c : s) {
    if (is_space(c)) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(U' ');
    space = false;
    out.push_back(c);
  }
  return u::utf32_to_utf8(out);
}

}  // namespace xfuser::models::wan
