// `xfuser forward` on Flux2Transformer2DModel: one process on both diffusers 0.36.0 fixtures, and
// under mpirun (2 ranks) tensor parallel 2, Ulysses 2 and ring 2 on flux2-tiny-s1 (its 3-D int64
// ids as Flux2Pipeline passes them, a reference image's t = 10 rows sharded with the tokens).
#include <iostream>
#include <string>

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
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / name;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::string forward_command(const fs::path& model, const fs::path& out) {
  const fs::path tool = xfuser::testing::binary_dir() / "bin" / "xfuser";
  return q(tool) + " forward --model-dir " + q(model) + " --inputs " +
         q(model / "inputs.safetensors") + " --output " + q(out) + " --dtype fp32";
}

double error_vs_diffusers(const fs::path& model, const fs::path& out) {
  const auto want = SafetensorsFile((model / "output.safetensors").string()).get("sample");
  const auto got = SafetensorsFile(out.string()).get("sample");
  EXPECT_EQ(got.sizes(), want.sizes());
  return max_rel_error(got, want);
}

TEST(Flux2Run, ForwardToolEqualsTheFixtures) {
  TempDir tmp("xfuser-flux2-run");
  for (const std::string name : {"flux2-tiny-s1", "flux2-other-s1"}) {
    SCOPED_TRACE(name);
    const fs::path f = fixture_case(name);
    XF_REQUIRE_FIXTURE(f);
    const fs::path o = tmp / (name + ".safetensors");
    std::string log;
    ASSERT_EQ(run_command(forward_command(f, o), &log), 0) << log;
    const double err = error_vs_diffusers(f, o);
    std::cout << "[ xfuser forward " << name << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, 1e-4);
  }
}

TEST(Flux2Run, ParallelDegreesUnderMpirunEqualTheFixture) {
  TempDir tmp("xfuser-flux2-run");
  const fs::path f = fixture_case("flux2-tiny-s1");
  XF_REQUIRE_FIXTURE(f);
  for (const std::string degrees :
       {"--tensor_parallel_degree 2", "--ulysses_degree 2", "--ring_degree 2"}) {
    SCOPED_TRACE(degrees);
    const fs::path o = tmp / "o.safetensors";
    std::string log;
    ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) + forward_command(f, o) + " " + degrees,
                          &log),
              0)
        << log;
    const double err = error_vs_diffusers(f, o);
    std::cout << "[ xfuser forward flux2-tiny-s1 " << degrees << " ] max rel error " << err
              << std::endl;
    EXPECT_LE(err, 1e-4);
  }
}

}  // namespace
