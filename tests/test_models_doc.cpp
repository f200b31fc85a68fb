// docs/models.md is generated from the registry; this fails when the checked-in page is stale.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "models/registry.h"
#include "runner/tool/commands.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelsDoc, CheckedInPageMatchesTheRegistry) {
  const fs::path page = xfuser::testing::source_dir() / "docs" / "models.md";
  ASSERT_TRUE(fs::exists(page)) << page << " is missing: generate it with "
                                << "`cmake --build build --target docs-models`";
  EXPECT_TRUE(slurp(page) == xfuser::runner::tool::models_doc())
      << "docs/models.md is stale (the model registry changed): regenerate it with\n"
      << "  cmake --build build --target docs-models\n"
      << "and commit the result.";
}

TEST(ModelsDoc, EveryModelHasARowAndASection) {
  const std::string doc = xfuser::runner::tool::models_doc();
  for (const auto& spec : xfuser::models::ModelRegistry::all()) {
    EXPECT_NE(doc.find("\n| " + spec.id + " |"), std::string::npos) << spec.id;
    EXPECT_NE(doc.find("\n## " + spec.id + "\n"), std::string::npos) << spec.id;
  }
}

TEST(ModelsDoc, TheToolWritesThePage) {
  xfuser::testing::TempDir dir;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(
                (xfuser::testing::binary_dir() / "bin" / "xfuser").string() +
                    " models --format doc --output " + (dir / "models.md").string(),
                &log),
            0)
      << log;
  EXPECT_TRUE(slurp(dir / "models.md") == xfuser::runner::tool::models_doc());
}

}  // namespace
