// FLUX.1-Kontext against diffusers 0.35.2's FluxKontextPipeline (tests/fixtures/pipelines/
// kontext-tiny): the reference picture auto-resized to the preferred 1456x720, VAE-encoded (a
// ~1 MP encode: why this is not a unit test), its tokens joined to the generated ones; one and two
// prompts, distilled guidance and true CFG; and the run from a picture file under xfuser-run,
// serially and with Ulysses 2, CFG 2 and PipeFusion 2 (with CFG 2 on 4 ranks).
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

TEST(Kontext, FinalLatentsEqualDiffusers) { xfuser::testing::check_pipeline("kontext-tiny"); }

TEST(Kontext, XfuserRunFromAPictureEqualsDiffusersUnderUlyssesAndCfg) {
  setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  const fs::path pipelines = xfuser::testing::fixtures_dir() / "pipelines";
  const fs::path ref = pipelines / "kontext-tiny.ref" / "true_cfg_batch2";
  XF_REQUIRE_FIXTURE(ref);
  std::ifstream in(ref / "case.json");
  const auto c = nlohmann::json::parse(in);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  std::string cmd = bin + " --model_path " + (pipelines / "kontext-tiny").string();
  for (size_t i = 0; i < 2; ++i) {
    cmd += " --prompt '" + c["prompt"][i].get<std::string>() + "' --negative_prompt '" +
           c["negative_prompt"][i].get<std::string>() + "'";
  }
  cmd += " --input_images " + (ref / "input.png").string() +
         " --height 48 --width 80 --num_inference_steps 3 --guidance_scale 2.5" +
         " --true_cfg_scale 2 --max_sequence_length 32 --dtype fp32 --save_latents --latents " +
         (ref / "latents.safetensors").string() + " --output_directory ";
  const at::Tensor want = SafetensorsFile((ref / "final.safetensors").string()).get("latents");
  struct Layout {
    int np;
    std::string flags, name;
  };
  for (const auto& l : std::vector<Layout>{
           {1, "", "FLUX.1-Kontext-dev_u1r1_tc_False_48x80_"},
           {2, "--ulysses_degree 2", "FLUX.1-Kontext-dev_u2r1_tc_False_48x80_"},
           {2, "--use_cfg_parallel", "FLUX.1-Kontext-dev_u1r1_cfg2_tc_False_48x80_"},
           // The picture encoded (and the result decoded) in bands over the two ranks.
           {2, "--ulysses_degree 2 --use_parallel_vae", "FLUX.1-Kontext-dev_u2r1_tc_False_48x80_"},
           // PipeFusion: the picture's tokens travel with every patch; warm-up through every
           // step is exact.
           {2, "--pipefusion_parallel_degree 2 --pipefusion_warmup_steps 3",
            "FLUX.1-Kontext-dev_u1r1_pp2_tc_False_48x80_"},
           {4, "--pipefusion_parallel_degree 2 --use_cfg_parallel --pipefusion_warmup_steps 3",
            "FLUX.1-Kontext-dev_u1r1_pp2_cfg2_tc_False_48x80_"}}) {
    SCOPED_TRACE(l.flags);
    TempDir out;
    std::string log;
    const std::string prefix = l.np > 1 ? xfuser::testing::mpirun_prefix(l.np) : "";
    ASSERT_EQ(run_command(prefix + cmd + out.path().string() + " " + l.flags, &log), 0) << log;
    for (int64_t i = 0; i < 2; ++i) {
      const fs::path saved = out / (l.name + std::to_string(i) + ".latents.safetensors");
      ASSERT_TRUE(fs::exists(saved)) << log;
      EXPECT_LE(xfuser::testing::max_rel_error(SafetensorsFile(saved.string()).get("final_latents"),
                                               want.narrow(0, i, 1)),
                1e-4);
    }
  }
  // PipeFusion with one warm-up step: the stale K/V of the later patches (of the generated
  // tokens only: the picture's are fresh in every patch) move the result; measured, not hidden.
  {
    TempDir out;
    std::string log;
    ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) + cmd + out.path().string() +
                              " --pipefusion_parallel_degree 2 --pipefusion_warmup_steps 1",
                          &log),
              0)
        << log;
    const at::Tensor got =
        SafetensorsFile(
            (out / "FLUX.1-Kontext-dev_u1r1_pp2_tc_False_48x80_0.latents.safetensors").string())
            .get("final_latents");
    const double rel = xfuser::testing::max_rel_error(got, want.narrow(0, 0, 1));
    std::printf("Kontext PipeFusion 2, warm-up 1 of 3: vs diffusers %.2e (staleness)\n", rel);
    EXPECT_TRUE(at::isfinite(got).all().item<bool>());
    EXPECT_GT(rel, 1e-6);  // stale K/V do change the result: the patches really overlap in time
    EXPECT_LT(rel, 0.5);
  }
  // A picture is required.
  std::string log;
  TempDir out;
  EXPECT_NE(run_command(bin + " --model_path " + (pipelines / "kontext-tiny").string() +
                            " --prompt x --output_directory " + out.path().string(),
                        &log),
            0);
  EXPECT_NE(log.find("edits a picture: give it as one --input_images (got 0)"), std::string::npos)
      << log;
}

TEST(Kontext, MakeTinyLayoutRunsAsKontext) {
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const fs::path picture =
      xfuser::testing::fixtures_dir() / "pipelines" / "kontext-tiny.ref" / "guidance" / "input.png";
  XF_REQUIRE_FIXTURE(picture);
  TempDir dir;
  std::string log;
  ASSERT_EQ(
      run_command(tool + " make-tiny --arch flux-kontext --out " + (dir / "pipe").string(), &log),
      0)
      << log;
  ASSERT_EQ(
      run_command(bin + " --model_path " + (dir / "pipe").string() +
                      " --prompt 'make it blue' --input_images " + picture.string() +
                      " --height 32 --width 64 --num_inference_steps 2 --dtype fp32" +
                      " --max_sequence_length 16 --output_directory " + (dir / "out").string(),
                  &log),
      0)
      << log;
  EXPECT_TRUE(fs::exists(dir / "out" / "FLUX.1-Kontext-dev_u1r1_tc_False_32x64_0.png")) << log;
}

}  // namespace
