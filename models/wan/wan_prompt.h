// WanPipeline's prompt_clean (diffusers v0.33.1 pipeline_wan.py), applied to every prompt and
// negative prompt before UMT5 tokenisation:
//   whitespace_clean(basic_clean(text)), basic_clean = ftfy.fix_text, then html.unescape twice,
//   then strip; whitespace_clean = re.sub(r"\s+", " ", text).strip().
//
// ftfy.fix_text (ftfy 6.3, default configuration) is ported for the deterministic fixes that
// change well-formed UTF-8 prompts: HTML entities unescaped when the text has no '<'
// (unescape_html="auto"), control characters removed, Latin ligatures and Dutch / Serbo-Croatian
// digraphs expanded, fullwidth and halfwidth forms (U+FF01..U+FFEF, and U+3000) to their NFKC
// forms, curly quotes uncurled (U+02BC, U+2018..U+201B -> ', U+201C..U+201F -> "), and NFC. Its
// mojibake repair (fix_encoding: text that was decoded with the wrong codec) is not ported: a
// prompt must be valid UTF-8 (an error says where it is not), and text that merely looks like
// mojibake is kept as written.
//
// html.unescape is Python's: numeric references (&#N; &#xH;, with Python's replacements for 0,
// surrogates, out-of-range values, noncharacters and the C1 range read as cp1252) and every
// HTML5 named reference (html_entities.inc, generated from Python's html.entities.html5), the
// legacy names without ';' matched by their longest prefix as Python does.
#pragma once

#include <string>

namespace xfuser::models::wan {

std::string prompt_clean(const std::string& text);

// Python's html.unescape(text).
std::string html_unescape(const std::string& text);

}  // namespace xfuser::models::wan
