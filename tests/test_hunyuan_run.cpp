// `xfuser forward` on HunyuanVideoTransformer3DModel under mpirun (2 ranks): tensor parallel 2
// equals the diffusers fixtures, and so do Ulysses 2 and ring 2 (the text whole on both ranks,
// padded text keys masked).
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::max_rel_error;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

fs::path fixture_case(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::string forward_command(const fs::path& model, const fs::path& inputs, const fs::path& out) {
  const fs::path tool = xfuser::testing::binary_dir() / "bin" / "xfuser";
  return q(tool) + " forward --model-dir " + q(model) + " --inputs " + q(inputs) + " --output " +
         q(out) + " --dtype fp32";
}

TEST(HunyuanRun, TensorParallelUnderMpirunEqualsTheFixtures) {
  TempDir tmp("xfuser-hunyuan-run");
  for (const std::string name : {"hunyuan_video-tiny-s1", "hunyuan_video-masked-s1"}) {
    SCOPED_TRACE(name);
    const fs::path f = fixture_case(name);
    XF_REQUIRE_FIXTURE(f);
    const fs::path o = tmp / (name + ".safetensors");
    std::string log;
    ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) +
                              forward_command(f, f / "inputs.safetensors", o) +
                              " --tensor_parallel_degree 2",
                          &log),
              0)
        << log;
    const auto want = SafetensorsFile((f / "output.safetensors").string()).get("sample");
    const double err = max_rel_error(SafetensorsFile(o.string()).get("sample"), want);
    std::cout << "[ xfuser forward tp 2 " << name << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, 1e-4);
  }
}

TEST(HunyuanRun, SequenceParallelUnderMpirunEqualsTheFixtures) {
  // The text stays whole on both ranks (12 tokens, and the masked fixture's padded 7 with its key
  // mask on the replicated text).
  TempDir tmp("xfuser-hunyuan-run");
  for (const std::string name : {"hunyuan_video-tiny-s1", "hunyuan_video-masked-s1"}) {
    const fs::path f = fixture_case(name);
    XF_REQUIRE_FIXTURE(f);
    const auto want = SafetensorsFile((f / "output.safetensors").string()).get("sample");
    for (const std::string degrees : {"--ulysses_degree 2", "--ring_degree 2"}) {
      SCOPED_TRACE(name + " " + degrees);
      std::string log;
      const fs::path o = tmp / "o.safetensors";
      ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) +
                                forward_command(f, f / "inputs.safetensors", o) + " " + degrees,
                            &log),
                0)
          << log;
      const double err = max_rel_error(SafetensorsFile(o.string()).get("sample"), want);
      std::cout << "[ xfuser forward " << name << " " << degrees << " ] max rel error vs diffusers "
                << err << std::endl;
      EXPECT_LE(err, 1e-4);
    }
  }
}

}  // namespace
