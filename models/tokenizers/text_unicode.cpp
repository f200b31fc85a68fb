#include "models/tokenizers/text_unicode.h"

#include <vector>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "backends/error.h"

namespace xfuser::models::tokenizers::unicode {
namespace {

std::u16string to_utf16(const std::u32string& text) {
  if (text.empty()) return {};
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strFromUTF32(nullptr, 0, &length, reinterpret_cast<const UChar32*>(text.data()),
                 static_cast<int32_t>(text.size()), &status);
  XF_CHECK(status == U_BUFFER_OVERFLOW_ERROR || U_SUCCESS(status),
           "UTF-32 to UTF-16: ", u_errorName(status));
  std::u16string out(static_cast<size_t>(length), u'\0');
  status = U_ZERO_ERROR;
  u_strFromUTF32(reinterpret_cast<UChar*>(out.data()), length, nullptr,
                 reinterpret_cast<const UChar32*>(text.data()), static_cast<int32_t>(text.size()),
                 &status);
  XF_CHECK(U_SUCCESS(status), "UTF-32 to UTF-16: ", u_errorName(status));
  return out;
}

std::u32string to_utf32(const std::u16string& text) {
  if (text.empty()) return {};
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strToUTF32(nullptr, 0, &length, reinterpret_cast<const UChar*>(text.data()),
               static_cast<int32_t>(text.size()), &status);
  XF_CHECK(status == U_BUFFER_OVERFLOW_ERROR || U_SUCCESS(status),
           "UTF-16 to UTF-32: ", u_errorName(status));
  std::u32string out(static_cast<size_t>(length), U'\0');
  status = U_ZERO_ERROR;
  u_strToUTF32(reinterpret_cast<UChar32*>(out.data()), length, nullptr,
               reinterpret_cast<const UChar*>(text.data()), static_cast<int32_t>(text.size()),
               &status);
  XF_CHECK(U_SUCCESS(status), "UTF-16 to UTF-32: ", u_errorName(status));
  return out;
}

}  // namespace

std::u32string utf8_to_utf32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b0 < 0x80) {
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      extra = 1, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      extra = 3, cp = b0 & 0x07, min = 0x10000;
    } else {
      XF_THROW("text is not valid UTF-8: bad lead byte at offset ", i);
    }
    XF_CHECK(i + extra < text.size(), "text is not valid UTF-8: truncated sequence at offset ", i);
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      XF_CHECK((b & 0xC0) == 0x80, "text is not valid UTF-8: bad continuation byte at offset ",
               i + k);
      cp = (cp << 6) | (b & 0x3F);
    }
    XF_CHECK(cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF),
             "text is not valid UTF-8: invalid code point at offset ", i);
    out.push_back(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf32_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_utf8(out, cp);
  return out;
}

bool is_python_space(char32_t cp) {
  // CPython's _PyUnicode_IsWhitespace: bidi class WS/B/S or category Zs.
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_white_space(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

bool is_letter(char32_t cp) { return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_L_MASK) != 0; }

bool is_number(char32_t cp) { return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0; }

bool is_other(char32_t cp) { return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_C_MASK) != 0; }

bool is_space_separator(char32_t cp) {
  return u_charType(static_cast<UChar32>(cp)) == U_SPACE_SEPARATOR;
}

char32_t fold_case(char32_t cp) {
  return static_cast<char32_t>(u_foldCase(static_cast<UChar32>(cp), U_FOLD_CASE_DEFAULT));
}
char32_t simple_lower(char32_t cp) {
  return static_cast<char32_t>(u_tolower(static_cast<UChar32>(cp)));
}
char32_t simple_upper(char32_t cp) {
  return static_cast<char32_t>(u_toupper(static_cast<UChar32>(cp)));
}
char32_t simple_title(char32_t cp) {
  return static_cast<char32_t>(u_totitle(static_cast<UChar32>(cp)));
}

namespace {

std::u32string normalize(const std::u32string& text, bool compatibility) {
  if (text.empty()) return text;
  UErrorCode status = U_ZERO_ERROR;
  const char* form = compatibility ? "NFKC" : "NFC";
  const UNormalizer2* normalizer =
      compatibility ? unorm2_getNFKCInstance(&status) : unorm2_getNFCInstance(&status);
  XF_CHECK(U_SUCCESS(status), "ICU ", form, " normaliser unavailable: ", u_errorName(status));
  const std::u16string source = to_utf16(text);
  std::u16string out(source.size() * 3 + 16, u'\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = U_ZERO_ERROR;
    const int32_t length =
        unorm2_normalize(normalizer, reinterpret_cast<const UChar*>(source.data()),
                         static_cast<int32_t>(source.size()), reinterpret_cast<UChar*>(out.data()),
                         static_cast<int32_t>(out.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(length), u'\0');
      continue;
    }
    XF_CHECK(U_SUCCESS(status), "ICU ", form, " normalisation failed: ", u_errorName(status));
    out.resize(static_cast<size_t>(length));
    return to_utf32(out);
  }
  XF_THROW("ICU ", form, " normalisation did not converge");
}

}  // namespace

std::u32string nfc(const std::u32string& text) { return normalize(text, false); }

std::u32string nfkc(const std::u32string& text) { return normalize(text, true); }

std::u32string to_lower(const std::u32string& text) {
  if (text.empty()) return text;
  const std::u16string source = to_utf16(text);
  std::u16string out(source.size() * 3 + 16, u'\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    UErrorCode status = U_ZERO_ERROR;
    const int32_t length =
        u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                     reinterpret_cast<const UChar*>(source.data()),
                     static_cast<int32_t>(source.size()), "", &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(length), u'\0');
      continue;
    }
    XF_CHECK(U_SUCCESS(status), "ICU lower-casing failed: ", u_errorName(status));
    out.resize(static_cast<size_t>(length));
    return to_utf32(out);
  }
  XF_THROW("ICU lower-casing did not converge");
}

}  // namespace xfuser::models::tokenizers::unicode
