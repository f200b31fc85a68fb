#include <fstream>

#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/weights/hub_cache.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::find_in_hub_cache;

class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"}) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      unsetenv(v);
    }
    if (const char* home = std::getenv("HOME")) saved_["HOME"] = home;
    setenv("HOME", (dir_ / "home").c_str(), 1);
  }
  void TearDown() override {
    for (const char* v :
         {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"}) {
      unsetenv(v);
    }
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  fs::path make_snapshot(const fs::path& root, const std::string& rev) {
    fs::path snap = root / "models--black-forest-labs--FLUX.1-dev" / "snapshots" / rev;
    fs::create_directories(snap);
    std::ofstream(snap / "model_index.json") << "{}";
    return snap;
  }
  xfuser::testing::TempDir dir_;
  std::map<std::string, std::string> saved_;
};

TEST_F(HubCache, FindsTheRefsMainSnapshotUnderHfHome) {
  setenv("HF_HOME", (dir_ / "hf").c_str(), 1);
  fs::path root = dir_ / "hf" / "hub";
  make_snapshot(root, "aaaa");
  fs::path want = make_snapshot(root, "bbbb");
  make_snapshot(root, "cccc");
  fs::create_directories(root / "models--black-forest-labs--FLUX.1-dev" / "refs");
  std::ofstream(root / "models--black-forest-labs--FLUX.1-dev" / "refs" / "main") << "bbbb\n";
  EXPECT_EQ(find_in_hub_cache("black-forest-labs/FLUX.1-dev"), want);
}

// A refs/main naming a missing snapshot is an error naming the ref and the
// snapshot; it used to fall back silently to another snapshot.
TEST_F(HubCache, ARefNamingAMissingSnapshotIsAnErrorNotAFallback) {
  setenv("HF_HOME", (dir_ / "hf").c_str(), 1);
  const fs::path repo = dir_ / "hf" / "hub" / "models--black-forest-labs--FLUX.1-dev";
  make_snapshot(dir_ / "hf" / "hub", "aaaa");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "bbbb\n";
  try {
    find_in_hub_cache("black-forest-labs/FLUX.1-dev");
    FAIL() << "fell back to another snapshot";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.message();
    EXPECT_NE(msg.find((repo / "refs" / "main").string() + " names commit bbbb"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find((repo / "snapshots" / "bbbb").string() + " is missing"), std::string::npos)
        << msg;
  }
}

TEST_F(HubCache, HubCacheVariableWinsOverHome) {
  fs::path home_snap = make_snapshot(dir_ / "home" / ".cache/huggingface/hub", "h1");
  EXPECT_EQ(find_in_hub_cache("black-forest-labs/FLUX.1-dev"), home_snap);
  setenv("HF_HUB_CACHE", (dir_ / "explicit").c_str(), 1);
  fs::path explicit_snap = make_snapshot(dir_ / "explicit", "e1");
  EXPECT_EQ(find_in_hub_cache("black-forest-labs/FLUX.1-dev"), explicit_snap);
}

TEST_F(HubCache, MissingModelSaysWhereItLookedAndHowToFix) {
  setenv("HF_HOME", (dir_ / "hf").c_str(), 1);
  try {
    find_in_hub_cache("black-forest-labs/FLUX.1-dev");
    FAIL();
  } catch (const xfuser::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find((dir_ / "hf" / "hub" / "models--black-forest-labs--FLUX.1-dev").string()),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find((dir_ / "home" / ".cache/huggingface/hub").string()), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("--model_path"), std::string::npos) << msg;
    EXPECT_NE(msg.find("never downloads"), std::string::npos) << msg;
  }
}

TEST_F(HubCache, RejectsMalformedRepoIds) {
  EXPECT_THROW(find_in_hub_cache("FLUX.1-dev"), xfuser::Error);
  EXPECT_THROW(find_in_hub_cache("a/b/c"), xfuser::Error);
  EXPECT_THROW(find_in_hub_cache("/x"), xfuser::Error);
}

TEST_F(HubCache, PipelineFolderChecks) {
  EXPECT_THROW(xfuser::models::check_pipeline_folder(dir_ / "nope"), xfuser::Error);
  fs::create_directories(dir_ / "empty");
  try {
    xfuser::models::check_pipeline_folder(dir_ / "empty");
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no model_index.json"), std::string::npos);
  }
}

}  // namespace
