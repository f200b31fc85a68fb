// WanPipeline's prompt_clean (ftfy.fix_text, html.unescape twice, whitespace runs to one space),
// against what diffusers v0.33.1 with ftfy 6.3.1 returns for the same text (the expected strings
// were printed by diffusers.pipelines.wan.pipeline_wan.prompt_clean).
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/wan/wan_prompt.h"

namespace {

using xfuser::models::wan::html_unescape;
using xfuser::models::wan::prompt_clean;

TEST(WanPrompt, EqualsDiffusersPromptClean) {
  const std::pair<const char*, const char*> cases[] = {
      {"  a red &amp; green apple\n\t on a  table ", "a red & green apple on a table"},
      {"\u201cthe quick\u201d brown fox &lt;jumps&gt; over the lazy dog",
       "\"the quick\" brown fox <jumps> over the lazy dog"},
      {"\ufb01ne \uff21\uff22\uff23\u3000x", "fine ABC x"},
      // ftfy unescapes once (no '<' in the text), then html.unescape twice.
      {"&amp;amp;amp; &#65;&#x42; &nbsp;y &copy; \u2018s\u2019", "& AB y \u00a9 's'"},
      {"cafe\u0301", "caf\u00e9"},
      // With a '<' ftfy leaves entities alone: two unescapes only.
      {"<b>&amp;amp;amp;</b>", "<b>&amp;</b>"},
      {"a\r\nb\u2028c\x07"
       "d",
       "a b cd"},
      // Legacy names without ';' by longest prefix; C1 as cp1252; 0, surrogates, huge -> U+FFFD.
      {"&notit; &ampx &#128; &#0; &#xD800; &#99999999999;",
       "\u00acit; &x \u20ac \ufffd \ufffd \ufffd"},
      {"\u01c4emal \u0133s \uff76", "D\u017demal ijs \u30ab"},
      {"", ""},
      {"   \t ", ""},
      {"x &unknownentity; y &", "x &unknownentity; y &"},
      {"\u00a0nbsp\u3000ideo\u2003em", "nbsp ideo em"},
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(prompt_clean(in), want) << "prompt: " << in;
  }
}

TEST(WanPrompt, HtmlUnescapeIsPythons) {
  EXPECT_EQ(html_unescape("&lt;&gt;&amp;&quot;&#39;&apos;"), "<>&\"''");
  EXPECT_EQ(html_unescape("&CounterClockwiseContourIntegral;"), "\u2233");
  EXPECT_EQ(html_unescape("&#x1F600;&#128512;"), "\U0001F600\U0001F600");
  EXPECT_EQ(html_unescape("&#;&#x;&;&#65"), "&#;&#x;&;A");
  EXPECT_EQ(html_unescape("no entities"), "no entities");
}

TEST(WanPrompt, InvalidUtf8IsAnErrorNamingTheOffset) {
  try {
    prompt_clean("ab\xff");
    FAIL() << "invalid UTF-8 must be an error";
  } catch (const xfuser::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("prompt_clean"), std::string::npos) << what;
    EXPECT_NE(what.find("2"), std::string::npos) << what;
  }
}

}  // namespace
