// xfuser-run on the embedded tiny FLUX in every compute dtype, on the CPU: fp16 runs end to end
// (libtorch's CPU kernels lack float16 matmuls and some pointwise ops; xfuser computes those in
// float32 and rounds back), and one seed gives the same picture in every dtype because the
// initial noise is drawn in float32 on a CPU generator and then cast (DiTPipeline::
// initial_noise). Before that change bf16 and fp32 images of one seed differed by ~30/255 on
// average (different noise); now only the rounding of the computation separates them.
// Also the fp8 weight flags (--use_fp8_gemms, --fp8_storage) through xfuser-run: reported,
// weights smaller, pictures close to bf16 (docs/fp8.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

class DtypeRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
    dirs_ = new xfuser::testing::TempDir("xfuser-dtype");
  }
  static void TearDownTestSuite() {
    delete dirs_;
    dirs_ = nullptr;
  }

  // The image of one run in `dtype` (cached per dtype), as uint8 [H, W, C].
  static at::Tensor image(const std::string& dtype, int seed = 42) {
    const fs::path out = dirs_->path() / (dtype + "_" + std::to_string(seed));
    const fs::path png = out / "tiny-flux_u1r1_tc_False_64x48_0.png";
    if (!fs::exists(png)) {
      const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
      std::string log;
      const int rc = xfuser::testing::run_command(
          bin +
              " --model tiny-flux --prompt 'a red cat' --height 64 --width 48 "
              "--num_inference_steps 4 --max_sequence_length 8 --seed " +
              std::to_string(seed) + " --dtype " + dtype + " --output_directory " + out.string(),
          &log);
      EXPECT_EQ(rc, 0) << log;
      EXPECT_EQ(log.find("not implemented for"), std::string::npos) << log;
      if (rc != 0 || !fs::exists(png)) return at::Tensor();
    }
    return xfuser::runner::read_png(png);
  }

  // Mean absolute pixel difference (0..255).
  static double mean_abs_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().mean().item<double>();
  }

  static xfuser::testing::TempDir* dirs_;
};

xfuser::testing::TempDir* DtypeRun::dirs_ = nullptr;

TEST_F(DtypeRun, Fp16RunsEndToEndAndMatchesFp32) {
  const at::Tensor fp32 = image("fp32"), fp16 = image("fp16");
  ASSERT_TRUE(fp32.defined() && fp16.defined());
  ASSERT_EQ(fp16.sizes(), fp32.sizes());
  EXPECT_EQ(fp16.size(0), 64);
  EXPECT_EQ(fp16.size(1), 48);
  const double diff = mean_abs_diff(fp16, fp32);
  std::printf("fp16 vs fp32 (seed 42): mean |diff| = %.3f / 255\n", diff);
  RecordProperty("fp16_vs_fp32_mean_abs_diff", std::to_string(diff));
  EXPECT_LT(diff, 1.0);  // measured 0.05
}

TEST_F(DtypeRun, OneSeedGivesTheSamePictureInBf16AndFp32) {
  const at::Tensor fp32 = image("fp32"), bf16 = image("bf16");
  ASSERT_TRUE(fp32.defined() && bf16.defined());
  ASSERT_EQ(bf16.sizes(), fp32.sizes());
  const double diff = mean_abs_diff(bf16, fp32);
  std::printf("bf16 vs fp32 (seed 42): mean |diff| = %.3f / 255\n", diff);
  RecordProperty("bf16_vs_fp32_mean_abs_diff", std::to_string(diff));
  EXPECT_LT(diff, 4.0);  // measured 1.5
  // The bound is meaningful: another seed in the same dtype is far from it.
  const at::Tensor other = image("fp32", 7);
  ASSERT_TRUE(other.defined());
  const double seeds = mean_abs_diff(other, fp32);
  std::printf("fp32 seed 7 vs seed 42: mean |diff| = %.3f / 255\n", seeds);
  EXPECT_GT(seeds, 4 * diff);
  EXPECT_GT(seeds, 10.0);
}

}  // namespace

namespace {

namespace fs = std::filesystem;

// ---- fp8 weights through xfuser-run (docs/fp8.md)
// --------------------------------------------------------------------------------

namespace {

struct RunOutput {
  int rc = -1;
  std::string log;
  at::Tensor image;
  nlohmann::json report;
};

RunOutput run_tiny_flux(const fs::path& out, const std::string& flags) {
  RunOutput r;
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  r.rc = xfuser::testing::run_command(
      bin +
          " --model tiny-flux --prompt 'a red cat' --height 64 --width 48 --num_inference_steps 3 "
          "--max_sequence_length 8 --seed 5 --dtype bf16 --output_directory " +
          out.string() + " " + flags,
      &r.log);
  const fs::path png = out / "tiny-flux_u1r1_tc_False_64x48_0.png";
  if (r.rc == 0 && fs::exists(png)) r.image = xfuser::runner::read_png(png);
  if (fs::exists(out / "timings_rank0.json")) {
    std::ifstream in(out / "timings_rank0.json");
    r.report = nlohmann::json::parse(in);
  }
  return r;
}

}  // namespace

TEST(Fp8Run, FlagsReachTheTransformerAndHalveItsWeights) {
  setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  xfuser::testing::TempDir tmp("xfuser-fp8-run");
  const auto base = run_tiny_flux(tmp / "bf16", "");
  ASSERT_EQ(base.rc, 0) << base.log;
  ASSERT_TRUE(base.image.defined());
  const int64_t base_bytes = base.report["memory"]["transformer_parameter_bytes"];
  EXPECT_EQ(base.report["config"]["transformer_weights"], "as_loaded");
  for (const auto& [flags, name] : std::vector<std::pair<std::string, std::string>>{
           {"--use_fp8_gemms", "fp8_gemms:float8_e4m3fn"},
           {"--fp8_storage float8_e4m3fn", "fp8_storage:float8_e4m3fn"},
           {"--fp8_storage float8_e5m2", "fp8_storage:float8_e5m2"}}) {
    SCOPED_TRACE(flags);
    const auto run = run_tiny_flux(
        tmp / name.substr(0, name.find(':')) / name.substr(name.find(':') + 1), flags);
    ASSERT_EQ(run.rc, 0) << run.log;
    ASSERT_TRUE(run.image.defined());
    EXPECT_EQ(run.report["config"]["transformer_weights"], name);
    const int64_t bytes = run.report["memory"]["transformer_parameter_bytes"];
    // bf16 -> fp8 halves what is converted; embedders, norms and the head stay bf16.
    EXPECT_LT(bytes, base_bytes * 0.75) << bytes << " of " << base_bytes;
    const double diff =
        (run.image.to(at::kDouble) - base.image.to(at::kDouble)).abs().mean().item<double>();
    std::printf("%s: transformer %lld of %lld bytes, mean pixel change %.2f / 255\n", flags.c_str(),
                static_cast<long long>(bytes), static_cast<long long>(base_bytes), diff);
    EXPECT_LT(diff, 12.0);
  }
}

TEST(Fp8Run, ConflictingFlagsAreClearErrors) {
  setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  xfuser::testing::TempDir tmp("xfuser-fp8-bad");
  const auto both = run_tiny_flux(tmp / "both", "--use_fp8_gemms --fp8_storage float8_e4m3fn");
  EXPECT_NE(both.rc, 0);
  EXPECT_NE(both.log.find("--use_fp8_gemms and --fp8_storage"), std::string::npos) << both.log;
  const auto bad = run_tiny_flux(tmp / "bad", "--fp8_storage fp8");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.log.find("--fp8_storage"), std::string::npos) << bad.log;
}

// --enable_model_cpu_offload / --enable_sequential_cpu_offload: the same picture as without
// them, the offload in the run report (on the CPU the weights stay in host memory, so the report
// shows what a device would hold), a warning that the CPU saves nothing, and the two together
// refused by name.
TEST(OffloadRun, FlagsKeepThePictureAndReportTheDeviceBytes) {
  setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  xfuser::testing::TempDir tmp("xfuser-offload-run");
  const auto base = run_tiny_flux(tmp / "base", "");
  ASSERT_EQ(base.rc, 0) << base.log;
  EXPECT_EQ(base.report["config"]["cpu_offload"], "none");
  EXPECT_FALSE(base.report["memory"].contains("offload"));
  for (const auto& [flag, mode] : std::vector<std::pair<std::string, std::string>>{
           {"--enable_model_cpu_offload", "model"},
           {"--enable_sequential_cpu_offload", "sequential"}}) {
    SCOPED_TRACE(flag);
    const auto run = run_tiny_flux(tmp / mode, flag);
    ASSERT_EQ(run.rc, 0) << run.log;
    ASSERT_TRUE(run.image.defined());
    EXPECT_TRUE(at::equal(run.image, base.image)) << "the offload changed the picture";
    EXPECT_EQ(run.report["config"]["cpu_offload"], mode);
    const auto& o = run.report["memory"]["offload"];
    EXPECT_EQ(o["mode"], mode);
    EXPECT_EQ(o["components"], 4);  // CLIP, T5, the transformer, the VAE
    EXPECT_GT(o["onloads"].get<int64_t>(), 0);
    EXPECT_LE(o["peak_resident_parameter_bytes"].get<int64_t>(), o["bound_bytes"].get<int64_t>());
    EXPECT_EQ(o["streamed_blocks"].get<int>() > 0, mode == "sequential");
    EXPECT_NE(run.log.find("saves no memory on the CPU"), std::string::npos) << run.log;
  }
  const auto both =
      run_tiny_flux(tmp / "both", "--enable_model_cpu_offload --enable_sequential_cpu_offload");
  EXPECT_NE(both.rc, 0);
  EXPECT_NE(both.log.find("--enable_model_cpu_offload and --enable_sequential_cpu_offload"),
            std::string::npos)
      << both.log;
}

}  // namespace
