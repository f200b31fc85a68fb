// HunyuanVideo15Pipeline (HunyuanVideo-1.5 text to video) and its image-to-video pipeline: the
// programmatic API ends on
// diffusers 0.36.0's final latents (and decoded video) for one prompt with a quoted text (ByT5
// glyphs) under the folder's guider (CFG against ""), and for two prompts with negative prompts;
// xfuser-run on the diffusers-made folder (--model_path alone picks HunyuanVideo-1.5) writes the
// MP4 and ends on diffusers' latents; every parallel layout on 2 and 4 ranks (Ulysses, ring, USP,
// CFG, tensor, data) ends on the serial latents; bad flags are named.
#include <algorithm>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/weights/safetensors.h"
#include "runner/outputs.h"
#include "runner/video.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::mpirun_prefix;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

TEST(HunyuanVideo15Pipeline, FinalLatentsEqualDiffusers) {
  xfuser::testing::check_pipeline("hunyuan_video15-tiny");
}

TEST(HunyuanVideo15Pipeline, ImageToVideoFinalLatentsEqualDiffusers) {
  // A 70x40 picture: the 48x32 bucket of target_size 48, resized to cover and cropped; SigLIP
  // embeddings, the first-frame latent condition and meanflow's timestep_r.
  xfuser::testing::check_pipeline("hunyuan_video15-i2v-tiny");
}

class HunyuanVideo15Run : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
    XF_REQUIRE_FIXTURE(refs_);
  }
  static std::string quoted(const std::string& s) { return "'" + s + "'"; }
  nlohmann::json read_case(const std::string& name) const {
    std::ifstream in(refs_ / name / "case.json");
    return nlohmann::json::parse(in);
  }
  std::string command(const std::string& case_name, const std::string& out,
                      const std::string& extra = "", int frames = 5) const {
    const auto c = read_case(case_name);
    auto list = [](const nlohmann::json& j) {
      std::string s;
      if (j.is_null()) return s;
      if (j.is_string()) return quoted(j.get<std::string>());
      for (const auto& p : j) s += " " + quoted(p.get<std::string>());
      return s;
    };
    std::string cmd = bin_ + " --model_path " + (pipelines_ / "hunyuan_video15-tiny").string() +
                      " --prompt " + list(c["prompt"]);
    if (!c["negative_prompt"].is_null()) cmd += " --negative_prompt " + list(c["negative_prompt"]);
    return cmd + " --height 32 --width 48 --num_frames " + std::to_string(frames) +
           " --fps 8 --num_inference_steps " + std::to_string(c["num_inference_steps"].get<int>()) +
           " --guidance_scale " + std::to_string(c["guidance_scale"].get<double>()) +
           " --dtype fp32 --latents " + (refs_ / case_name / "latents.safetensors").string() +
           " --save_latents --output_directory " + out + " " + extra;
  }
  static at::Tensor final_latents(const fs::path& dir, const std::string& name) {
    return SafetensorsFile((dir / (name + ".latents.safetensors")).string()).get("final_latents");
  }

  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path pipelines_ = xfuser::testing::fixtures_dir() / "pipelines";
  const fs::path refs_ = pipelines_ / "hunyuan_video15-tiny.ref";
};

TEST_F(HunyuanVideo15Run, ModelPathAloneEndsOnDiffusersAndWritesTheMp4) {
  TempDir out;
  std::string log;
  ASSERT_EQ(run_command(command("t2v", out.path().string(), "--output_type frames"), &log), 0)
      << log;
  const std::string name = "HunyuanVideo-1.5_u1r1_tc_False_32x48_0";
  const fs::path video = out / (name + ".mp4");
  ASSERT_TRUE(fs::exists(video)) << log;
  const at::Tensor want =
      SafetensorsFile((refs_ / "t2v" / "final.safetensors").string()).get("latents");
  const double rel = xfuser::testing::max_rel_error(final_latents(out.path(), name), want);
  std::printf("xfuser-run vs diffusers final latents: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  const auto info = xfuser::runner::read_video_info(video);
  EXPECT_EQ(info.frames, 5);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
  const at::Tensor frames =
      (SafetensorsFile((refs_ / "t2v" / "image.safetensors").string()).get("image")[0] * 255)
          .round()
          .to(at::kInt);
  int worst = 0;
  for (int64_t k = 0; k < frames.size(0); ++k) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "_frame%04lld.png", static_cast<long long>(k));
    const at::Tensor got = xfuser::runner::read_png(out / (name + suffix)).to(at::kInt);
    ASSERT_EQ(got.sizes(), frames[k].sizes());
    worst = std::max(worst, (got - frames[k]).abs().max().item<int>());
  }
  std::printf("PNG frames vs diffusers: max |diff| %d levels\n", worst);
  EXPECT_LE(worst, 1);
}

TEST_F(HunyuanVideo15Run, EveryParallelLayoutEndsOnTheSerialLatents) {
  TempDir serial;
  std::string log;
  ASSERT_EQ(run_command(command("batch2", serial.path().string()), &log), 0) << log;
  const std::string base = "HunyuanVideo-1.5_u1r1_tc_False_32x48_";
  const at::Tensor want0 = final_latents(serial.path(), base + "0");
  const at::Tensor want1 = final_latents(serial.path(), base + "1");
  const at::Tensor diffusers =
      SafetensorsFile((refs_ / "batch2" / "final.safetensors").string()).get("latents");
  EXPECT_LE(xfuser::testing::max_rel_error(at::cat({want0, want1}, 0), diffusers), 1e-4);
  struct Layout {
    int np;
    std::string flags, tag;
  };
  for (const auto& l :
       std::vector<Layout>{{2, "--ulysses_degree 2", "u2r1"},
                           {2, "--ring_degree 2", "u1r2"},
                           {2, "--use_cfg_parallel", "u1r1_cfg2"},
                           {2, "--tensor_parallel_degree 2", "u1r1_tp2"},
                           {2, "--data_parallel_degree 2", "u1r1_dp2"},
                           {4, "--ulysses_degree 2 --ring_degree 2", "u2r2"},
                           {4, "--ulysses_degree 2 --use_cfg_parallel", "u2r1_cfg2"}}) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    ASSERT_EQ(
        run_command(mpirun_prefix(l.np) + command("batch2", out.path().string(), l.flags), &log), 0)
        << log;
    const std::string name = "HunyuanVideo-1.5_" + l.tag + "_tc_False_32x48_";
    const double rel =
        std::max(xfuser::testing::max_rel_error(final_latents(out.path(), name + "0"), want0),
                 xfuser::testing::max_rel_error(final_latents(out.path(), name + "1"), want1));
    std::printf("[hv15 run] %-40s vs serial %.2e\n", l.flags.c_str(), rel);
    EXPECT_LE(rel, 1e-5);
  }
}

TEST_F(HunyuanVideo15Run, PipeFusionIsExactWithFullWarmupUnderCfgParallel) {
  // One prompt per branch (CFG parallel): no text mask, so PipeFusion applies; warm-up through
  // every step is exact, one warm-up step is measured.
  TempDir serial, full, stale;
  std::string log;
  ASSERT_EQ(run_command(command("t2v", serial.path().string()), &log), 0) << log;
  const at::Tensor want = final_latents(serial.path(), "HunyuanVideo-1.5_u1r1_tc_False_32x48_0");
  ASSERT_EQ(
      run_command(mpirun_prefix(4) + command("t2v", full.path().string(),
                                             "--pipefusion_parallel_degree 2 --use_cfg_parallel "
                                             "--pipefusion_warmup_steps 3"),
                  &log),
      0)
      << log;
  const std::string name = "HunyuanVideo-1.5_u1r1_pp2_cfg2_tc_False_32x48_0";
  const double rel = xfuser::testing::max_rel_error(final_latents(full.path(), name), want);
  std::printf("[hv15 run] PipeFusion 2 x CFG 2, warm-up 3 of 3: vs serial %.2e\n", rel);
  EXPECT_LE(rel, 1e-5);
  ASSERT_EQ(run_command(mpirun_prefix(4) + command("t2v", stale.path().string(),
                                                   "--pipefusion_parallel_degree 2 "
                                                   "--use_cfg_parallel"),
                        &log),
            0)
      << log;
  const at::Tensor got = final_latents(stale.path(), name);
  const double stale_rel = xfuser::testing::max_rel_error(got, want);
  std::printf("[hv15 run] PipeFusion 2 x CFG 2, warm-up 1 of 3: vs serial %.2e (staleness)\n",
              stale_rel);
  EXPECT_TRUE(at::isfinite(got).all().item<bool>());
  EXPECT_GT(stale_rel, 1e-6);
  EXPECT_LT(stale_rel, 0.5);
}

TEST_F(HunyuanVideo15Run, ParallelVaeDecodesTheSerialFrames) {
  TempDir serial, par;
  std::string log;
  ASSERT_EQ(run_command(command("t2v", serial.path().string(), "--output_type frames"), &log), 0)
      << log;
  ASSERT_EQ(run_command(mpirun_prefix(2) +
                            command("t2v", par.path().string(),
                                    "--ulysses_degree 2 --use_parallel_vae --output_type frames"),
                        &log),
            0)
      << log;
  int worst = 0;
  for (int k = 0; k < 5; ++k) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "_frame%04d.png", k);
    const at::Tensor a =
        xfuser::runner::read_png(serial /
                                 ("HunyuanVideo-1.5_u1r1_tc_False_32x48_0" + std::string(suffix)))
            .to(at::kInt);
    const at::Tensor b = xfuser::runner::read_png(
                             par / ("HunyuanVideo-1.5_u2r1_tc_False_32x48_0" + std::string(suffix)))
                             .to(at::kInt);
    ASSERT_EQ(a.sizes(), b.sizes());
    worst = std::max(worst, (a - b).abs().max().item<int>());
  }
  std::printf("[hv15 run] --use_parallel_vae on 2 ranks vs serial frames: max %d levels\n", worst);
  EXPECT_LE(worst, 1);
}

TEST_F(HunyuanVideo15Run, ImageToVideoFromAPictureFile) {
  // --model_path alone picks HunyuanVideo-1.5-I2V; no --height / --width: the picture's bucket.
  const fs::path folder = pipelines_ / "hunyuan_video15-i2v-tiny";
  const fs::path ref = pipelines_ / "hunyuan_video15-i2v-tiny.ref" / "i2v";
  XF_REQUIRE_FIXTURE(ref);
  std::ifstream in(ref / "case.json");
  const auto c = nlohmann::json::parse(in);
  const std::string cmd = bin_ + " --model_path " + folder.string() + " --prompt " +
                          quoted(c["prompt"].get<std::string>()) + " --input_images " +
                          (ref / "input.png").string() +
                          " --num_frames 5 --num_inference_steps 3 --guidance_scale 6 --dtype "
                          "fp32 --save_latents --latents " +
                          (ref / "latents.safetensors").string() + " --output_directory ";
  const at::Tensor want = SafetensorsFile((ref / "final.safetensors").string()).get("latents");
  struct Layout {
    int np;
    std::string flags, tag;
  };
  for (const auto& l : std::vector<Layout>{{1, "", "u1r1"},
                                           {2, "--ulysses_degree 2 --use_parallel_vae", "u2r1"},
                                           {2, "--use_cfg_parallel", "u1r1_cfg2"}}) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    std::string log;
    const std::string prefix = l.np > 1 ? mpirun_prefix(l.np) : "";
    ASSERT_EQ(run_command(prefix + cmd + out.path().string() + " " + l.flags, &log), 0) << log;
    const std::string name = "HunyuanVideo-1.5-I2V_" + l.tag + "_tc_False_32x48_0";
    ASSERT_TRUE(fs::exists(out / (name + ".mp4"))) << log;
    const double rel = xfuser::testing::max_rel_error(final_latents(out.path(), name), want);
    std::printf("[hv15 i2v] %-40s vs diffusers %.2e\n", l.flags.c_str(), rel);
    EXPECT_LE(rel, 1e-4);
  }
}

TEST_F(HunyuanVideo15Run, BadFlagsAreNamed) {
  TempDir out;
  std::string log;
  EXPECT_NE(run_command(command("t2v", out.path().string(), "--true_cfg_scale 3"), &log), 0);
  EXPECT_NE(log.find("--true_cfg_scale"), std::string::npos) << log;
  EXPECT_NE(run_command(command("t2v", out.path().string(), "", 6), &log), 0);
  EXPECT_NE(log.find("--num_frames 6"), std::string::npos) << log;
  EXPECT_NE(run_command(command("t2v", out.path().string(), "--input_images x.png"), &log), 0);
  EXPECT_NE(log.find("--input_images"), std::string::npos) << log;
  // PipeFusion with the two CFG branches in one batch: their text masks differ.
  EXPECT_NE(run_command(mpirun_prefix(2) +
                            command("t2v", out.path().string(), "--pipefusion_parallel_degree 2"),
                        &log),
            0);
  EXPECT_NE(log.find("--pipefusion_parallel_degree takes no text mask"), std::string::npos) << log;
}

}  // namespace
