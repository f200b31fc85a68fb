// Unicode helpers for the tokenizers: UTF-8 <-> code points, and the Python semantics the
// transformers tokenizers rely on (str.isspace, str.lower, unicodedata categories, NFC), backed
// by ICU.
#pragma once

#include <string>
#include <string_view>

namespace xfuser::models::tokenizers::unicode {

// Decodes UTF-8; throws xfuser::Error naming the byte offset on malformed input.
std::u32string utf8_to_utf32(std::string_view text);
std::string utf32_to_utf8(std::u32string_view text);
void append_utf8(std::string& out, char32_t cp);

// Python's str.isspace() for one code point (what str.split()/strip() split on).
bool is_python_space(char32_t cp);
// Unicode White_Space (the regex module's \s).
bool is_white_space(char32_t cp);
// General category tests: L* (letter), N* (number), C* (other), Zs (space separator).
bool is_letter(char32_t cp);
bool is_number(char32_t cp);
bool is_other(char32_t cp);
bool is_space_separator(char32_t cp);
// Simple case folding (what a case-insensitive regex compares).
char32_t fold_case(char32_t cp);

// unicodedata.normalize("NFC", text).
std::u32string nfc(const std::u32string& text);
// unicodedata.normalize("NFKC", text).
std::u32string nfkc(const std::u32string& text);
// Python str.lower(): full lower-case mapping (SpecialCasing, Final_Sigma).
std::u32string to_lower(const std::u32string& text);

char32_t simple_lower(char32_t cp);
char32_t simple_upper(char32_t cp);
char32_t simple_title(char32_t cp);

// True when pred holds for the code point or one of its simple case variants (what a
// case-insensitive regex class matches).
template <typename Pred>
bool any_case_variant(char32_t cp, Pred pred) {
  return pred(cp) || pred(simple_lower(cp)) || pred(simple_upper(cp)) || pred(simple_title(cp)) ||
         pred(fold_case(cp));
}

}  // namespace xfuser::models::tokenizers::unicode
