// xfuser-run on Wan 2.1 text-to-video: a diffusers-made WanPipeline folder runs from --model_path
// alone and, from diffusers' initial latents, ends on diffusers' final latents; the MP4 has the
// requested frames, size and frame rate and its decoded frames match diffusers' video within
// codec tolerance; --output_type frames adds one PNG per frame; every parallel layout on 2 and 4
// ranks (Ulysses, ring, USP, CFG, tensor, exact PipeFusion) ends on the serial latents, with 18
// video tokens that 4 does not divide, and patched PipeFusion stays close; bad frame counts and
// video flags on image models are clear errors. Image-to-video from a picture file equals diffusers
// under Ulysses, CFG, tensor and ring x CFG.
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

class WanRun : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
    XF_REQUIRE_FIXTURE(ref_);
    std::ifstream in(ref_ / "case.json");
    case_ = nlohmann::json::parse(in);
  }
  // The cfg_negative case's command line, from diffusers' initial latents; --flow_shift 5 is the
  // folder's (xDiT's default for Wan2.1-T2V is 12).
  std::string command(const std::string& out, const std::string& dtype = "fp32") const {
    return bin_ + " --model_path " + (pipelines_ / "wan-t2v-tiny").string() + " --prompt '" +
           case_["prompt"].get<std::string>() + "' --negative_prompt '" +
           case_["negative_prompt"].get<std::string>() +
           "' --height 32 --width 48 --num_frames 9 --fps 8 --flow_shift 5" +
           " --num_inference_steps " + std::to_string(case_["num_inference_steps"].get<int>()) +
           " --guidance_scale " + std::to_string(case_["guidance_scale"].get<double>()) +
           " --max_sequence_length " + std::to_string(case_["max_sequence_length"].get<int>()) +
           " --dtype " + dtype + " --latents " + (ref_ / "latents.safetensors").string() +
           " --save_latents --output_directory " + out;
  }
  at::Tensor final_latents(const fs::path& dir, const std::string& name) const {
    return SafetensorsFile((dir / (name + ".latents.safetensors")).string()).get("final_latents");
  }

  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path pipelines_ = xfuser::testing::fixtures_dir() / "pipelines";
  const fs::path ref_ = pipelines_ / "wan-t2v-tiny.ref" / "cfg_negative";
  nlohmann::json case_;
};

TEST_F(WanRun, ModelPathAloneEndsOnDiffusersAndWritesTheMp4) {
  TempDir out;
  std::string log;
  ASSERT_EQ(run_command(command(out.path().string()) + " --output_type frames", &log), 0) << log;
  // The folder's WanPipeline picked Wan2.1-T2V.
  const std::string name = "Wan2.1-T2V_u1r1_tc_False_32x48_0";
  const fs::path video = out / (name + ".mp4");
  ASSERT_TRUE(fs::exists(video)) << log;
  const double rel = xfuser::testing::max_rel_error(
      final_latents(out.path(), name),
      SafetensorsFile((ref_ / "final.safetensors").string()).get("latents"));
  EXPECT_LE(rel, 1e-4) << "final latents vs diffusers";

  const auto info = xfuser::runner::read_video_info(video);
  EXPECT_EQ(info.frames, 9);
  EXPECT_EQ(info.width, 48);
  EXPECT_EQ(info.height, 32);
  EXPECT_NEAR(info.fps, 8.0, 1e-6);
  EXPECT_EQ(info.codec, "h264");
  EXPECT_EQ(info.pixel_format, "yuv420p");
  ASSERT_TRUE(info.metadata.count("comment")) << "the generation parameters";
  const auto params = nlohmann::json::parse(info.metadata.at("comment"));
  EXPECT_EQ(params["prompt"], case_["prompt"]);
  EXPECT_EQ(params["num_frames"], "9");
  EXPECT_EQ(params["flow_shift"], "5");

  // The PNG frames are diffusers' decoded video within 1 level; the MP4's frames within codec
  // tolerance of them.
  const at::Tensor want =
      (SafetensorsFile((ref_ / "image.safetensors").string()).get("image")[0] * 255)
          .round()
          .to(at::kInt);  // [F, H, W, 3]
  const at::Tensor decoded = xfuser::runner::read_video_frames(video).to(at::kInt);
  ASSERT_EQ(decoded.sizes(), want.sizes());
  for (int64_t k = 0; k < 9; ++k) {
    char frame[64];
    std::snprintf(frame, sizeof(frame), "%s_frame%04lld.png", name.c_str(),
                  static_cast<long long>(k));
    const at::Tensor png = xfuser::runner::read_png(out / frame).to(at::kInt);
    EXPECT_LE((png - want[k]).abs().max().item<int>(), 1) << frame;
  }
  const double mean_error = (decoded - want).abs().to(at::kFloat).mean().item<double>();
  std::printf("MP4 vs diffusers frames: mean |diff| %.2f levels\n", mean_error);
  EXPECT_LE(mean_error, 6.0) << "H.264 (crf 17) of the frames";
}

// The fixture folder was saved by diffusers 0.33.1: its schedule is Wan's own (the default above
// equals diffusers 0.33.1). --flow_sigmas reference is that same run; --flow_sigmas from_one is
// today's diffusers schedule, which moves every timestep but the first.
TEST_F(WanRun, FlowSigmasFlagPicksTheSchedule) {
  TempDir base, reference, from_one;
  std::string log;
  const std::string name = "Wan2.1-T2V_u1r1_tc_False_32x48_0";
  ASSERT_EQ(run_command(command(base.path().string()), &log), 0) << log;
  ASSERT_EQ(run_command(command(reference.path().string()) + " --flow_sigmas reference", &log), 0)
      << log;
  ASSERT_EQ(run_command(command(from_one.path().string()) + " --flow_sigmas from_one", &log), 0)
      << log;
  const at::Tensor want = final_latents(base.path(), name);
  EXPECT_TRUE(at::equal(final_latents(reference.path(), name), want));
  const double moved = xfuser::testing::max_rel_error(final_latents(from_one.path(), name), want);
  std::printf("--flow_sigmas from_one vs the folder's schedule: max rel %.3g\n", moved);
  EXPECT_GT(moved, 1e-4) << "today's schedule differs from Wan's own";
}

TEST_F(WanRun, EveryParallelLayoutEndsOnTheSerialLatents) {
  TempDir serial;
  std::string log;
  ASSERT_EQ(run_command(command(serial.path().string()), &log), 0) << log;
  const at::Tensor want = final_latents(serial.path(), "Wan2.1-T2V_u1r1_tc_False_32x48_0");
  struct Layout {
    int np;
    std::string flags, name;
  };
  const std::vector<Layout> layouts = {
      {2, "--ulysses_degree 2", "Wan2.1-T2V_u2r1_tc_False_32x48_0"},
      {2, "--ring_degree 2", "Wan2.1-T2V_u1r2_tc_False_32x48_0"},
      {2, "--use_cfg_parallel", "Wan2.1-T2V_u1r1_cfg2_tc_False_32x48_0"},
      {2, "--tensor_parallel_degree 2", "Wan2.1-T2V_u1r1_tp2_tc_False_32x48_0"},
      {4, "--ulysses_degree 2 --ring_degree 2", "Wan2.1-T2V_u2r2_tc_False_32x48_0"},
      {4, "--ulysses_degree 2 --use_cfg_parallel", "Wan2.1-T2V_u2r1_cfg2_tc_False_32x48_0"},
      {4, "--ring_degree 4", "Wan2.1-T2V_u1r4_tc_False_32x48_0"},
      // dp 2 with one prompt: group 1 has nothing to do, group 0 writes prompt 0.
      {2, "--data_parallel_degree 2", "Wan2.1-T2V_u1r1_dp2_tc_False_32x48_0"},
  };
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    ASSERT_EQ(run_command(mpirun_prefix(l.np) + command(out.path().string()) + " " + l.flags, &log),
              0)
        << log;
    EXPECT_LE(xfuser::testing::max_rel_error(final_latents(out.path(), l.name), want), 1e-5);
  }
  // PipeFusion with one warm-up step per step is exact (every step synchronous).
  TempDir pp;
  ASSERT_EQ(run_command(mpirun_prefix(2) + command(pp.path().string()) +
                            " --pipefusion_parallel_degree 2 --pipefusion_warmup_steps 4",
                        &log),
            0)
      << log;
  EXPECT_LE(xfuser::testing::max_rel_error(
                final_latents(pp.path(), "Wan2.1-T2V_u1r1_pp2_tc_False_32x48_0"), want),
            1e-5);
  // Two patches after one warm-up step: stale K/V of the other patch, and one UniPC scheduler
  // per patch split from the warm-up's (test_unipc checks the split is exact); close to serial.
  TempDir patched;
  ASSERT_EQ(run_command(mpirun_prefix(2) + command(patched.path().string()) +
                            " --pipefusion_parallel_degree 2 --pipefusion_warmup_steps 1",
                        &log),
            0)
      << log;
  const double stale = xfuser::testing::max_rel_error(
      final_latents(patched.path(), "Wan2.1-T2V_u1r1_pp2_tc_False_32x48_0"), want);
  std::printf("PipeFusion 2 patches, 1 warm-up step: final latents rel %.2e vs serial\n", stale);
  EXPECT_LE(stale, 0.05);
}

TEST_F(WanRun, ImageToVideoFromAPictureFileEqualsDiffusersUnderEveryLayout) {
  const fs::path ref = pipelines_ / "wan-i2v-tiny.ref" / "cfg_negative";
  XF_REQUIRE_FIXTURE(ref);
  std::ifstream in(ref / "case.json");
  const auto c = nlohmann::json::parse(in);
  const std::string cmd =
      bin_ + " --model_path " + (pipelines_ / "wan-i2v-tiny").string() + " --prompt '" +
      c["prompt"].get<std::string>() + "' --negative_prompt '" +
      c["negative_prompt"].get<std::string>() + "' --input_images " + (ref / "input.png").string() +
      " --height 32 --width 48 --num_frames 9 --num_inference_steps 4 --guidance_scale 5" +
      " --max_sequence_length 32 --flow_shift 5 --dtype fp32 --save_latents --latents " +
      (ref / "latents.safetensors").string() + " --output_directory ";
  const at::Tensor want = SafetensorsFile((ref / "final.safetensors").string()).get("latents");
  std::string log;
  struct Layout {
    int np;
    std::string flags, name;
  };
  const std::vector<Layout> layouts = {
      {1, "", "Wan2.1-I2V_u1r1_tc_False_32x48_0"},
      {2, "--ulysses_degree 2", "Wan2.1-I2V_u2r1_tc_False_32x48_0"},
      {2, "--use_cfg_parallel", "Wan2.1-I2V_u1r1_cfg2_tc_False_32x48_0"},
      {2, "--tensor_parallel_degree 2", "Wan2.1-I2V_u1r1_tp2_tc_False_32x48_0"},
      {4, "--ring_degree 2 --use_cfg_parallel", "Wan2.1-I2V_u1r2_cfg2_tc_False_32x48_0"},
  };
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    const std::string prefix = l.np > 1 ? mpirun_prefix(l.np) : "";
    ASSERT_EQ(run_command(prefix + cmd + out.path().string() + " " + l.flags, &log), 0) << log;
    ASSERT_TRUE(fs::exists(out / (l.name + ".mp4"))) << log;
    EXPECT_LE(xfuser::testing::max_rel_error(final_latents(out.path(), l.name), want), 1e-5);
  }
  // The picture is required, once; PipeFusion is refused before any weight is read.
  TempDir out;
  const std::string tiny = bin_ + " --model tiny-wan-i2v --prompt 'a cat' --num_inference_steps " +
                           "1 --output_directory " + out.path().string();
  EXPECT_NE(run_command(tiny, &log), 0);
  EXPECT_NE(log.find("give its first frame as one --input_images picture (got 0)"),
            std::string::npos)
      << log;
  EXPECT_NE(run_command(mpirun_prefix(2) + tiny + " --input_images " +
                            (ref / "input.png").string() + " --pipefusion_parallel_degree 2",
                        &log),
            0);
  EXPECT_NE(log.find("--pipefusion_parallel_degree is not supported by model tiny-wan-i2v"),
            std::string::npos)
      << log;
  EXPECT_NE(run_command(tiny + " --input_images " + (out / "missing.png").string(), &log), 0);
  EXPECT_NE(log.find("missing.png"), std::string::npos) << log;
}

TEST_F(WanRun, EveryMakeTinyLayoutRunsAsItsModel) {
  // make-tiny's four Wan layouts run from --model_path alone as the model their folder is.
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  const fs::path picture = pipelines_ / "wan-i2v-tiny.ref" / "cfg_negative" / "input.png";
  XF_REQUIRE_FIXTURE(picture);
  struct Arch {
    std::string arch, model, flags;
  };
  const std::vector<Arch> archs = {
      {"wan-t2v", "Wan2.1-T2V", ""},
      {"wan-i2v", "Wan2.1-I2V", " --input_images " + picture.string()},
      {"wan22-t2v", "Wan2.2-T2V", " --guidance_scale 4 --guidance_scale_2 3"},
      {"wan22-i2v", "Wan2.2-I2V", " --guidance_scale_2 2 --input_images " + picture.string()},
  };
  for (const auto& a : archs) {
    SCOPED_TRACE(a.arch);
    TempDir dir;
    std::string log;
    ASSERT_EQ(run_command(
                  tool + " make-tiny --arch " + a.arch + " --out " + (dir / "pipe").string(), &log),
              0)
        << log;
    ASSERT_EQ(run_command(bin_ + " --model_path " + (dir / "pipe").string() +
                              " --prompt 'a cat' --height 32 --width 48 --num_frames 5" +
                              " --num_inference_steps 3 --flow_shift 12 --dtype fp32" +
                              " --max_sequence_length 16 --output_directory " +
                              (dir / "out").string() + a.flags,
                          &log),
              0)
        << log;
    const fs::path video = dir / "out" / (a.model + "_u1r1_tc_False_32x48_0.mp4");
    ASSERT_TRUE(fs::exists(video)) << log;
    EXPECT_EQ(xfuser::runner::read_video_info(video).frames, 5);
  }
}

TEST_F(WanRun, Bf16UlyssesStaysWithinBf16NoiseOfSerial) {
  // bf16 transformer and UMT5 (the VAE stays float32): Ulysses 2 against one rank, both bf16,
  // and one rank bf16 against fp32, measured on the final latents.
  std::string log;
  auto run = [&](const std::string& prefix, const std::string& dtype, const std::string& flags,
                 const std::string& name) {
    TempDir out;
    EXPECT_EQ(run_command(prefix + command(out.path().string(), dtype) + " " + flags, &log), 0)
        << log;
    return final_latents(out.path(), name);
  };
  const std::string serial = "Wan2.1-T2V_u1r1_tc_False_32x48_0";
  const at::Tensor fp32 = run("", "fp32", "", serial);
  const at::Tensor bf16 = run("", "bf16", "", serial);
  const at::Tensor bf16_u2 =
      run(mpirun_prefix(2), "bf16", "--ulysses_degree 2", "Wan2.1-T2V_u2r1_tc_False_32x48_0");
  ASSERT_TRUE(fp32.defined() && bf16.defined() && bf16_u2.defined());
  const double noise = xfuser::testing::max_rel_error(bf16, fp32);
  const double layout = xfuser::testing::max_rel_error(bf16_u2, bf16);
  std::printf("bf16 vs fp32: %.2e; bf16 Ulysses 2 vs bf16 one rank: %.2e\n", noise, layout);
  EXPECT_LE(noise, 0.1) << "bf16 rounding over 4 steps";
  EXPECT_LE(layout, std::max(2 * noise, 1e-2)) << "a layout stays within bf16's own noise";
}

TEST_F(WanRun, FrameCountsAndVideoFlagsAreCheckedNamingTheFlag) {
  TempDir out;
  std::string log;
  const std::string tiny = bin_ + " --model tiny-wan --prompt 'a cat' --num_inference_steps 1 " +
                           "--output_directory " + out.path().string();
  EXPECT_NE(run_command(tiny + " --num_frames 8", &log), 0);
  EXPECT_NE(log.find("--num_frames 8 is not 4k + 1 frames"), std::string::npos) << log;
  EXPECT_NE(run_command(tiny + " --num_frames 9 --height 40", &log), 0);
  EXPECT_NE(log.find("--height must be a positive multiple of 16 (got 40)"), std::string::npos)
      << log;
  EXPECT_NE(run_command(tiny + " --flow_shift -1", &log), 0);
  EXPECT_NE(log.find("--flow_shift must be a number in (0, 1000]"), std::string::npos) << log;
  EXPECT_NE(run_command(tiny + " --flow_sigmas sideways", &log), 0);
  EXPECT_NE(log.find("--flow_sigmas"), std::string::npos) << log;
  EXPECT_NE(log.find("sideways"), std::string::npos) << log;
  EXPECT_NE(run_command(tiny + " --guidance_scale_2 3", &log), 0);
  EXPECT_NE(log.find("--guidance_scale_2 is not supported by model tiny-wan"), std::string::npos)
      << log;
  // Video flags on an image model.
  const std::string flux =
      bin_ + " --model tiny-flux --prompt 'a cat' --output_directory " + out.path().string();
  EXPECT_NE(run_command(flux + " --num_frames 9", &log), 0);
  EXPECT_NE(log.find("--num_frames is not supported by model tiny-flux"), std::string::npos) << log;
  EXPECT_NE(run_command(flux + " --flow_sigmas from_one", &log), 0);
  EXPECT_NE(log.find("--flow_sigmas is not supported by model tiny-flux"), std::string::npos)
      << log;
  EXPECT_NE(run_command(flux + " --output_type frames", &log), 0);
  EXPECT_NE(log.find("--output_type frames is for video models"), std::string::npos) << log;
  EXPECT_TRUE(fs::is_empty(out.path())) << "nothing written by a refused run";
}

TEST_F(WanRun, EmbeddedTinyWanWritesAVideoAndResumeSkipsIt) {
  TempDir out;
  std::string log;
  const std::string cmd = bin_ + " --model tiny-wan --prompt 'a cat' --num_inference_steps 2 " +
                          "--dtype fp32 --output_directory " + out.path().string();
  ASSERT_EQ(run_command(cmd, &log), 0) << log;
  const fs::path video = out / "tiny-wan_u1r1_tc_False_32x48_0.mp4";
  ASSERT_TRUE(fs::exists(video)) << log;
  const auto info = xfuser::runner::read_video_info(video);
  EXPECT_EQ(info.frames, 9);
  EXPECT_NEAR(info.fps, 16.0, 1e-6);
  const auto written = fs::last_write_time(video);
  // A dataset run with --resume finds the complete video with the same parameters.
  std::ofstream(out / "prompts.txt") << "a cat\n";
  ASSERT_EQ(
      run_command(bin_ + " --model tiny-wan --num_inference_steps 2 --dtype fp32 " +
                      "--batch_size 1 --resume --dataset_path " + (out / "prompts.txt").string() +
                      " --output_directory " + out.path().string(),
                  &log),
      0)
      << log;
  EXPECT_NE(log.find("1 of 1 outputs complete, 0 to generate"), std::string::npos) << log;
  EXPECT_EQ(fs::last_write_time(video), written);
}

// Schedules that repeat a timestep (many steps; a tiny shift) run every step, as diffusers' Wan
// pipeline does with its begin index at 0.
TEST_F(WanRun, SchedulesWithRepeatedTimestepsRunEveryStep) {
  TempDir out;
  std::string log;
  const std::string tiny =
      bin_ + " --model tiny-wan --prompt 'a cat' --output_directory " + out.path().string();
  for (const std::string args : {" --num_inference_steps 300", " --flow_shift 1e-6"}) {
    EXPECT_EQ(run_command(tiny + args, &log), 0) << args << "\n" << log;
    EXPECT_EQ(log.find("error"), std::string::npos) << args << "\n" << log;
  }
}

// --resume records every input that changes a video: a changed --input_images picture (same name,
// other pixels) is generated again; with --output_type frames every frame PNG is checked, so a
// deleted frame, or frames asked of a video-only output, are written.
TEST_F(WanRun, ResumeComparesInputPicturesAndEveryFrame) {
  TempDir out;
  const fs::path picture = out / "input.png";
  xfuser::runner::write_png(picture, at::full({32, 48, 3}, 100, at::kByte));
  std::ofstream(out / "prompts.txt") << "a cat\n";
  auto cmd = [&](const std::string& type) {
    return bin_ +
           " --model tiny-wan-i2v --num_inference_steps 1 --dtype fp32 --resume --batch_size 1 " +
           "--dataset_path " + (out / "prompts.txt").string() + " --input_images " +
           picture.string() + " --output_type " + type + " --output_directory " +
           out.path().string();
  };
  const fs::path video = out / "tiny-wan-i2v_u1r1_tc_False_32x48_0.mp4";
  const fs::path frame3 = out / "tiny-wan-i2v_u1r1_tc_False_32x48_0_frame0003.png";
  std::string log;
  ASSERT_EQ(run_command(cmd("video"), &log), 0) << log;
  ASSERT_TRUE(fs::exists(video)) << log;
  EXPECT_FALSE(fs::exists(frame3));
  ASSERT_EQ(run_command(cmd("video"), &log), 0) << log;
  EXPECT_NE(log.find("1 of 1 outputs complete, 0 to generate"), std::string::npos) << log;
  // Frames asked of a video-only output: generated again, frames written.
  ASSERT_EQ(run_command(cmd("frames"), &log), 0) << log;
  EXPECT_NE(log.find("0 of 1 outputs complete, 1 to generate"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(frame3)) << log;
  ASSERT_EQ(run_command(cmd("frames"), &log), 0) << log;
  EXPECT_NE(log.find("1 of 1 outputs complete, 0 to generate"), std::string::npos) << log;
  // One frame deleted: generated again.
  fs::remove(frame3);
  ASSERT_EQ(run_command(cmd("frames"), &log), 0) << log;
  EXPECT_NE(log.find("frame0003.png is missing or incomplete"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(frame3)) << log;
  // The same picture file name with other pixels: generated again, naming what changed.
  xfuser::runner::write_png(picture, at::full({32, 48, 3}, 200, at::kByte));
  ASSERT_EQ(run_command(cmd("frames"), &log), 0) << log;
  EXPECT_NE(log.find("was made with other parameters (input_images 'input.png@"), std::string::npos)
      << log;
  EXPECT_NE(log.find("0 of 1 outputs complete, 1 to generate"), std::string::npos) << log;
}

// A run removes the temporaries a killed run left beside its own outputs (a video, its frames,
// the reports), even without --resume; other hidden files are not its to remove.
TEST_F(WanRun, ARunRemovesStaleTemporariesOfItsOwnOutputs) {
  TempDir out;
  const std::vector<std::string> stale = {".tiny-wan_u1r1_tc_False_32x48_0.mp4.tmp123456",
                                          ".tiny-wan_u1r1_tc_False_32x48_0_frame0002.png.tmp9",
                                          ".timings_rank0.json.tmp77"};
  const std::vector<std::string> kept = {".tiny-wan_u1r1_tc_False_32x48_7.mp4.tmp1",
                                         ".notes.txt.tmp5",
                                         ".tiny-wan_u1r1_tc_False_32x48_0.mp4.tmpx"};
  for (const auto& f : stale) std::ofstream(out / f) << "partial";
  for (const auto& f : kept) std::ofstream(out / f) << "not this run's";
  std::string log;
  ASSERT_EQ(run_command(bin_ + " --model tiny-wan --prompt 'a cat' --num_inference_steps 1 " +
                            "--output_directory " + out.path().string(),
                        &log),
            0)
      << log;
  for (const auto& f : stale) {
    EXPECT_FALSE(fs::exists(out / f)) << f;
    EXPECT_NE(log.find("removing " + (out / f).string() + " (left by an interrupted run)"),
              std::string::npos)
        << log;
  }
  for (const auto& f : kept) EXPECT_TRUE(fs::exists(out / f)) << f;
}

}  // namespace
