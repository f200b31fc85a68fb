// Prompt dataset readers (runner/dataset.h): each format, and each error named with its line.
#include <fstream>

#include <gtest/gtest.h>

#include "backends/error.h"
#include "runner/dataset.h"
#include "runner/progress.h"
#include "tests/test_util.h"

namespace {

using namespace std::string_view_literals;
using xfuser::runner::DatasetFormat;
using xfuser::runner::parse_dataset;

// The message of the xfuser::Error `parse` throws ("" if it does not throw).
std::string error_of(std::string_view bytes, DatasetFormat format) {
  try {
    parse_dataset(bytes, format, "d");
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(bytes, format, ...)                                                  \
  do {                                                                                    \
    const std::string msg = error_of(bytes, format);                                      \
    ASSERT_FALSE(msg.empty()) << "no error for: " << (bytes);                             \
    for (const char* part : {__VA_ARGS__}) {                                              \
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg; \
    }                                                                                     \
  } while (0)

TEST(Dataset, TextIsOnePromptPerLineSkippingBlankLines) {
  const auto rows = parse_dataset("a cat\r\n\n  \nan owl at night  \nlast", DatasetFormat::kText);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].prompt, "a cat");
  EXPECT_EQ(rows[0].line, 1);
  EXPECT_EQ(rows[1].prompt, "an owl at night");
  EXPECT_EQ(rows[1].line, 4);
  EXPECT_EQ(rows[2].prompt, "last");
  EXPECT_FALSE(rows[2].seed.has_value());
  EXPECT_FALSE(rows[2].negative_prompt.has_value());
}

TEST(Dataset, CsvFollowsRfc4180Quoting) {
  const std::string csv =
      "id,Prompt,negative_prompt,seed\r\n"
      "1,\"a cat, sitting\",blurry,7\r\n"
      "2,\"she said \"\"hi\"\"\r\nover two lines\",,\r\n"
      "\r\n"
      "3,plain,\"\",-3\r\n";
  const auto rows = parse_dataset(csv, DatasetFormat::kCsv);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].prompt, "a cat, sitting");
  EXPECT_EQ(rows[0].negative_prompt.value_or("-"), "blurry");
  EXPECT_EQ(rows[0].seed.value_or(0), 7);
  EXPECT_EQ(rows[0].line, 2);
  EXPECT_EQ(rows[1].prompt, "she said \"hi\"\r\nover two lines");
  EXPECT_FALSE(rows[1].negative_prompt.has_value());
  EXPECT_FALSE(rows[1].seed.has_value());
  EXPECT_EQ(rows[1].line, 3);
  EXPECT_EQ(rows[2].prompt, "plain");
  EXPECT_EQ(rows[2].line, 6);  // the quoted newline counted, the blank line skipped
  EXPECT_EQ(rows[2].seed.value_or(0), -3);
  // No final newline, LF line ends, a byte-order mark.
  const auto lf = parse_dataset("\xEF\xBB\xBFprompt\nx\ny", DatasetFormat::kCsv);
  ASSERT_EQ(lf.size(), 2u);
  EXPECT_EQ(lf[1].prompt, "y");
}

TEST(Dataset, JsonlReadsPromptNegativeAndSeed) {
  const std::string jsonl =
      "{\"prompt\": \"a cat\", \"seed\": 5}\n"
      "\n"
      "{\"prompt\": \"caf\\u00e9\", \"negative_prompt\": \"blurry\", \"extra\": [1, 2]}\r\n"
      "{\"prompt\": \"x\", \"negative_prompt\": null, \"seed\": null}";
  const auto rows = parse_dataset(jsonl, DatasetFormat::kJsonl);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].seed.value_or(0), 5);
  EXPECT_EQ(rows[1].prompt, "caf\xC3\xA9");
  EXPECT_EQ(rows[1].negative_prompt.value_or(""), "blurry");
  EXPECT_EQ(rows[1].line, 3);
  EXPECT_FALSE(rows[2].negative_prompt.has_value());
  EXPECT_FALSE(rows[2].seed.has_value());
}

TEST(Dataset, FormatComesFromTheExtension) {
  EXPECT_EQ(xfuser::runner::dataset_format_for("a/p.TXT"), DatasetFormat::kText);
  EXPECT_EQ(xfuser::runner::dataset_format_for("p.csv"), DatasetFormat::kCsv);
  EXPECT_EQ(xfuser::runner::dataset_format_for("p.jsonl"), DatasetFormat::kJsonl);
  try {
    xfuser::runner::dataset_format_for("prompts.parquet");
    FAIL() << "no error";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompts.parquet"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".jsonl"), std::string::npos) << e.what();
  }
}

TEST(Dataset, InvalidUtf8IsNamedWithItsLine) {
  for (auto format : {DatasetFormat::kText, DatasetFormat::kCsv, DatasetFormat::kJsonl}) {
    EXPECT_ERROR("prompt\nok\nbad \xC3\x28 byte\n", format, "d:3", "invalid UTF-8");
  }
  EXPECT_ERROR("a\xED\xA0\x80", DatasetFormat::kText, "d:1", "invalid UTF-8");  // surrogate
  EXPECT_ERROR("a\xC0\xAF", DatasetFormat::kText, "invalid UTF-8");             // overlong
  EXPECT_ERROR("a\xF4\x90\x80\x80", DatasetFormat::kText, "invalid UTF-8");     // > U+10FFFF
  EXPECT_ERROR("truncated \xE2\x82", DatasetFormat::kText, "invalid UTF-8");
  EXPECT_EQ(xfuser::runner::find_invalid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"), 0);
}

TEST(Dataset, CsvQuotingErrorsNameTheLine) {
  EXPECT_ERROR("prompt\nok\n\"never closed\nmore\n", DatasetFormat::kCsv, "d:3", "never closed");
  EXPECT_ERROR("prompt\n\"closed\"junk\n", DatasetFormat::kCsv, "d:2", "after a closing quote");
  EXPECT_ERROR("prompt\nok\na \"quote\" inside\n", DatasetFormat::kCsv, "d:3",
               "quote inside an unquoted field");
}

TEST(Dataset, CsvStructureErrors) {
  EXPECT_ERROR("text,seed\na,1\n", DatasetFormat::kCsv, "d:1", "missing column `prompt`",
               "'text', 'seed'");
  EXPECT_ERROR("prompt,seed\na,1\nb\n", DatasetFormat::kCsv, "d:3", "1 field(s)", "header has 2");
  EXPECT_ERROR("prompt,seed\na,soon\n", DatasetFormat::kCsv, "d:2", "seed 'soon'");
  EXPECT_ERROR("prompt,seed\na,99999999999999999999\n", DatasetFormat::kCsv, "d:2", "seed");
  EXPECT_ERROR("prompt,seed\n  ,1\n", DatasetFormat::kCsv, "d:2", "empty prompt");
  EXPECT_ERROR("prompt,Prompt\na,b\n", DatasetFormat::kCsv, "appears twice");
  EXPECT_ERROR("", DatasetFormat::kCsv, "empty CSV");
  EXPECT_ERROR("prompt,seed\r\n", DatasetFormat::kCsv, "empty dataset");
}

TEST(Dataset, JsonlErrorsNameTheLine) {
  EXPECT_ERROR("{\"prompt\": \"a\"}\n{\"prompt\": \"b\",}\n", DatasetFormat::kJsonl, "d:2",
               "not valid JSON");
  EXPECT_ERROR("{\"prompt\": \"a\"}\n[\"b\"]\n", DatasetFormat::kJsonl, "d:2",
               "expected a JSON object", "array");
  EXPECT_ERROR("{\"text\": \"a\"}\n", DatasetFormat::kJsonl, "d:1", "missing field \"prompt\"");
  EXPECT_ERROR("{\"prompt\": 3}\n", DatasetFormat::kJsonl, "d:1", "must be a string");
  EXPECT_ERROR("{\"prompt\": \"\"}\n", DatasetFormat::kJsonl, "d:1", "empty prompt");
  EXPECT_ERROR("{\"prompt\": \"a\\u0000b\"}\n", DatasetFormat::kJsonl, "d:1", "NUL");
  EXPECT_ERROR("{\"prompt\": \"a\", \"seed\": 1.5}\n", DatasetFormat::kJsonl, "d:1",
               "must be an integer");
  EXPECT_ERROR("{\"prompt\": \"a\", \"seed\": 18446744073709551615}\n", DatasetFormat::kJsonl,
               "out of range");
  EXPECT_ERROR("{\"prompt\": \"a\", \"negative_prompt\": 1}\n", DatasetFormat::kJsonl,
               "\"negative_prompt\" must be a string or null");
  EXPECT_ERROR(std::string(100, '[') + "\n", DatasetFormat::kJsonl, "d:1", "nested deeper");
  EXPECT_ERROR("\n\n  \n", DatasetFormat::kJsonl, "empty dataset");
}

TEST(Dataset, EmptyTextDatasetIsAnError) {
  EXPECT_ERROR("\n \r\n", DatasetFormat::kText, "d", "empty dataset");
  EXPECT_ERROR("a\0b"sv, DatasetFormat::kText, "NUL");
}

TEST(Dataset, ReadDatasetNamesTheFile) {
  xfuser::testing::TempDir dir;
  { std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n"; }
  try {
    xfuser::runner::read_dataset(dir / "p.jsonl");
    FAIL() << "no error";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "p.jsonl").string() + ":2"), std::string::npos)
        << e.what();
  }
  try {
    xfuser::runner::read_dataset(dir / "missing.txt");
    FAIL() << "no error";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
}

TEST(Progress, EtaAndDurations) {
  EXPECT_EQ(xfuser::runner::Progress::format_duration(0), "0:00");
  EXPECT_EQ(xfuser::runner::Progress::format_duration(125.4), "2:05");
  EXPECT_EQ(xfuser::runner::Progress::format_duration(3723), "1:02:03");
  std::FILE* sink = std::tmpfile();
  xfuser::runner::Progress p(4, true, sink);
  EXPECT_LT(p.eta_seconds(), 0);  // unknown before the first batch
  p.batch_done(2, 0.1);
  EXPECT_EQ(p.done(), 2);
  EXPECT_GE(p.eta_seconds(), 0);
  std::rewind(sink);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, sink);
  EXPECT_NE(std::string(buf, n).find("2/4 images"), std::string::npos) << std::string(buf, n);
  // Steps of the running batch count as a fraction of it (its size: the last batch's).
  p.step(1, 2);
  EXPECT_DOUBLE_EQ(p.done_fraction(), 3.0);
  const std::string status = p.status();
  EXPECT_NE(status.find("2/4 images (batch 2 step 1/2)"), std::string::npos) << status;
  EXPECT_NE(status.find("images/s"), std::string::npos) << status;
  EXPECT_NE(status.find("left"), std::string::npos) << status;
  EXPECT_GT(p.rate(), 0);
  p.batch_done(2, 0.1);
  EXPECT_DOUBLE_EQ(p.done_fraction(), 4.0);
  EXPECT_NEAR(p.eta_seconds(), 0.0, 1e-9);
  std::fclose(sink);
}

}  // namespace
