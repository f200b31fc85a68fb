// Prompt datasets for `xfuser-run --dataset_path FILE --batch_size B`.
//
// Formats (chosen by the file's extension):
//   .txt    one prompt per line; blank lines are skipped.
//   .csv    RFC 4180: a header row with a `prompt` column and optional `negative_prompt` and
//           `seed` columns (other columns are ignored); quoted fields may hold commas, newlines
//           and doubled quotes ("").
//   .jsonl  one JSON object per non-blank line: "prompt" (string, required), optional
//           "negative_prompt" (string or null) and "seed" (integer or null).
// Input must be UTF-8 (a leading byte-order mark is skipped). Every error names the source, the
// line and the problem. The parser is a pure function of its bytes (the fuzz targets drive it):
// any input either parses or throws xfuser::Error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xfuser::runner {

enum class DatasetFormat { kText, kCsv, kJsonl };

struct DatasetRow {
  std::string prompt;
  std::optional<std::string> negative_prompt;  // unset: the run's --negative_prompt, if any
  std::optional<int64_t> seed;                 // unset: the run's --seed
  int64_t line = 0;                            // 1-based line where the row starts
};

// The format of `path` from its extension (.txt, .csv, .jsonl; case-insensitive).
DatasetFormat dataset_format_for(const std::filesystem::path& path);

// Parses a dataset. `source` names the input in errors ("prompts.csv:12: ..."). Throws
// xfuser::Error on invalid UTF-8, bad quoting, a missing `prompt` column or field, a bad seed,
// or a dataset without any prompt.
std::vector<DatasetRow> parse_dataset(std::string_view bytes, DatasetFormat format,
                                      const std::string& source = "<dataset>");

// Reads and parses the file at `path` (format from its extension).
std::vector<DatasetRow> read_dataset(const std::filesystem::path& path);

// The 1-based line of the first invalid UTF-8 sequence in `bytes` (0: valid), with its byte
// offset in *offset.
int64_t find_invalid_utf8(std::string_view bytes, size_t* offset = nullptr);

}  // namespace xfuser::runner
