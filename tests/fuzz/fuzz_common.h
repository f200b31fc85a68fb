// Shared helpers of the libFuzzer targets (tests/fuzz/CMakeLists.txt, scripts/fuzz.sh).
//
// Contract checked by every target: malformed input may only raise xfuser::Error (a named error).
// Any other exception escapes LLVMFuzzerTestOneInput, std::terminate aborts, and libFuzzer
// records the input as a crash, as it does for ASan/UBSan reports and signals.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "backends/error.h"

namespace xfuser::fuzz {

// $XFUSER_FIXTURES, else the committed fixtures in tests/fixtures (read-only inputs such as
// tokenizer files).
inline std::filesystem::path fixtures_dir() {
  if (const char* env = std::getenv("XFUSER_FIXTURES"); env != nullptr && *env != '\0') return env;
  return XFUSER_FUZZ_FIXTURES_DEFAULT;
}

inline std::filesystem::path require_fixture(const std::filesystem::path& relative) {
  const auto path = fixtures_dir() / relative;
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "fuzz target needs fixture %s: set XFUSER_FIXTURES\n", path.c_str());
    std::abort();
  }
  return path;
}

// Runs f; a named xfuser::Error is an expected outcome for malformed input.
template <typename F>
void expect_named_errors_only(F&& f) {
  try {
    f();
  } catch (const xfuser::Error&) {
  }
}

}  // namespace xfuser::fuzz
