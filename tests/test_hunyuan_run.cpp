// `xfuser forward` on HunyuanVideoTransformer3DModel under mpirun (2 ranks): tensor parallel 2
// equals the diffusers fixtures; Ulysses 2 and ring 2 equal the one-rank tool when the text stays
// whole (11 tokens over 2 ranks), and exit non-zero naming the problem when the drivers would
// split the text (12 tokens), which the token refiner cannot embed.
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_tensors;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

fs::path fixture_case(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::string forward_command(const fs::path& model, const fs::path& inputs, const fs::path& out) {
  const fs::path tool = xfuser::testing::binary_dir() / "bin" / "xfuser";
  return q(tool) + " forward --model-dir " + q(model) + " --inputs " + q(inputs) + " --output " +
         q(out) + " --dtype fp32";
}

TEST(HunyuanRun, TensorParallelUnderMpirunEqualsTheFixtures) {
  TempDir tmp("xfuser-hunyuan-run");
  for (const std::string name : {"hunyuan_video-tiny-s1", "hunyuan_video-masked-s1"}) {
    SCOPED_TRACE(name);
    const fs::path f = fixture_case(name);
    XF_REQUIRE_FIXTURE(f);
    const fs::path o = tmp / (name + ".safetensors");
    std::string log;
    ASSERT_EQ(run_command(xfuser::testing::mpirun_prefix(2) +
                              forward_command(f, f / "inputs.safetensors", o) +
                              " --tensor_parallel_degree 2",
                          &log),
              0)
        << log;
    const auto want = SafetensorsFile((f / "output.safetensors").string()).get("sample");
    const double err = max_rel_error(SafetensorsFile(o.string()).get("sample"), want);
    std::cout << "[ xfuser forward tp 2 " << name << " ] max rel error " << err << std::endl;
    EXPECT_LE(err, 1e-4);
  }
}

TEST(HunyuanRun, SequenceParallelUnderMpirunWithTheTextWhole) {
  const fs::path f = fixture_case("hunyuan_video-tiny-s1");
  XF_REQUIRE_FIXTURE(f);
  TempDir tmp("xfuser-hunyuan-run");
  // 11 of the 12 text tokens: kept whole on both ranks.
  auto inputs = read_tensors(f / "inputs.safetensors");
  inputs["encoder_hidden_states"] = inputs["encoder_hidden_states"].narrow(1, 0, 11).contiguous();
  inputs["encoder_attention_mask"] = inputs["encoder_attention_mask"].narrow(1, 0, 11).contiguous();
  const fs::path in11 = tmp / "inputs11.safetensors";
  xfuser::models::save_safetensors(in11.string(), {inputs.begin(), inputs.end()});
  std::string log;
  const fs::path one = tmp / "one.safetensors";
  ASSERT_EQ(run_command(forward_command(f, in11, one), &log), 0) << log;
  const auto want = SafetensorsFile(one.string()).get("sample");
  for (const std::string degrees : {"--ulysses_degree 2", "--ring_degree 2"}) {
    SCOPED_TRACE(degrees);
    const fs::path o = tmp / "o.safetensors";
    ASSERT_EQ(
        run_command(xfuser::testing::mpirun_prefix(2) + forward_command(f, in11, o) + " " + degrees,
                    &log),
        0)
        << log;
    const double err = max_rel_error(SafetensorsFile(o.string()).get("sample"), want);
    std::cout << "[ xfuser forward " << degrees << ", 11 text tokens ] max rel error vs one rank "
              << err << std::endl;
    EXPECT_LE(err, 1e-5);
    // The fixture's 12 tokens would be split over the ranks: a clear error, no output.
    const fs::path bad = tmp / "bad.safetensors";
    EXPECT_NE(run_command(xfuser::testing::mpirun_prefix(2) +
                              forward_command(f, f / "inputs.safetensors", bad) + " " + degrees,
                          &log),
              0);
    EXPECT_NE(log.find("needs the whole text"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(bad));
  }
}

}  // namespace
