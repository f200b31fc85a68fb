// xfuser-run --profile (one rank, and two under mpirun) writes per-rank Chrome traces with
// stages, steps, blocks, attention, collectives with bytes and libtorch op events, and nothing
// else; `xfuser trace merge` joins them on the common clock.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

class ProfileRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new xfuser::testing::TempDir("xfuser-profile-cache");
    setenv("XFUSER_CACHE", cache_->path().c_str(), 1);
  }
  static void TearDownTestSuite() {
    delete cache_;
    cache_ = nullptr;
  }
  static xfuser::testing::TempDir* cache_;
};
xfuser::testing::TempDir* ProfileRun::cache_ = nullptr;

const std::string kCommon =
    " --model tiny-flux --prompt 'a cat' --height 32 --width 32 --num_inference_steps 2 "
    "--dtype fp32 --max_sequence_length 8 --profile ";

std::string bin(const std::string& name) {
  return (xfuser::testing::binary_dir() / "bin" / name).string() + " ";
}

std::string mpirun(int np) {
  std::string cmd = "timeout 300 mpirun -np " + std::to_string(np) + " --oversubscribe";
  if (geteuid() == 0) cmd += " --allow-run-as-root";
  return cmd + " -x XFUSER_CACHE -x OMP_NUM_THREADS=1 ";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());  // throws (fails the test) when not JSON
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::vector<nlohmann::json> complete_events(const nlohmann::json& trace, const std::string& cat,
                                            const std::string& name = "") {
  std::vector<nlohmann::json> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == cat && (name.empty() || e["name"] == name)) {
      out.push_back(e);
    }
  }
  return out;
}

// On every (pid, tid) track, complete events nest (viewers stack them; partial overlaps are
// misdrawn or dropped). Returns the number of violations.
int nesting_violations(const nlohmann::json& trace) {
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> tracks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int64_t ts = e["ts"], dur = e["dur"];
    tracks[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].emplace_back(ts, ts + dur);
  }
  int bad = 0;
  for (auto& [track, spans] : tracks) {
    // By start, longer first: a parent precedes its children.
    std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<int64_t> open_ends;
    for (const auto& [begin, end] : spans) {
      while (!open_ends.empty() && open_ends.back() <= begin) open_ends.pop_back();
      if (!open_ends.empty() && end > open_ends.back()) ++bad;
      open_ends.push_back(end);
    }
  }
  return bad;
}

// Checks the Chrome trace shape every viewer needs, and the spans of one active generation of
// tiny-flux (2 steps, 1 double + 1 single block) on `rank`.
void check_rank_trace(const nlohmann::json& t, int rank, int world) {
  ASSERT_TRUE(t.is_object() && t["traceEvents"].is_array());
  for (const auto& e : t["traceEvents"]) {
    ASSERT_TRUE(e["ph"] == "X" || e["ph"] == "M") << e.dump();
    EXPECT_EQ(e["pid"], rank);
    ASSERT_TRUE(e["tid"].is_number_integer()) << e.dump();
    if (e["ph"] == "X") {
      ASSERT_TRUE(e["name"].is_string() && e["ts"].is_number() && e["dur"].is_number()) << e.dump();
    }
  }
  const auto& meta = t["otherData"]["xfuser"];
  EXPECT_EQ(meta["rank"], rank);
  EXPECT_EQ(meta["world_size"], world);
  EXPECT_GT(meta["clock_sync_us"].get<int64_t>(), 0);
  // --profile_wait 1 --profile_warmup 1 --profile_active 1: only the active generation is kept.
  const auto generations = complete_events(t, "run", "generation");
  ASSERT_EQ(generations.size(), 1u);
  EXPECT_EQ(generations[0]["args"]["phase"], "active");
  EXPECT_EQ(generations[0]["args"]["index"], 2);
  EXPECT_EQ(complete_events(t, "stage", "generate").size(), 1u);
  EXPECT_EQ(complete_events(t, "stage", "encode_prompt").size(), 1u);
  EXPECT_EQ(complete_events(t, "stage", "decode").size(), 1u);
  EXPECT_EQ(complete_events(t, "step", "denoise_step").size(), 2u);
  EXPECT_GE(complete_events(t, "block", "transformer_block").size(), 2u);
  EXPECT_GE(complete_events(t, "block", "single_transformer_block").size(), 2u);
  EXPECT_GE(complete_events(t, "attention", "attention").size(), 4u);
  // libtorch's op events, on the trace clock: inside the active generation (1 ms slack).
  const auto ops = complete_events(t, "aten");
  EXPECT_GE(ops.size(), 50u);
  const int64_t g0 = generations[0]["ts"], g1 = g0 + generations[0]["dur"].get<int64_t>();
  std::set<std::string> names;
  for (const auto& e : ops) {
    names.insert(e["name"].get<std::string>());
    EXPECT_GE(e["ts"].get<int64_t>(), g0 - 1000) << e.dump();
    EXPECT_LE(e["ts"].get<int64_t>() + e["dur"].get<int64_t>(), g1 + 1000) << e.dump();
  }
  EXPECT_TRUE(names.count("aten::linear") || names.count("aten::addmm") || names.count("aten::mm"))
      << "no matmul op among " << names.size() << " op names";
  EXPECT_EQ(nesting_violations(t), 0);
}

}  // namespace

TEST_F(ProfileRun, OneRankWritesOnlyItsTrace) {
  xfuser::testing::TempDir out;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(bin("xfuser-run") + kCommon +
                                             "--profile_wait 1 --profile_warmup 1 "
                                             "--profile_active 1 --output_directory " +
                                             out.path().string(),
                                         &log),
            0)
      << log;
  EXPECT_EQ(files_in(out.path()), (std::set<std::string>{"profile_trace_rank_0.json"})) << log;
  const auto trace = read_json(out / "profile_trace_rank_0.json");
  check_rank_trace(trace, 0, 1);
  EXPECT_TRUE(complete_events(trace, "comm").empty());
}

TEST_F(ProfileRun, TwoRanksUnderMpirunWriteTracesWithCollectivesAndMerge) {
  // Build the tiny model once before two ranks use the cache.
  std::string log;
  {
    xfuser::testing::TempDir warm;
    ASSERT_EQ(xfuser::testing::run_command(bin("xfuser-run") + kCommon +
                                               "--profile_wait 0 --profile_warmup 0 "
                                               "--output_directory " +
                                               warm.path().string(),
                                           &log),
              0)
        << log;
  }
  xfuser::testing::TempDir out;
  ASSERT_EQ(xfuser::testing::run_command(mpirun(2) + bin("xfuser-run") + kCommon +
                                             "--ulysses_degree 2 --profile_wait 1 "
                                             "--profile_warmup 1 --profile_active 1 "
                                             "--output_directory " +
                                             out.path().string(),
                                         &log),
            0)
      << log;
  // No images, no timings: only the traces.
  EXPECT_EQ(files_in(out.path()),
            (std::set<std::string>{"profile_trace_rank_0.json", "profile_trace_rank_1.json"}))
      << log;
  std::vector<nlohmann::json> traces;
  for (int r = 0; r < 2; ++r) {
    traces.push_back(read_json(out / ("profile_trace_rank_" + std::to_string(r) + ".json")));
    SCOPED_TRACE("rank " + std::to_string(r));
    check_rank_trace(traces[r], r, 2);
    // Ulysses all-to-alls with their group, peer and bytes.
    const auto a2a = complete_events(traces[r], "comm", "all_to_all");
    ASSERT_FALSE(a2a.empty());
    for (const auto& e : a2a) {
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0) << e.dump();
      EXPECT_TRUE(e["args"]["group"].is_string()) << e.dump();
      EXPECT_EQ(e["args"]["peers"], nlohmann::json::array({1 - r})) << e.dump();
      EXPECT_EQ(e["args"]["backend"], "mpi");
    }
  }
  // Both ranks left the same barrier: on one machine their sync stamps are close.
  const int64_t s0 = traces[0]["otherData"]["xfuser"]["clock_sync_us"];
  const int64_t s1 = traces[1]["otherData"]["xfuser"]["clock_sync_us"];
  EXPECT_LT(std::abs(s0 - s1), 200000) << s0 << " vs " << s1;

  ASSERT_EQ(
      xfuser::testing::run_command(bin("xfuser") + "trace merge " + out.path().string(), &log), 0)
      << log;
  const auto merged = read_json(out / "profile_trace_merged.json");
  std::set<int> pids;
  std::map<int, std::string> process_names;
  std::map<int, std::vector<int64_t>> a2a_end;  // per rank, the end of each all-to-all
  for (const auto& e : merged["traceEvents"]) {
    const int pid = e["pid"];
    pids.insert(pid);
    if (e["ph"] == "M" && e["name"] == "process_name")
      process_names[pid] = e["args"]["name"].get<std::string>();
    if (e["ph"] == "X") {
      EXPECT_GE(e["ts"].get<int64_t>(), -1000) << "before the synchronised start: " << e.dump();
      if (e["name"] == "all_to_all") {
        a2a_end[pid].push_back(e["ts"].get<int64_t>() + e["dur"].get<int64_t>());
      }
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(nesting_violations(merged), 0);
  EXPECT_EQ(process_names[0], "rank 0");
  EXPECT_EQ(process_names[1], "rank 1");
  // A collective completes on both ranks at about the same moment of the common clock.
  ASSERT_EQ(a2a_end[0].size(), a2a_end[1].size());
  std::sort(a2a_end[0].begin(), a2a_end[0].end());
  std::sort(a2a_end[1].begin(), a2a_end[1].end());
  std::vector<int64_t> gaps;
  for (size_t i = 0; i < a2a_end[0].size(); ++i) {
    gaps.push_back(std::abs(a2a_end[0][i] - a2a_end[1][i]));
  }
  std::sort(gaps.begin(), gaps.end());
  EXPECT_LT(gaps[gaps.size() / 2], 50000) << "median all-to-all end gap (us)";
}

TEST_F(ProfileRun, ProfileFlagsAreChecked) {
  std::string log;
  EXPECT_NE(xfuser::testing::run_command(bin("xfuser-run") + kCommon + "--profile_active 0", &log),
            0);
  EXPECT_NE(log.find("--profile_active >= 1"), std::string::npos) << log;
}
