// Shared helpers for the GoogleTest suites.
#pragma once

#include <filesystem>
#include <string>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

namespace xfuser::testing {

// $XFUSER_FIXTURES, else tests/fixtures in the source tree (the committed reference data that
// tests/fixtures/generate.py makes).
std::filesystem::path fixtures_dir();
// The build tree (for build/bin/xfuser and friends).
std::filesystem::path binary_dir();
std::filesystem::path source_dir();

// A fresh, empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "xfuser-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// max |a - b| / max |b| (0 when both are all zero), computed in float64.
double max_rel_error(const at::Tensor& a, const at::Tensor& b);

// Runs a shell command, returning its exit code; stdout+stderr captured into *output if given.
int run_command(const std::string& command, std::string* output = nullptr);

}  // namespace xfuser::testing

// Fails the current test, naming the path, when a fixture is absent: the fixtures are committed
// under tests/fixtures, so a missing one is a broken checkout or a wrong $XFUSER_FIXTURES, never a
// reason to skip.
#define XF_REQUIRE_FIXTURE(path)                                                         \
  do {                                                                                   \
    if (!std::filesystem::exists(path)) {                                                \
      FAIL() << "fixture " << (path) << " not found (fixtures dir "                      \
             << xfuser::testing::fixtures_dir()                                          \
             << "): regenerate with tests/fixtures/generate.py or fix $XFUSER_FIXTURES"; \
    }                                                                                    \
  } while (0)
