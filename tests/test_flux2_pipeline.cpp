// Flux2Pipeline (FLUX.2-dev): the programmatic API ends on diffusers 0.36.0's final latents (and
// decoded image) for text to image, two prompts (one padded, one truncated), editing with one and
// with two input pictures; xfuser-run on the diffusers-made folder (--model_path alone picks
// FLUX.2-dev) writes the PNG at the first picture's size; every parallel layout on 2 and 4 ranks
// (Ulysses, ring, USP, tensor, data) ends on the serial latents, with and without pictures;
// PipeFusion (alone and with Ulysses) is exact with warm-up through every step, pictures or not,
// and its staleness with one warm-up step is measured.
#include <algorithm>
#include <fstream>
#include <map>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/weights/safetensors.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::mpirun_prefix;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

TEST(Flux2Pipeline, FinalLatentsEqualDiffusers) { xfuser::testing::check_pipeline("flux2-tiny"); }

class Flux2Run : public ::testing::Test {
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
  // The case's command line from diffusers' initial latents; `size` false leaves --height /
  // --width to the first picture.
  std::string command(const std::string& case_name, const std::string& out,
                      const std::string& extra = "", bool size = true) const {
    const auto c = read_case(case_name);
    std::string cmd = bin_ + " --model_path " + (pipelines_ / "flux2-tiny").string() + " --prompt";
    if (c["prompt"].is_string()) {
      cmd += " " + quoted(c["prompt"].get<std::string>());
    } else {
      for (const auto& p : c["prompt"]) cmd += " " + quoted(p.get<std::string>());
    }
    if (c.contains("input_images")) {
      cmd += " --input_images";
      for (const auto& f : c["input_images"]) {
        cmd += " " + (refs_ / case_name / f.get<std::string>()).string();
      }
    }
    if (size) {
      cmd += " --height " + std::to_string(c["height"].get<int>()) + " --width " +
             std::to_string(c["width"].get<int>());
    }
    return cmd + " --num_inference_steps " + std::to_string(c["num_inference_steps"].get<int>()) +
           " --guidance_scale " + std::to_string(c["guidance_scale"].get<double>()) +
           " --max_sequence_length " + std::to_string(c["max_sequence_length"].get<int>()) +
           " --dtype fp32 --latents " + (refs_ / case_name / "latents.safetensors").string() +
           " --save_latents --output_directory " + out + " " + extra;
  }
  static at::Tensor final_latents(const fs::path& dir, const std::string& name) {
    return SafetensorsFile((dir / (name + ".latents.safetensors")).string()).get("final_latents");
  }
  at::Tensor diffusers_final(const std::string& case_name) const {
    return SafetensorsFile((refs_ / case_name / "final.safetensors").string()).get("latents");
  }

  const std::string bin_ = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path pipelines_ = xfuser::testing::fixtures_dir() / "pipelines";
  const fs::path refs_ = pipelines_ / "flux2-tiny.ref";
};

TEST_F(Flux2Run, ModelPathWithPicturesEndsOnDiffusersAtThePicturesSize) {
  // edit1's picture is 64x96: with no --height / --width the output takes its size.
  TempDir out;
  std::string log;
  ASSERT_EQ(run_command(command("edit1", out.path().string(), "", /*size=*/false), &log), 0) << log;
  const std::string name = "FLUX.2-dev_u1r1_tc_False_64x96_0";
  ASSERT_TRUE(fs::exists(out / (name + ".png"))) << log;
  const double rel =
      xfuser::testing::max_rel_error(final_latents(out.path(), name), diffusers_final("edit1"));
  std::printf("xfuser-run edit1 vs diffusers final latents: %.2e\n", rel);
  EXPECT_LE(rel, 1e-4);
  const at::Tensor png = xfuser::runner::read_png(out / (name + ".png")).to(at::kInt);
  const at::Tensor want =
      (SafetensorsFile((refs_ / "edit1" / "image.safetensors").string()).get("image")[0] * 255)
          .round()
          .to(at::kInt);
  ASSERT_EQ(png.sizes(), want.sizes());
  EXPECT_LE((png - want).abs().max().item<int>(), 1);
}

TEST_F(Flux2Run, EveryParallelLayoutEndsOnTheSerialLatents) {
  struct Layout {
    int np;
    std::string flags, tag;
  };
  const std::vector<Layout> layouts = {
      {2, "--ulysses_degree 2", "u2r1"},
      {2, "--ring_degree 2", "u1r2"},
      {2, "--tensor_parallel_degree 2", "u1r1_tp2"},
      {4, "--ulysses_degree 2 --ring_degree 2", "u2r2"},
  };
  // Two prompts (batch 2), and one prompt with one and with two pictures (their tokens sharded
  // with the generated ones).
  for (const std::string case_name : {"batch2", "edit1", "edit2"}) {
    SCOPED_TRACE(case_name);
    TempDir serial;
    std::string log;
    ASSERT_EQ(run_command(command(case_name, serial.path().string()), &log), 0) << log;
    const int batch = case_name == "batch2" ? 2 : 1;
    const std::string base = "FLUX.2-dev_u1r1_tc_False_64x96_";
    std::vector<at::Tensor> want;
    for (int i = 0; i < batch; ++i)
      want.push_back(final_latents(serial.path(), base + std::to_string(i)));
    EXPECT_LE(xfuser::testing::max_rel_error(at::cat(want, 0), diffusers_final(case_name)), 1e-4);
    auto all = layouts;
    if (batch == 2) all.push_back({2, "--data_parallel_degree 2", "u1r1_dp2"});
    for (const auto& l : all) {
      SCOPED_TRACE(l.flags);
      TempDir out;
      ASSERT_EQ(
          run_command(mpirun_prefix(l.np) + command(case_name, out.path().string(), l.flags), &log),
          0)
          << log;
      double rel = 0;
      for (int i = 0; i < batch; ++i) {
        rel =
            std::max(rel, xfuser::testing::max_rel_error(
                              final_latents(out.path(), "FLUX.2-dev_" + l.tag + "_tc_False_64x96_" +
                                                            std::to_string(i)),
                              want[static_cast<size_t>(i)]));
      }
      std::printf("[flux2 run] %-6s %-40s vs serial %.2e\n", case_name.c_str(), l.flags.c_str(),
                  rel);
      EXPECT_LE(rel, 1e-5);
    }
  }
}

TEST_F(Flux2Run, PipeFusionIsExactWithFullWarmupWithAndWithoutPictures) {
  // The pictures' tokens travel with every patch (never split, never cached); with warm-up
  // through every step the result is the serial one.
  struct Layout {
    std::string case_name;
    int np;
    std::string flags, tag;
  };
  const std::string full = " --pipefusion_warmup_steps 3";
  const std::vector<Layout> layouts = {
      {"t2i", 2, "--pipefusion_parallel_degree 2" + full, "u1r1_pp2"},
      {"edit1", 2, "--pipefusion_parallel_degree 2" + full, "u1r1_pp2"},
      {"edit2", 2, "--pipefusion_parallel_degree 2" + full, "u1r1_pp2"},
      {"edit2", 4, "--pipefusion_parallel_degree 2 --ulysses_degree 2" + full, "u2r1_pp2"},
  };
  std::map<std::string, at::Tensor> serial;
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.case_name + " " + l.flags);
    std::string log;
    if (!serial.count(l.case_name)) {
      TempDir dir;
      ASSERT_EQ(run_command(command(l.case_name, dir.path().string()), &log), 0) << log;
      serial[l.case_name] = final_latents(dir.path(), "FLUX.2-dev_u1r1_tc_False_64x96_0");
    }
    TempDir pp;
    ASSERT_EQ(
        run_command(mpirun_prefix(l.np) + command(l.case_name, pp.path().string(), l.flags), &log),
        0)
        << log;
    const double rel = xfuser::testing::max_rel_error(
        final_latents(pp.path(), "FLUX.2-dev_" + l.tag + "_tc_False_64x96_0"), serial[l.case_name]);
    std::printf("[flux2 run] %-6s %-56s vs serial %.2e\n", l.case_name.c_str(), l.flags.c_str(),
                rel);
    EXPECT_LE(rel, 1e-5);
  }
  // One warm-up step: the later steps attend stale K/V of the other patch (the pictures' K/V
  // stay fresh): measured, not hidden.
  TempDir stale;
  std::string log;
  ASSERT_EQ(run_command(mpirun_prefix(2) + command("edit2", stale.path().string(),
                                                   "--pipefusion_parallel_degree 2 "
                                                   "--pipefusion_warmup_steps 1"),
                        &log),
            0)
      << log;
  const at::Tensor got = final_latents(stale.path(), "FLUX.2-dev_u1r1_pp2_tc_False_64x96_0");
  const double rel = xfuser::testing::max_rel_error(got, serial["edit2"]);
  std::printf("[flux2 run] edit2  PipeFusion 2, warm-up 1 of 3: vs serial %.2e (staleness)\n", rel);
  EXPECT_TRUE(at::isfinite(got).all().item<bool>());
  EXPECT_GT(rel, 1e-6);  // the patches really ran on stale K/V
  EXPECT_LT(rel, 0.5);
}

TEST_F(Flux2Run, ParallelVaeEncodesAndDecodesAsOneRank) {
  // --use_parallel_vae: the pictures encoded and the result decoded in bands of rows over the two
  // ranks of the Ulysses group.
  for (const std::string case_name : {"t2i", "edit2"}) {
    SCOPED_TRACE(case_name);
    TempDir serial, par;
    std::string log;
    ASSERT_EQ(run_command(command(case_name, serial.path().string()), &log), 0) << log;
    ASSERT_EQ(run_command(mpirun_prefix(2) + command(case_name, par.path().string(),
                                                     "--ulysses_degree 2 --use_parallel_vae"),
                          &log),
              0)
        << log;
    const double rel = xfuser::testing::max_rel_error(
        final_latents(par.path(), "FLUX.2-dev_u2r1_tc_False_64x96_0"),
        final_latents(serial.path(), "FLUX.2-dev_u1r1_tc_False_64x96_0"));
    const at::Tensor want =
        xfuser::runner::read_png(serial / "FLUX.2-dev_u1r1_tc_False_64x96_0.png").to(at::kInt);
    const at::Tensor got =
        xfuser::runner::read_png(par / "FLUX.2-dev_u2r1_tc_False_64x96_0.png").to(at::kInt);
    ASSERT_EQ(got.sizes(), want.sizes());
    const int diff = (got - want).abs().max().item<int>();
    std::printf(
        "[flux2 run] %-6s --use_parallel_vae on 2 ranks vs serial: latents %.2e, PNG max "
        "%d levels\n",
        case_name.c_str(), rel, diff);
    EXPECT_LE(rel, 1e-5);
    EXPECT_LE(diff, 1);
  }
}

TEST_F(Flux2Run, ValidateChecksTheFolderWithoutRunning) {
  // Every component of the Flux2Pipeline folder, the tokenizer.json-only processor included.
  const std::string xfuser = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  std::string log;
  ASSERT_EQ(run_command(xfuser + " validate --model_path " + (pipelines_ / "flux2-tiny").string() +
                            " --prompt x --height 64 --width 96 --world_size 4 --ulysses_degree 2 "
                            "--ring_degree 2",
                        &log),
            0)
      << log;
  EXPECT_NE(log.find("tokenizer: ok"), std::string::npos) << log;
  EXPECT_NE(log.find("vae: ok (AutoencoderKLFlux2"), std::string::npos) << log;
  EXPECT_NE(log.find("transformer: ok (Flux2Transformer2DModel"), std::string::npos) << log;
  EXPECT_NE(log.find("valid"), std::string::npos) << log;
}

TEST_F(Flux2Run, MakeTinyFolderAndEmbeddedTinyFlux2Run) {
  // `xfuser make-tiny --arch flux2` writes a Flux2Pipeline folder that --model_path alone runs as
  // FLUX.2-dev (here editing a picture); the embedded tiny-flux2 runs with its defaults.
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  TempDir dir;
  std::string log;
  ASSERT_EQ(run_command(tool + " make-tiny --arch flux2 --out " + (dir / "pipe").string(), &log), 0)
      << log;
  ASSERT_EQ(
      run_command(bin_ + " --model_path " + (dir / "pipe").string() +
                      " --prompt 'make it blue' --input_images " +
                      (refs_ / "edit1" / "input_0.png").string() +
                      " --num_inference_steps 2 --max_sequence_length 32 --output_directory " +
                      (dir / "out").string(),
                  &log),
      0)
      << log;
  EXPECT_TRUE(fs::exists(dir / "out" / "FLUX.2-dev_u1r1_tc_False_64x96_0.png")) << log;
  ASSERT_EQ(run_command(bin_ + " --model tiny-flux2 --prompt 'a red cube' --output_directory " +
                            (dir / "tiny").string(),
                        &log),
            0)
      << log;
  const fs::path png = dir / "tiny" / "tiny-flux2_u1r1_tc_False_128x128_0.png";
  ASSERT_TRUE(fs::exists(png)) << log;
  EXPECT_EQ(xfuser::runner::read_png(png).sizes(), (std::vector<int64_t>{128, 128, 3}));
}

TEST_F(Flux2Run, BadInputsAreNamed) {
  TempDir out;
  std::string log;
  // A picture below FLUX.2's 64-pixel minimum side.
  const fs::path small = out / "small.png";
  xfuser::runner::write_png(small, at::zeros({48, 96, 3}, at::kByte));
  EXPECT_NE(
      run_command(command("t2i", out.path().string(), "--input_images " + small.string()), &log),
      0);
  EXPECT_NE(log.find("too small for FLUX.2"), std::string::npos) << log;
  // No true CFG.
  EXPECT_NE(run_command(command("t2i", out.path().string(), "--negative_prompt blurry"), &log), 0);
  EXPECT_NE(log.find("--negative_prompt is not supported by model FLUX.2-dev"), std::string::npos)
      << log;
}

}  // namespace
