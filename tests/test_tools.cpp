#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/registry.h"
#include "runner/tool/commands.h"

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

}  // namespace
