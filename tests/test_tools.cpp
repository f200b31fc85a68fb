#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/registry.h"
#include "runner/outputs.h"
#include "runner/tool/commands.h"
#include "tests/test_util.h"

namespace {

TEST(ModelsTool, JsonListsEveryRegisteredModelWithDefaults) {
  auto j = nlohmann::json::parse(xfuser::runner::tool::models_listing("json"));
  ASSERT_EQ(j.size(), xfuser::models::ModelRegistry::all().size());
  bool found = false;
  for (const auto& m : j) {
    if (m["id"] != "FLUX.1-dev") continue;
    found = true;
    EXPECT_EQ(m["aliases"][0], "black-forest-labs/FLUX.1-dev");
    EXPECT_EQ(m["task"], "text-to-image");
    EXPECT_EQ(m["defaults"]["height"], 1024);
    EXPECT_EQ(m["defaults"]["num_inference_steps"], 50);
    EXPECT_EQ(m["defaults"]["guidance_scale"], 3.5);
    EXPECT_EQ(m["defaults"]["max_sequence_length"], 512);
  }
  EXPECT_TRUE(found);
}

TEST(ModelsTool, MarkdownHasOneRowPerModel) {
  std::string md = xfuser::runner::tool::models_listing("markdown");
  size_t rows = 0;
  for (size_t p = md.find('\n'); p != std::string::npos; p = md.find('\n', p + 1)) ++rows;
  EXPECT_EQ(rows, 2 + xfuser::models::ModelRegistry::all().size());
}

TEST(Registry, FindsIdsAndAliasesAndListsKnownOnMiss) {
  EXPECT_EQ(xfuser::models::ModelRegistry::find("black-forest-labs/FLUX.1-dev").id, "FLUX.1-dev");
  try {
    xfuser::models::ModelRegistry::find("FLUX.9");
    FAIL();
  } catch (const xfuser::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown model 'FLUX.9'"), std::string::npos);
    EXPECT_NE(msg.find("FLUX.1-dev, black-forest-labs/FLUX.1-dev"), std::string::npos) << msg;
  }
}

TEST(CompareTool, PsnrAndLargestDifferenceOfTwoPictures) {
  using xfuser::testing::binary_dir;
  using xfuser::testing::run_command;
  xfuser::testing::TempDir dir;
  const at::Tensor a = at::arange(8 * 6 * 3, at::kInt).remainder(256).to(at::kByte).view({8, 6, 3});
  at::Tensor b = a.clone();
  b[2][3][1] = static_cast<uint8_t>(a[2][3][1].item<int>() + 3);
  xfuser::runner::write_png(dir / "a.png", a, {});
  xfuser::runner::write_png(dir / "b.png", b, {});
  xfuser::runner::write_png(dir / "small.png", a.narrow(0, 0, 4).contiguous(), {});
  const std::string tool = (binary_dir() / "bin" / "xfuser").string();
  std::string out;
  ASSERT_EQ(run_command(tool + " compare " + (dir / "a.png").string() + " " +
                            (dir / "a.png").string() + " --json",
                        &out),
            0)
      << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["psnr_db"].is_null());  // equal: +inf
  EXPECT_EQ(j["max_diff"], 0);
  ASSERT_EQ(run_command(tool + " compare " + (dir / "b.png").string() + " " +
                            (dir / "a.png").string() + " --json",
                        &out),
            0)
      << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["max_diff"], 3);
  const double want = 10 * std::log10(255.0 * 255.0 / (9.0 / (8 * 6 * 3)));
  EXPECT_NEAR(j["psnr_db"].get<double>(), want, 1e-6);
  EXPECT_NE(
      run_command(
          tool + " compare " + (dir / "small.png").string() + " " + (dir / "a.png").string(), &out),
      0);
  EXPECT_NE(out.find("the sizes differ"), std::string::npos) << out;
}

}  // namespace
