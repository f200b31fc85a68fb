// NVTX ranges from Spans (profiling/trace.h), seen through a minimal NVTX tool
// (tests/nvtx_recorder.cpp) that the NVTX loader injects as nsys would: on by themselves under a
// tool, off with XFUSER_NVTX=0, named and nested as the spans are, and in a whole xfuser-run the
// stages, steps, blocks and attention calls. No GPU is needed: NVTX is host-side.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "profiling/trace.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::testing::run_command;

bool in_child() {
  const char* v = std::getenv("XFUSER_TEST_NVTX_CHILD");
  return v != nullptr && *v;
}

// The environment that injects the recording tool, logging to `log`.
std::string tool_env(const fs::path& log) {
  return "NVTX_INJECTION64_PATH=" + std::string(XFUSER_TEST_NVTX_RECORDER) +
         " XFUSER_TEST_NVTX_LOG=" + log.string() + " ";
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Push {
  std::string thread;
  int category = 0;
  std::string message;
};

// The pushes in order; checks that every thread pops exactly what it pushed.
std::vector<Push> pushes_of(const std::vector<std::string>& lines) {
  std::vector<Push> pushes;
  std::map<std::string, int> depth;
  for (const std::string& line : lines) {
    std::istringstream in(line);
    std::string kind, thread;
    in >> kind;
    if (kind == "push") {
      Push p;
      in >> p.thread >> p.category;
      std::getline(in >> std::ws, p.message);
      ++depth[p.thread];
      pushes.push_back(p);
    } else if (kind == "pop") {
      in >> thread;
      EXPECT_GT(depth[thread], 0) << "pop without a push on thread " << thread;
      --depth[thread];
    }
  }
  for (const auto& [thread, d] : depth)
    EXPECT_EQ(d, 0) << "thread " << thread << " left ranges open";
  return pushes;
}

// Runs this test program's NvtxChild.<name> in a child process with `env`.
int run_child(const std::string& env, const std::string& name) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  std::string out;
  const int rc = run_command(
      env + "XFUSER_TEST_NVTX_CHILD=1 " + self.string() + " --gtest_filter=NvtxChild." + name,
      &out);
  EXPECT_EQ(rc, 0) << out;
  return rc;
}

// --- What the children do (skipped unless spawned by the tests below) ---

TEST(NvtxChild, NestedSpans) {
  if (!in_child()) GTEST_SKIP() << "runs as the child of Nvtx.SpansPushNamedNestedRanges";
  ASSERT_TRUE(xfuser::profiling::nvtx_enabled()) << "on by itself under a tool";
  {
    XF_SPAN("stage", "decode");
    {
      xfuser::profiling::Span block("block", "transformer_block");
      XF_SPAN("my_category", "custom");
    }
    xfuser::profiling::set_nvtx(false);
    { XF_SPAN("stage", "while_off"); }
    xfuser::profiling::set_nvtx(true);
  }  // "decode" pushed while on: popped although the setting changed in between
  { XF_SPAN("comm", "all_reduce"); }
}

TEST(NvtxChild, OffByEnvironment) {
  if (!in_child()) GTEST_SKIP() << "runs as the child of Nvtx.OffWithXfuserNvtx0";
  ASSERT_FALSE(xfuser::profiling::nvtx_enabled());
  XF_SPAN("stage", "decode");
}

// --- The tests ---

TEST(Nvtx, SpansPushNamedNestedRanges) {
  ASSERT_TRUE(xfuser::profiling::nvtx_available());
  xfuser::testing::TempDir dir("xfuser-nvtx");
  const fs::path log = dir / "nvtx.log";
  ASSERT_EQ(run_child(tool_env(log), "NestedSpans"), 0);
  const std::vector<std::string> lines = read_lines(log);
  ASSERT_FALSE(lines.empty()) << "the tool was not loaded or saw no calls";
  EXPECT_EQ(lines.front(), "domain xfuser");
  for (const char* c : {"category 1 run", "category 2 stage", "category 3 step", "category 4 block",
                        "category 5 attention", "category 6 comm", "category 7 other"}) {
    EXPECT_NE(std::find(lines.begin(), lines.end(), c), lines.end()) << c << " not named";
  }
  const std::vector<Push> pushes = pushes_of(lines);
  ASSERT_EQ(pushes.size(), 4u);
  EXPECT_EQ(pushes[0].message, "decode");
  EXPECT_EQ(pushes[0].category, 2);
  EXPECT_EQ(pushes[1].message, "transformer_block");
  EXPECT_EQ(pushes[1].category, 4);
  EXPECT_EQ(pushes[2].message, "custom");
  EXPECT_EQ(pushes[2].category, 7);
  EXPECT_EQ(pushes[3].message, "all_reduce");
  EXPECT_EQ(pushes[3].category, 6);
  // Nesting: decode > transformer_block > custom, then all_reduce alone.
  std::vector<std::string> sequence;
  for (const std::string& line : lines) {
    if (line.rfind("push", 0) == 0) sequence.push_back(line.substr(line.rfind(' ') + 1));
    if (line.rfind("pop", 0) == 0) sequence.push_back("pop");
  }
  EXPECT_EQ(sequence, (std::vector<std::string>{"decode", "transformer_block", "custom", "pop",
                                                "pop", "pop", "all_reduce", "pop"}));
}

TEST(Nvtx, OffWithXfuserNvtx0) {
  xfuser::testing::TempDir dir("xfuser-nvtx");
  const fs::path log = dir / "nvtx.log";
  ASSERT_EQ(run_child(tool_env(log) + "XFUSER_NVTX=0 ", "OffByEnvironment"), 0);
  EXPECT_TRUE(pushes_of(read_lines(log)).empty());
}

TEST(Nvtx, AWholeRunMarksItsStagesStepsBlocksAndAttention) {
  xfuser::testing::TempDir dir("xfuser-nvtx");
  const fs::path log = dir / "nvtx.log";
  std::string out;
  ASSERT_EQ(run_command(tool_env(log) + "XFUSER_CACHE=" + (dir / "cache").string() + " " +
                            (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string() +
                            " --model tiny-flux --prompt x --height 32 --width 32 "
                            "--num_inference_steps 2 --output_directory " +
                            (dir / "out").string(),
                        &out),
            0)
      << out;
  std::map<std::string, int> count;
  for (const Push& p : pushes_of(read_lines(log))) ++count[p.message];
  for (const char* name : {"generate", "encode_prompt", "prepare_latents", "decode"}) {
    EXPECT_GE(count[name], 1) << name;
  }
  EXPECT_EQ(count["denoise_step"], 2);
  EXPECT_GE(count["transformer_block"], 2);
  EXPECT_GE(count["single_transformer_block"], 2);
  EXPECT_GE(count["attention"], count["transformer_block"] + count["single_transformer_block"]);
}

}  // namespace
