// libFuzzer target: the dataset readers (runner/dataset.h). The first input byte picks the
// format (text, CSV, JSONL); the rest is the file's bytes. Malformed input may only raise a named
// xfuser::Error; rows that parse must hold a non-empty prompt and a line number inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runner/dataset.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using xfuser::runner::DatasetFormat;
  const DatasetFormat formats[] = {DatasetFormat::kText, DatasetFormat::kCsv,
                                   DatasetFormat::kJsonl};
  const DatasetFormat format = formats[data[0] % 3];
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  xfuser::fuzz::expect_named_errors_only([&] {
    const auto rows = xfuser::runner::parse_dataset(bytes, format, "fuzz-input");
    int64_t lines = 1;
    for (char c : bytes) lines += c == '\n';
    for (const auto& row : rows) {
      if (row.prompt.empty() || row.line < 1 || row.line > lines) std::abort();
    }
  });
  return 0;
}
