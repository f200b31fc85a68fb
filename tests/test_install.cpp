// `cmake --install` gives a usable CMake package: an outside project (examples/) configures with
// find_package(xfuser), builds against the installed headers and libraries, and runs on
// tiny-flux, loading the installed SentencePiece shim (about 15 s: one small program to build).
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::testing::run_command;

TEST(Install, AnOutsideProjectBuildsAndRunsAgainstTheInstalledPackage) {
  xfuser::testing::TempDir dir("xfuser-install");
  const fs::path prefix = dir / "prefix";
  const fs::path build = dir / "example-build";
  std::string log;
  ASSERT_EQ(run_command("cmake --install " + xfuser::testing::binary_dir().string() + " --prefix " +
                            prefix.string(),
                        &log),
            0)
      << log;
  for (const char* f :
       {"include/xfuser/runner/runner.h", "include/xfuser/backends/error.h",
        "include/xfuser/models/xfuser_model.h", "lib/libxfuser_runner.a", "lib/libxfuser_models.a",
        "lib/libxfuser_spm.so", "lib/cmake/xfuser/xfuserConfig.cmake",
        "lib/cmake/xfuser/xfuserConfigVersion.cmake", "lib/cmake/xfuser/xfuserTargets.cmake",
        "bin/xfuser-run", "bin/xfuser"}) {
    EXPECT_TRUE(fs::exists(prefix / f)) << f << " not installed\n" << log;
  }

  // The example as an outside project: only the installed package, never the build tree.
  ASSERT_EQ(
      run_command("cmake -S " + (xfuser::testing::source_dir() / "examples").string() + " -B " +
                      build.string() + " -G Ninja -DCMAKE_PREFIX_PATH=" + prefix.string(),
                  &log),
      0)
      << log;
  ASSERT_EQ(run_command("cmake --build " + build.string() + " -j 1", &log), 0) << log;
  const fs::path example = build / "xfuser-example-generate";
  ASSERT_TRUE(fs::exists(example)) << log;

  // It runs, and takes the SentencePiece shim from the prefix (LD_DEBUG lists what is loaded).
  const std::string env = "XFUSER_CACHE=" + (dir / "cache").string() + " LD_DEBUG=files ";
  ASSERT_EQ(run_command(env + example.string() + " 'a dog' " + (dir / "out").string(), &log), 0)
      << log;
  at::Tensor img = xfuser::runner::read_png(dir / "out" / "tiny-flux_u1r1_tc_False_256x256_0.png");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{256, 256, 3}));
  EXPECT_NE(log.find((prefix / "lib" / "libxfuser_spm.so").string()), std::string::npos)
      << "the example did not load the installed shim";

  // The installed tool resolves every library, libtorch to the one it was built against (a venv
  // inside the checkout, a second libtorch in /usr/lib: its RUNPATH must name the right one).
  const fs::path tool = prefix / "bin" / "xfuser-run";
  std::string ldd;
  ASSERT_EQ(run_command("ldd " + tool.string(), &ldd), 0) << ldd;
  EXPECT_EQ(ldd.find("not found"), std::string::npos) << ldd;
  fs::path c10;  // the line "libc10.so[.<version>] => <path> (<address>)"
  std::istringstream lines(ldd);
  for (std::string line; std::getline(lines, line);) {
    const std::string::size_type name = line.find("libc10.so");
    const std::string::size_type arrow = line.find(" => ");
    if (name == std::string::npos || arrow == std::string::npos || arrow < name) continue;
    if (line.find_first_not_of(" \t") != name) continue;  // the name opens the line
    if (line.find_first_of(" \t=", name) != arrow) continue;
    c10 = line.substr(arrow + 4, line.find(" (", arrow + 4) - (arrow + 4));
  }
  ASSERT_FALSE(c10.empty()) << ldd;
  EXPECT_TRUE(fs::exists(c10) && fs::equivalent(c10, XFUSER_TEST_C10_LIBRARY))
      << tool << " loads " << c10 << ", built against " << XFUSER_TEST_C10_LIBRARY << "\n"
      << ldd;

  // The installed tool runs too (shim from <prefix>/lib through its RUNPATH).
  ASSERT_EQ(run_command(env + tool.string() +
                            " --model tiny-flux --prompt x --height 32 --width 32 "
                            "--num_inference_steps 1 --output_directory " +
                            (dir / "out2").string(),
                        &log),
            0)
      << log;
  EXPECT_NE(log.find((prefix / "lib" / "libxfuser_spm.so").string()), std::string::npos)
      << "xfuser-run did not load the installed shim";
}

}  // namespace
