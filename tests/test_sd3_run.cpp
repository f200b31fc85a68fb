// xfuser-run on SD3: a diffusers-made StableDiffusion3Pipeline folder runs from --model_path
// alone and, from diffusers' initial latents (--latents), ends on diffusers' final latents
// (--save_latents writes them); the latents a run saves replay the same image; data parallel
// and CFG parallel under mpirun write the serial images; an unknown pipeline class and a
// planned model id are clear errors.
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/weights/safetensors.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::max_pixel_diff;

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

class Sd3Run : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  }
  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path pipelines_ = xfuser::testing::fixtures_dir() / "pipelines";
};

TEST_F(Sd3Run, ModelPathAloneFromDiffusersLatentsEndsOnDiffusersLatents) {
  const fs::path ref = pipelines_ / "sd3-tiny.ref" / "cfg_negative";
  XF_REQUIRE_FIXTURE(ref);
  std::ifstream in(ref / "case.json");
  const auto c = nlohmann::json::parse(in);
  TempDir out;
  std::string log;
  const std::string cmd =
      bin_ + " --model_path " + (pipelines_ / "sd3-tiny").string() + " --prompt '" +
      c["prompt"].get<std::string>() + "' --negative_prompt '" +
      c["negative_prompt"].get<std::string>() + "' --height 64 --width 64" +
      " --num_inference_steps " + std::to_string(c["num_inference_steps"].get<int>()) +
      " --guidance_scale " + std::to_string(c["guidance_scale"].get<double>()) +
      " --max_sequence_length " + std::to_string(c["max_sequence_length"].get<int>()) +
      " --dtype fp32 --latents " + (ref / "latents.safetensors").string() +
      " --save_latents --output_directory " + out.path().string();
  ASSERT_EQ(run_command(cmd, &log), 0) << log;
  // The folder's StableDiffusion3Pipeline picked SD3.5.
  const fs::path image = out / "SD3.5_u1r1_tc_False_64x64_0.png";
  ASSERT_TRUE(fs::exists(image)) << log;
  SafetensorsFile saved((out / "SD3.5_u1r1_tc_False_64x64_0.latents.safetensors").string());
  EXPECT_TRUE(at::equal(saved.get("latents"),
                        SafetensorsFile((ref / "latents.safetensors").string()).get("latents")));
  const double rel = xfuser::testing::max_rel_error(
      saved.get("final_latents"),
      SafetensorsFile((ref / "final.safetensors").string()).get("latents"));
  EXPECT_LE(rel, 1e-4) << "final latents vs diffusers";
}

TEST_F(Sd3Run, SavedLatentsReplayTheImage) {
  TempDir first, second;
  std::string log;
  const std::string common = bin_ +
                             " --model tiny-sd3 --prompt 'a red apple' --num_inference_steps 2 "
                             "--dtype fp32 --max_sequence_length 8";
  ASSERT_EQ(
      run_command(common + " --seed 5 --save_latents --output_directory " + first.path().string(),
                  &log),
      0)
      << log;
  const fs::path latents = first / "tiny-sd3_u1r1_tc_False_64x64_0.latents.safetensors";
  ASSERT_TRUE(fs::exists(latents)) << log;
  // Another seed, but the saved latents: the same image.
  ASSERT_EQ(run_command(common + " --seed 6 --latents " + latents.string() +
                            " --output_directory " + second.path().string(),
                        &log),
            0)
      << log;
  EXPECT_EQ(max_pixel_diff(first / "tiny-sd3_u1r1_tc_False_64x64_0.png",
                           second / "tiny-sd3_u1r1_tc_False_64x64_0.png"),
            0);
  // A file for another prompt count is an error naming the file and the shape.
  EXPECT_NE(run_command(common + " --prompt 'a pear' --latents " + latents.string() +
                            " --output_directory " + second.path().string() + "/x",
                        &log),
            0);
  EXPECT_NE(log.find("first dimension must be the 2 prompt(s)"), std::string::npos) << log;
}

TEST_F(Sd3Run, DataAndCfgParallelWriteTheSerialImages) {
  TempDir serial, dp, cfg;
  std::string log;
  const std::string common = bin_ +
                             " --model tiny-sd3 --prompt 'a red apple' --prompt 'a blue car' "
                             "--num_inference_steps 2 --dtype fp32 --max_sequence_length 8";
  ASSERT_EQ(run_command(common + " --output_directory " + serial.path().string(), &log), 0) << log;
  ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) + common +
                            " --data_parallel_degree 2 --output_directory " + dp.path().string(),
                        &log),
            0)
      << log;
  // CFG parallel needs no extra flag: SD3 runs classifier-free guidance at guidance 3.5.
  ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) + common +
                            " --use_cfg_parallel --output_directory " + cfg.path().string(),
                        &log),
            0)
      << log;
  for (int i = 0; i < 2; ++i) {
    const std::string n = std::to_string(i);
    EXPECT_LE(max_pixel_diff(dp / ("tiny-sd3_u1r1_dp2_tc_False_64x64_" + n + ".png"),
                             serial / ("tiny-sd3_u1r1_tc_False_64x64_" + n + ".png")),
              1);
    EXPECT_LE(max_pixel_diff(cfg / ("tiny-sd3_u1r1_cfg2_tc_False_64x64_" + n + ".png"),
                             serial / ("tiny-sd3_u1r1_tc_False_64x64_" + n + ".png")),
              1);
  }
}

TEST_F(Sd3Run, ForwardUnderMpirunEqualsTheFixture) {
  // The generic driver behind `xfuser forward` under mpirun: the cropped, non-square SD3.5 case.
  const fs::path f = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "sd3-crop-s1";
  XF_REQUIRE_FIXTURE(f);
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  const at::Tensor want = SafetensorsFile((f / "output.safetensors").string()).get("sample");
  TempDir out;
  for (const std::string degrees :
       {"--ulysses_degree 2", "--ring_degree 2", "--tensor_parallel_degree 2"}) {
    std::string log;
    const fs::path o = out / "o.safetensors";
    ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) + tool + " forward --model-dir " +
                              f.string() + " --inputs " + (f / "inputs.safetensors").string() +
                              " --output " + o.string() + " " + degrees,
                          &log),
              0)
        << log;
    EXPECT_LE(xfuser::testing::max_rel_error(SafetensorsFile(o.string()).get("sample"), want), 1e-5)
        << degrees;
  }
}

TEST_F(Sd3Run, UnknownPipelineClassAndPlannedModelsAreClearErrors) {
  TempDir dir;
  std::ofstream(dir / "model_index.json") << R"({"_class_name": "KandinskyPipeline"})";
  std::string log;
  EXPECT_NE(run_command(bin_ + " --model_path " + dir.path().string() + " --prompt x", &log), 0);
  EXPECT_NE(log.find("pipeline class 'KandinskyPipeline' is not one xfuser runs"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("StableDiffusion3Pipeline"), std::string::npos) << log;
  // A registered model that is not downloaded: the Hugging Face cache lookup names the repo.
  EXPECT_NE(run_command(bin_ + " --model hunyuanvideo-1.5 --prompt x", &log), 0);
  EXPECT_NE(log.find("'hunyuanvideo-community/HunyuanVideo-1.5-720p_t2v' is not in the local "
                     "Hugging Face cache"),
            std::string::npos)
      << log;
  // Ids match case-insensitively.
  EXPECT_NE(run_command(bin_ + " --model sd3.5 --prompt x --height 1000 --output_directory " +
                            dir.path().string() + "/o",
                        &log),
            0);
  EXPECT_EQ(log.find("unknown model"), std::string::npos) << log;
}

}  // namespace
