// HunyuanVideoPipeline: the programmatic API ends on diffusers' final latents (and decoded video)
// for embedded guidance and for a batch of two prompts of different token counts under true CFG;
// xfuser-run on the diffusers-made folder (--model_path alone picks HunyuanVideo) writes the MP4
// with the requested frames, size and rate; every parallel layout on 2 and 4 ranks (Ulysses, ring,
// USP, CFG, tensor, data, exact PipeFusion) ends on the serial latents with the padded, masked
// text kept whole on every rank; PipeFusion refuses prompts of different token counts (a mask);
// the embedded tiny-hunyuan-video (make-tiny's folder, its tokenizer.json written here) runs, and
// writes the same frames with --use_parallel_vae (which refuses --enable_tiling).
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

TEST(HunyuanPipeline, FinalLatentsEqualDiffusers) {
  xfuser::testing::check_pipeline("hunyuan-video-tiny");
}

class HunyuanVideoRun : public ::testing::Test {
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
  // The case's command line, from diffusers' initial latents.
  std::string command(const std::string& case_name, const std::string& out,
                      const std::string& extra = "") const {
    const auto c = read_case(case_name);
    std::string prompts, negatives;
    auto list = [](const nlohmann::json& j) {
      std::string s;
      if (j.is_null()) return s;
      if (j.is_string()) return quoted(j.get<std::string>());
      for (const auto& p : j) s += " " + quoted(p.get<std::string>());
      return s;
    };
    std::string cmd = bin_ + " --model_path " + (pipelines_ / "hunyuan-video-tiny").string() +
                      " --prompt " + list(c["prompt"]);
    if (!c["negative_prompt"].is_null()) cmd += " --negative_prompt " + list(c["negative_prompt"]);
    if (c.contains("true_cfg_scale")) {
      cmd += " --true_cfg_scale " + std::to_string(c["true_cfg_scale"].get<double>());
    }
    return cmd + " --height 32 --width 48 --num_frames 9 --fps 8" + " --num_inference_steps " +
           std::to_string(c["num_inference_steps"].get<int>()) + " --guidance_scale " +
           std::to_string(c["guidance_scale"].get<double>()) + " --max_sequence_length " +
           std::to_string(c["max_sequence_length"].get<int>()) + " --dtype fp32 --latents " +
           (refs_ / case_name / "latents.safetensors").string() +
           " --save_latents --output_directory " + out + " " + extra;
  }
  static at::Tensor final_latents(const fs::path& dir, const std::string& name) {
    return SafetensorsFile((dir / (name + ".latents.safetensors")).string()).get("final_latents");
  }

  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path pipelines_ = xfuser::testing::fixtures_dir() / "pipelines";
  const fs::path refs_ = pipelines_ / "hunyuan-video-tiny.ref";
};

TEST_F(HunyuanVideoRun, ModelPathAloneEndsOnDiffusersAndWritesTheMp4) {
  TempDir out;
  std::string log;
  ASSERT_EQ(
      run_command(command("embedded_guidance", out.path().string(), "--output_type frames"), &log),
      0)
      << log;
  const std::string name = "HunyuanVideo_u1r1_tc_False_32x48_0";
  const fs::path video = out / (name + ".mp4");
  ASSERT_TRUE(fs::exists(video)) << log;
  const at::Tensor want =
      SafetensorsFile((refs_ / "embedded_guidance" / "final.safetensors").string()).get("latents");
  const double rel = xfuser::testing::max_rel_error(final_latents(out.path(), name), want);
  std::printf("xfuser-run vs diffusers final latents: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  const auto info = xfuser::runner::read_video_info(video);
  EXPECT_EQ(info.frames, 9);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
  EXPECT_NEAR(info.fps, 8.0, 1e-6);
  // diffusers' decoded frames [F, H, W, 3] in [0, 1] -> levels.
  const at::Tensor frames =
      (SafetensorsFile((refs_ / "embedded_guidance" / "image.safetensors").string())
           .get("image")[0] *
       255)
          .round()
          .to(at::kInt);
  // The lossless PNG frames equal diffusers' to one level (rounding of a 4e-6 difference).
  int worst = 0;
  for (int64_t k = 0; k < frames.size(0); ++k) {
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "_frame%04lld.png", static_cast<long long>(k));
    const fs::path png = out / (name + suffix);
    ASSERT_TRUE(fs::exists(png)) << png;
    const at::Tensor got = xfuser::runner::read_png(png).to(at::kInt);
    ASSERT_EQ(got.sizes(), frames[k].sizes()) << png;
    worst = std::max(worst, (got - frames[k]).abs().max().item<int>());
  }
  std::printf("PNG frames vs diffusers: max |diff| %d levels\n", worst);
  EXPECT_LE(worst, 1);
  // The MP4 holds the same frames through H.264 (crf 17, yuv420p): the tiny model's random VAE
  // decodes pixel noise, the codec's worst case, so only the frame count, size and a bounded mean
  // loss are asserted here (test_video checks the codec on natural content).
  const at::Tensor decoded = xfuser::runner::read_video_frames(video).to(at::kInt);
  ASSERT_EQ(decoded.sizes(), frames.sizes());
  const double mean_error = (decoded - frames).abs().to(at::kFloat).mean().item<double>();
  std::printf("MP4 vs diffusers frames: mean |diff| %.2f levels\n", mean_error);
  EXPECT_LE(mean_error, 20.0) << "H.264 (crf 17, 4:2:0) of noise-like frames";
}

TEST_F(HunyuanVideoRun, EveryParallelLayoutEndsOnTheSerialLatents) {
  // Two prompts of different token counts (a text key mask) under true CFG.
  TempDir serial;
  std::string log;
  ASSERT_EQ(run_command(command("true_cfg_batch2", serial.path().string()), &log), 0) << log;
  const std::string base = "HunyuanVideo_u1r1_tc_False_32x48_";
  const at::Tensor want0 = final_latents(serial.path(), base + "0");
  const at::Tensor want1 = final_latents(serial.path(), base + "1");
  const at::Tensor diffusers =
      SafetensorsFile((refs_ / "true_cfg_batch2" / "final.safetensors").string()).get("latents");
  EXPECT_LE(xfuser::testing::max_rel_error(at::cat({want0, want1}, 0), diffusers), 1e-4);
  struct Layout {
    int np;
    std::string flags, tag;
  };
  const std::vector<Layout> layouts = {
      {2, "--ulysses_degree 2", "u2r1"},
      {2, "--ring_degree 2", "u1r2"},
      {2, "--use_cfg_parallel", "u1r1_cfg2"},
      {2, "--tensor_parallel_degree 2", "u1r1_tp2"},
      {2, "--data_parallel_degree 2", "u1r1_dp2"},
      {4, "--ulysses_degree 2 --ring_degree 2", "u2r2"},
      {4, "--ring_degree 2 --use_cfg_parallel", "u1r2_cfg2"},
  };
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    ASSERT_EQ(
        run_command(mpirun_prefix(l.np) + command("true_cfg_batch2", out.path().string(), l.flags),
                    &log),
        0)
        << log;
    const std::string name = "HunyuanVideo_" + l.tag + "_tc_False_32x48_";
    const double rel =
        std::max(xfuser::testing::max_rel_error(final_latents(out.path(), name + "0"), want0),
                 xfuser::testing::max_rel_error(final_latents(out.path(), name + "1"), want1));
    std::printf("[hunyuan run] %-40s vs serial %.2e\n", l.flags.c_str(), rel);
    EXPECT_LE(rel, 1e-5);
  }
  // PipeFusion takes no text mask: the two prompts' different token counts are a clear error.
  TempDir bad;
  EXPECT_NE(run_command(mpirun_prefix(2) + command("true_cfg_batch2", bad.path().string(),
                                                   "--pipefusion_parallel_degree 2"),
                        &log),
            0);
  EXPECT_NE(log.find("different token counts"), std::string::npos) << log;
}

TEST_F(HunyuanVideoRun, PipeFusionWithOnePromptEndsOnTheSerialLatents) {
  TempDir serial;
  std::string log;
  ASSERT_EQ(run_command(command("embedded_guidance", serial.path().string()), &log), 0) << log;
  const at::Tensor want = final_latents(serial.path(), "HunyuanVideo_u1r1_tc_False_32x48_0");
  // Warm-up through every step: exact. Then 2 patches after 1 warm-up step: close (stale K/V).
  for (const int warmup : {3, 1}) {
    TempDir pp;
    ASSERT_EQ(run_command(mpirun_prefix(2) +
                              command("embedded_guidance", pp.path().string(),
                                      "--pipefusion_parallel_degree 2 --pipefusion_warmup_steps " +
                                          std::to_string(warmup)),
                          &log),
              0)
        << log;
    const double rel = xfuser::testing::max_rel_error(
        final_latents(pp.path(), "HunyuanVideo_u1r1_pp2_tc_False_32x48_0"), want);
    std::printf("[hunyuan run] PipeFusion 2, warm-up %d of 3: vs serial %.2e\n", warmup, rel);
    EXPECT_LE(rel, warmup == 3 ? 1e-5 : 0.5);
  }
}

TEST_F(HunyuanVideoRun, EmbeddedTinyModelWritesAVideo) {
  TempDir out;
  std::string log;
  ASSERT_EQ(run_command(bin_ + " --model tiny-hunyuan-video --prompt 'a cat walks on the grass' " +
                            "--num_inference_steps 2 --output_directory " + out.path().string(),
                        &log),
            0)
      << log;
  const fs::path video = out / "tiny-hunyuan-video_u1r1_tc_False_32x48_0.mp4";
  ASSERT_TRUE(fs::exists(video)) << log;
  const auto info = xfuser::runner::read_video_info(video);
  EXPECT_EQ(info.frames, 9);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
}

TEST_F(HunyuanVideoRun, ParallelVaeWritesTheSameFrames) {
  // --use_parallel_vae under --ulysses_degree 2: bands of latent rows per rank, all-gathered.
  const std::string base = mpirun_prefix(2) + bin_ +
                           " --model tiny-hunyuan-video --prompt 'a cat' --num_inference_steps 2 "
                           "--dtype fp32 --ulysses_degree 2 --output_type frames";
  TempDir serial, parallel;
  std::string log;
  ASSERT_EQ(run_command(base + " --output_directory " + serial.path().string(), &log), 0) << log;
  ASSERT_EQ(run_command(base + " --use_parallel_vae --output_directory " + parallel.path().string(),
                        &log),
            0)
      << log;
  int compared = 0, worst = 0;
  for (const auto& entry : fs::directory_iterator(serial.path())) {
    const fs::path name = entry.path().filename();
    const std::string ext = name.extension().string();
    if (ext != ".png" && ext != ".mp4") continue;
    ASSERT_TRUE(fs::exists(parallel / name.string())) << name << " missing with --use_parallel_vae";
    const at::Tensor a = ext == ".png" ? xfuser::runner::read_png(entry.path())
                                       : xfuser::runner::read_video_frames(entry.path());
    const at::Tensor b = ext == ".png"
                             ? xfuser::runner::read_png(parallel / name.string())
                             : xfuser::runner::read_video_frames(parallel / name.string());
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const at::Tensor d = (a.to(at::kInt) - b.to(at::kInt)).abs();
    if (ext == ".png") {
      // Lossless: the decodes differ by float rounding, at most one level after rounding.
      const int diff = d.max().item<int>();
      worst = std::max(worst, diff);
      EXPECT_LE(diff, 1) << name;
    } else {
      // H.264 amplifies a one-level input difference on noise-like frames (motion search picks
      // other blocks): bound the mean.
      const double mean = d.to(at::kFloat).mean().item<double>();
      std::printf("[hunyuan run] --use_parallel_vae MP4: mean |diff| %.3f levels\n", mean);
      EXPECT_LE(mean, 1.0) << name;
    }
    ++compared;
  }
  std::printf("[hunyuan run] --use_parallel_vae: %d files, PNG max |diff| %d levels\n", compared,
              worst);
  EXPECT_GE(compared, 2) << "the MP4 and its PNG frames";
  // Spatial tiling and the patch-parallel decode together are refused before any compute.
  TempDir bad;
  EXPECT_NE(run_command(base + " --use_parallel_vae --enable_tiling --output_directory " +
                            bad.path().string(),
                        &log),
            0);
  EXPECT_NE(log.find("--enable_tiling and --use_parallel_vae"), std::string::npos) << log;
}

}  // namespace
