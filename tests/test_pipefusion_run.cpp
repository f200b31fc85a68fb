// xfuser-run with PipeFusion under mpirun on the embedded tiny model: the exact pipeline writes
// the serial image, the approximate one reports its PSNR in the log and the run report, and bad
// PipeFusion flags are errors naming the flag.
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::max_pixel_diff;

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PipeFusionRun : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  }
  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  // 64x48: 4 token rows; 3 steps.
  const std::string common_ =
      " --model tiny-flux --prompt 'a cat' --height 64 --width 48 --num_inference_steps 3 "
      "--dtype fp32 --max_sequence_length 8";
  const std::string image_ = "tiny-flux_u1r1_tc_False_64x48_0.png";
  const std::string pp2_image_ = "tiny-flux_u1r1_pp2_tc_False_64x48_0.png";  // the pp 2 run's
};

TEST_F(PipeFusionRun, ExactPipelineWritesTheSerialImage) {
  xfuser::testing::TempDir serial, out;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(
                bin_ + common_ + " --output_directory " + serial.path().string(), &log),
            0)
      << log;
  ASSERT_EQ(xfuser::testing::run_command(
                xfuser::testing::mpirun_prefix(2) + bin_ + common_ +
                    " --pipefusion_parallel_degree 2 --pipefusion_warmup_steps 3 "
                    "--output_directory " +
                    out.path().string(),
                &log),
            0)
      << log;
  ASSERT_TRUE(fs::exists(out / pp2_image_)) << log;
  EXPECT_LE(max_pixel_diff(out / pp2_image_, serial / image_), 1);
  for (int r = 0; r < 2; ++r) {
    auto report = nlohmann::json::parse(read(out / ("timings_rank" + std::to_string(r) + ".json")));
    EXPECT_EQ(report["pipefusion"]["stage"], r);
    EXPECT_EQ(report["pipefusion"]["exact"], true);
    EXPECT_EQ(report["pipefusion"]["psnr_measured"], false);
    // One timing per step on every stage.
    int steps = 0;
    for (const auto& st : report["iterations"][0]["stages"]) steps += st["name"] == "denoise_step";
    EXPECT_EQ(steps, 3);
  }
}

TEST_F(PipeFusionRun, ApproximatePipelineReportsItsPsnr) {
  xfuser::testing::TempDir out;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(
                xfuser::testing::mpirun_prefix(2) + bin_ + common_ +
                    " --pipefusion_parallel_degree 2 --num_pipeline_patch 2 "
                    "--pipefusion_warmup_steps 1 --pipefusion_psnr --output_directory " +
                    out.path().string(),
                &log),
            0)
      << log;
  EXPECT_NE(log.find("PipeFusion PSNR vs exact:"), std::string::npos) << log;
  for (int r = 0; r < 2; ++r) {
    auto report = nlohmann::json::parse(read(out / ("timings_rank" + std::to_string(r) + ".json")));
    const auto& pf = report["pipefusion"];
    EXPECT_EQ(pf["exact"], false);
    EXPECT_EQ(pf["psnr_measured"], true);
    // null: identical images (the stale K/V may move no pixel of this small image); else the
    // bound of test_pipefusion's OneWarmupStepPsnrAboveBound.
    if (!pf["psnr_db"].is_null()) {
      EXPECT_GT(pf["psnr_db"].get<double>(), 40.0) << pf.dump();
    }
  }
}

TEST_F(PipeFusionRun, BadFlagsAreErrors) {
  xfuser::testing::TempDir out;
  std::string log;
  const std::string dir = " --output_directory " + out.path().string();
  EXPECT_NE(xfuser::testing::run_command(bin_ + common_ + " --num_pipeline_patch 2" + dir, &log),
            0);
  EXPECT_NE(log.find("need --pipefusion_parallel_degree > 1"), std::string::npos) << log;
  int code = xfuser::testing::run_command(
      xfuser::testing::mpirun_prefix(2) + bin_ + common_ +
          " --pipefusion_parallel_degree 2 --pipefusion_layers 1,1" + dir,
      &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 124) << "timed out: " << log;
  EXPECT_NE(log.find("--pipefusion_layers 1,1 sums to 2; the model has 4"), std::string::npos)
      << log;
  code = xfuser::testing::run_command(xfuser::testing::mpirun_prefix(2) + bin_ + common_ +
                                          " --pipefusion_parallel_degree 2 --num_pipeline_patch 5" +
                                          dir,
                                      &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 124) << "timed out: " << log;
  EXPECT_NE(log.find("--num_pipeline_patch 5 must be between 1 and the 4 latent token rows"),
            std::string::npos)
      << log;
}

}  // namespace
