// A launch across two hosts, simulated on this machine (scripts/two-hosts-mpirun.sh: two network
// namespaces with their own host names, Open MPI over TCP between them, an rsh agent that enters
// the second one): xfuser-run with Ulysses 2 x data parallel 2 and FSDP on 2 + 2 ranks writes the
// images of the same run on one host, and every rank's report lays the groups out as planned:
// Ulysses and FSDP within a host, data parallel across. Then hybrid FSDP (--hybrid_fsdp): a
// generation group over both hosts sharded within each. Skipped where namespaces cannot be made
// (not root, or no CAP_NET_ADMIN / CAP_SYS_ADMIN).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// xfuser-run `args` on two simulated hosts of `ranks_per_host` ranks each; exit code 77: skip.
int run_on_two_hosts(int ranks_per_host, const std::string& args, std::string* log) {
  const fs::path repo = xfuser::testing::source_dir();
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  return xfuser::testing::run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 240 " +
          (repo / "scripts" / "two-hosts-mpirun.sh").string() + " " +
          std::to_string(ranks_per_host) +
          " -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 -x XFUSER_CACHE " + bin + args,
      log);
}

TEST(TwoHosts, UlyssesAndFsdpStayWithinAHostAndTheImagesEqualOneHost) {
  xfuser::testing::TempDir cache, one, two;
  setenv("XFUSER_CACHE", cache.path().c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const std::string args =
      " --model tiny-flux --prompt 'a cat' --prompt 'an owl at night' --height 64 --width 48 "
      "--num_inference_steps 2 --dtype fp32 --max_sequence_length 8 --ulysses_degree 2 "
      "--data_parallel_degree 2 --use_fsdp";
  std::string log;
  const int code = run_on_two_hosts(2, args + " --output_directory " + two.path().string(), &log);
  if (code == 77) GTEST_SKIP() << log;
  ASSERT_EQ(code, 0) << log;
  ASSERT_EQ(xfuser::testing::run_command(xfuser::testing::mpirun_prefix(4) + bin + args +
                                             " --output_directory " + one.path().string(),
                                         &log),
            0)
      << log;
  for (int i = 0; i < 2; ++i) {
    const std::string name = "tiny-flux_u2r1_dp2_tc_False_64x48_" + std::to_string(i) + ".png";
    ASSERT_TRUE(fs::exists(two / name)) << name;
    EXPECT_LE(xfuser::testing::max_pixel_diff(two / name, one / name), 1) << name;
  }
  // Ranks 0, 1 on the first host and 2, 3 on the second; each FSDP and Ulysses group on one
  // host, the data-parallel groups across both.
  std::string first;
  for (int r = 0; r < 4; ++r) {
    const auto report = read_json(two / ("timings_rank" + std::to_string(r) + ".json"));
    const auto& layout = report["layout"];
    ASSERT_EQ(layout["hosts"].size(), 4u) << layout.dump();
    if (r == 0) first = layout["hosts"][0];
    EXPECT_EQ(layout["hosts"][0], layout["hosts"][1]) << layout.dump();
    EXPECT_EQ(layout["hosts"][2], layout["hosts"][3]) << layout.dump();
    EXPECT_NE(layout["hosts"][0], layout["hosts"][2]) << layout.dump();
    const auto& groups = layout["groups"];
    const std::string pair = r < 2 ? "[0,1]" : "[2,3]";
    for (const std::string g : {"fsdp", "ulysses"}) {
      ASSERT_TRUE(groups.contains(g + pair)) << groups.dump();
      EXPECT_EQ(groups[g + pair][0], groups[g + pair][1]) << g;
    }
    const std::string dp = r % 2 == 0 ? "dp[0,2]" : "dp[1,3]";
    ASSERT_TRUE(groups.contains(dp)) << groups.dump();
    EXPECT_NE(groups[dp][0], groups[dp][1]);
    EXPECT_EQ(report["memory"]["fsdp"]["group"], "fsdp" + pair);
  }
  EXPECT_NE(first, "");
}

// Hybrid sharding: one generation group over both hosts (Ulysses 4), FSDP narrowed to each host
// ([0,1] and [2,3]) and replicated across them; the images equal the one-host run with the group
// sharded whole. With one rank of the group per host there is nothing to shard: every rank
// fails with the same error, before loading.
TEST(TwoHosts, HybridFsdpShardsWithinEachHost) {
  xfuser::testing::TempDir cache, one, two, alone;
  setenv("XFUSER_CACHE", cache.path().c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const std::string args =
      " --model tiny-flux --prompt 'a cat' --height 64 --width 48 --num_inference_steps 2 "
      "--dtype fp32 --max_sequence_length 8 --ulysses_degree 4 --use_fsdp";
  std::string log;
  const int code =
      run_on_two_hosts(2, args + " --hybrid_fsdp --output_directory " + two.path().string(), &log);
  if (code == 77) GTEST_SKIP() << log;
  ASSERT_EQ(code, 0) << log;
  ASSERT_EQ(xfuser::testing::run_command(xfuser::testing::mpirun_prefix(4) + bin + args +
                                             " --output_directory " + one.path().string(),
                                         &log),
            0)
      << log;
  const std::string name = "tiny-flux_u4r1_tc_False_64x48_0.png";
  ASSERT_TRUE(fs::exists(two / name)) << name;
  EXPECT_LE(xfuser::testing::max_pixel_diff(two / name, one / name), 1) << name;
  for (int r = 0; r < 4; ++r) {
    const auto report = read_json(two / ("timings_rank" + std::to_string(r) + ".json"));
    const std::string pair = r < 2 ? "[0,1]" : "[2,3]";
    EXPECT_EQ(report["memory"]["fsdp"]["group"], "fsdp" + pair);
    EXPECT_EQ(report["memory"]["fsdp"]["group_size"], 2);
    EXPECT_TRUE(report["config"]["hybrid_fsdp"].get<bool>());
    const auto& groups = report["layout"]["groups"];
    ASSERT_TRUE(groups.contains("fsdp" + pair)) << groups.dump();
    EXPECT_EQ(groups["fsdp" + pair][0], groups["fsdp" + pair][1]);
  }
  const auto whole = read_json(one / "timings_rank0.json");
  EXPECT_EQ(whole["memory"]["fsdp"]["group"], "fsdp[0,1,2,3]");

  EXPECT_NE(run_on_two_hosts(1,
                             " --model tiny-flux --prompt 'a cat' --height 64 --width 48 "
                             "--num_inference_steps 2 --dtype fp32 --ulysses_degree 2 --use_fsdp "
                             "--hybrid_fsdp --output_directory " +
                                 alone.path().string(),
                             &log),
            0)
      << log;
  EXPECT_NE(log.find("is the only rank of its generation group on host"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
}

}  // namespace
