// Shared helpers for the GoogleTest suites.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <nlohmann/json_fwd.hpp>

#include "models/common/module.h"
#include "models/common/offload.h"
#include "models/xfuser_model.h"

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

// The start of a run_command line that runs the rest under `mpirun -np N` (oversubscribed, as
// root when root, XFUSER_CACHE passed on, one thread per rank), inside `timeout` seconds
// (0: none).
std::string mpirun_prefix(int np, int timeout_seconds = 240);

// Max |a - b| over the pixels of two PNG files (1000 when their sizes differ).
int max_pixel_diff(const std::filesystem::path& a, const std::filesystem::path& b);

// A JSON file (parse errors throw, failing the test).
nlohmann::json read_json(const std::filesystem::path& path);
// Every tensor of a safetensors file, copied out of the mapping.
std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path);

// The request of one reference case folder (<name>.ref/<case>/: case.json, latents.safetensors,
// and its input pictures), with diffusers' initial latents.
models::GenerationRequest reference_case_request(const std::filesystem::path& case_dir);

// Runs every reference case under tests/fixtures/pipelines/<name>.ref/ (case.json: the call's
// arguments; latents.safetensors: diffusers' initial latents; final.safetensors: its final ones;
// image.safetensors: its decoded output; input.png: the picture, if any) on the folder
// pipelines/<name>/ (the model from its model_index.json), fp32: the final latents within 1e-4
// relative and the decoded pixels within 1 level (gtest failures).
// `folder`, when given, is the pipeline folder instead of pipelines/<name>/ (a committed model
// outside the fixtures, as tiny-shapes). `device`: where the model loads and runs (the checked
// device of tests/checked_device.h, a GPU). `refs`, when given, holds the cases instead of
// pipelines/<name>.ref/. `transformer_weights`: how the transformers hold their weights (the
// cases must then come from diffusers run the same way). `offload`: the run is made with that CPU
// offload and must also equal the same run without it (final latents within 1e-6 relative,
// pixels exactly), with the offloader's device bytes at their peak within its bound, every
// component registered with it, and nothing left on the device after a generation.
void check_pipeline(const std::string& name, const std::filesystem::path& folder = {},
                    c10::Device device = c10::Device(c10::kCPU),
                    const std::filesystem::path& refs = {},
                    const models::WeightFormat& transformer_weights = {},
                    models::OffloadMode offload = models::OffloadMode::kNone);

// pipelines/<name> as a newer diffusers / transformers saved it again: pipelines-v<version>/<name>
// holds the files that save wrote differently and removed.json the ones it no longer wrote; they
// are laid over a copy of pipelines/<name> in a temporary folder, which must give that release's
// final latents (pipelines-v<version>/<name>.ref) as check_pipeline does.
void check_resaved_pipeline(const std::string& name, const std::string& version);
// That folder (pipelines/<name> with pipelines-v<version>/<name> laid over it), made under `into`;
// returns its path.
std::filesystem::path resaved_pipeline(const std::string& name, const std::string& version,
                                       const std::filesystem::path& into);

// Fails unless `fn` throws an xfuser::Error whose text contains every needle.
// The bytes of a valid 1x1 RGB PNG whose header (IHDR, its CRC fixed) declares width x height:
// what a decompression bomb looks like to a reader that trusts the header.
std::string png_declaring(uint32_t width, uint32_t height);

void expect_error_containing(const std::function<void()>& fn,
                             const std::vector<std::string>& needles);

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
