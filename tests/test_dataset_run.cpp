// Dataset inference end to end: xfuser-run --dataset_path with --batch_size 2 over two
// data-parallel groups (mpirun -np 2) equals one-prompt runs; a killed run resumes with --resume
// without touching the finished files.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::testing::run_command;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string mpirun(int np) {
  std::string cmd = "mpirun -np " + std::to_string(np) + " --oversubscribe";
  if (geteuid() == 0) cmd += " --allow-run-as-root";
  return cmd + " -x XFUSER_CACHE -x OMP_NUM_THREADS=1 ";
}

std::string bin(const std::string& name) {
  return (xfuser::testing::binary_dir() / "bin" / name).string();
}

struct Row {
  std::string prompt;
  int64_t seed;
  std::string negative;  // "" = none
};

// Five rows: default seed (42) or their own.
// Rows 2 and 4 have a negative prompt: group 0's first batch [0, 2] mixes both kinds, and its
// last batch [4] (true CFG: twice the work) is still running when the test kills the job.
const std::vector<Row> kRows = {{"a cat in the garden", 42, ""},
                                {"an owl at night", 7, ""},
                                {"a red car", 42, "blurry"},
                                {"a bowl of \"soup\", steaming", 1234, ""},
                                {"mountains at dawn", 42, "fog"}};

const char* kCommon =
    " --model tiny-flux --height 256 --width 256 --num_inference_steps 12 --dtype fp32 "
    "--max_sequence_length 16 --true_cfg_scale 3";

// The dataset run's names carry its data-parallel degree (_dp2); a one-prompt run's do not.
std::string name(int64_t index, int dp = 2) {
  return "tiny-flux_u1r1" + (dp > 1 ? "_dp" + std::to_string(dp) : std::string()) +
         "_tc_False_256x256_" + std::to_string(index) + ".png";
}

struct FileState {
  int64_t mtime_ns;
  std::string bytes;
};

FileState state(const fs::path& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, slurp(p)};
}

// The processes whose parent is `parent` (from /proc/<pid>/stat).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(entry.path() / "stat");
    const size_t close = stat.rfind(')');  // "pid (comm) state ppid ..."
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// Max |a - b| over the pixels of two PNGs (1000: different sizes), and how many values differ.
std::pair<int, int64_t> pixel_diff(const fs::path& a, const fs::path& b) {
  at::Tensor x = xfuser::runner::read_png(a).to(at::kInt);
  at::Tensor y = xfuser::runner::read_png(b).to(at::kInt);
  if (x.sizes() != y.sizes()) return {1000, -1};
  return {(x - y).abs().max().item<int>(), (x != y).sum().item<int64_t>()};
}

TEST(DatasetRun, BatchedOverDataParallelEqualsSingleRunsAndResumes) {
  xfuser::testing::TempDir cache("xfuser-dataset-cache"), work;
  setenv("XFUSER_CACHE", cache.path().c_str(), 1);

  // The dataset, as JSONL (the seed of rows without one is --seed 42).
  const fs::path dataset = work / "prompts.jsonl";
  {
    std::ofstream out(dataset);
    for (const Row& r : kRows) {
      nlohmann::json j = {{"prompt", r.prompt}};
      if (r.seed != 42) j["seed"] = r.seed;
      if (!r.negative.empty()) j["negative_prompt"] = r.negative;
      out << j.dump() << "\n";
    }
  }

  // Five one-prompt runs.
  std::string log;
  for (size_t i = 0; i < kRows.size(); ++i) {
    const fs::path dir = work / ("single" + std::to_string(i));
    // One thread, as the ranks below (-x OMP_NUM_THREADS=1): GEMM rounding depends on it.
    std::string cmd = "OMP_NUM_THREADS=1 " + bin("xfuser-run") + kCommon + " --prompt '" +
                      kRows[i].prompt + "' --seed " + std::to_string(kRows[i].seed) +
                      " --output_directory " + dir.string();
    if (!kRows[i].negative.empty()) cmd += " --negative_prompt " + kRows[i].negative;
    ASSERT_EQ(run_command(cmd, &log), 0) << log;
  }

  // The dataset run in the background; killed once the first image appears.
  const fs::path out = work / "out";
  fs::create_directories(out);
  const std::string dataset_cmd =
      mpirun(2) + bin("xfuser-run") + kCommon + " --dataset_path " + dataset.string() +
      " --batch_size 2 --data_parallel_degree 2 --output_directory " + out.string();
  const fs::path pid_file = work / "pid";
  ASSERT_EQ(std::system((dataset_cmd + " > " + (work / "first.log").string() +
                         " 2>&1 & echo $! > " + pid_file.string())
                            .c_str()),
            0);
  const pid_t pid = std::stoi(slurp(pid_file));
  auto complete_files = [&] {
    std::vector<int64_t> done;
    for (int64_t i = 0; i < 5; ++i) {
      if (fs::exists(out / name(i))) done.push_back(i);
    }
    return done;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (complete_files().empty() && std::chrono::steady_clock::now() < deadline &&
         ::kill(pid, 0) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Kill the ranks outright (SIGKILL: no handler, no cleanup, as a crash or an OOM kill);
  // mpirun then ends the job.
  const std::vector<pid_t> ranks = children_of(pid);
  EXPECT_EQ(ranks.size(), 2u) << "mpirun " << pid << " should have 2 rank processes";
  for (pid_t rank : ranks) ::kill(rank, SIGKILL);
  for (int i = 0; i < 300 && ::kill(pid, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::vector<int64_t> first = complete_files();
  ASSERT_FALSE(first.empty()) << slurp(work / "first.log");
  ASSERT_LT(first.size(), 5u) << "the run finished before it was killed: nothing to resume\n"
                              << slurp(work / "first.log");
  // Every file under a final name is a complete PNG (written to a temp name, then renamed).
  std::map<int64_t, FileState> before;
  for (int64_t i : first) {
    EXPECT_TRUE(xfuser::runner::is_complete_png(out / name(i), 256, 256)) << name(i);
    before[i] = state(out / name(i));
  }
  // A partial file under a missing output's name (as a crash of another tool could leave):
  // --resume must not take it for a finished output.
  int64_t partial = -1;
  for (int64_t i = 4; i >= 0; --i) {
    if (!before.count(i)) {
      partial = i;
      break;
    }
  }
  {
    const std::string png = slurp(out / name(first.front()));
    std::ofstream(out / name(partial), std::ios::binary) << png.substr(0, png.size() / 2);
  }
  EXPECT_FALSE(xfuser::runner::is_complete_png(out / name(partial)));

  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // mtimes would show a rewrite
  ASSERT_EQ(run_command("timeout 300 " + dataset_cmd + " --resume", &log), 0) << log;
  const std::string complete_msg = std::to_string(first.size()) + " of 5 outputs complete";
  EXPECT_NE(log.find(complete_msg), std::string::npos) << log;

  for (const auto& [i, st] : before) {
    const FileState now = state(out / name(i));
    EXPECT_EQ(now.mtime_ns, st.mtime_ns) << name(i) << " was rewritten";
    EXPECT_TRUE(now.bytes == st.bytes) << name(i) << " changed";
  }
  for (int64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(xfuser::runner::is_complete_png(out / name(i), 256, 256)) << name(i) << "\n" << log;
    std::map<std::string, std::string> text;
    xfuser::runner::read_png(out / name(i), &text);
    EXPECT_EQ(text["prompt"], kRows[i].prompt);
    EXPECT_EQ(text["seed"], std::to_string(kRows[i].seed));
    // A batch of 2 runs the GEMMs at twice the rows: the float rounding may differ from a batch
    // of 1 and move a rare pixel by 1 (the serial-vs-parallel bar of test_xfuser_run). Seeds,
    // negative prompts and indices must match exactly.
    const auto [diff, count] =
        pixel_diff(out / name(i), work / ("single" + std::to_string(i)) / name(0, 1));
    std::printf("prompt %lld: max pixel difference to its one-prompt run %d (%lld values)\n",
                static_cast<long long>(i), diff, static_cast<long long>(count));
    EXPECT_LE(diff, 1) << "prompt " << i;
    EXPECT_LE(count, 256 * 256 * 3 / 1000) << "prompt " << i;
  }
  for (const auto& entry : fs::directory_iterator(out)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << "temp file left: " << entry.path();
  }
  // timings.json: one entry per batch of the resumed run (pending prompts strided over 2 dp
  // groups, batches of 2 in each).
  std::vector<int64_t> pending;
  for (int64_t i = 0; i < 5; ++i) {
    if (!before.count(i)) pending.push_back(i);
  }
  const size_t g0 = (pending.size() + 1) / 2, g1 = pending.size() / 2;
  const size_t batches = (g0 + 1) / 2 + (g1 + 1) / 2;
  const auto timings = nlohmann::json::parse(slurp(out / "timings.json"));
  ASSERT_TRUE(timings.is_array()) << timings.dump();
  EXPECT_EQ(timings.size(), batches) << timings.dump();
  for (const auto& t : timings) EXPECT_GT(t.get<double>(), 0.0);

  // Everything complete: a second --resume generates nothing, still succeeds, and keeps the
  // timings of the run that did the work.
  const std::string timings_before = slurp(out / "timings.json");
  ASSERT_EQ(run_command("timeout 300 " + dataset_cmd + " --resume", &log), 0) << log;
  EXPECT_NE(log.find("5 of 5 outputs complete"), std::string::npos) << log;
  EXPECT_EQ(slurp(out / "timings.json"), timings_before);
}

TEST(DatasetRun, BadDatasetsFailBeforeLoadingWithTheirLine) {
  xfuser::testing::TempDir cache("xfuser-dataset-cache"), work;
  const std::string run = "XFUSER_CACHE=" + cache.path().string() + " " + bin("xfuser-run") +
                          kCommon + " --output_directory " + (work / "out").string();
  std::string log;
  std::ofstream(work / "bad.csv") << "prompt,seed\nok,1\n\"open,2\n";
  EXPECT_NE(
      run_command(run + " --batch_size 2 --dataset_path " + (work / "bad.csv").string(), &log), 0);
  EXPECT_NE(log.find("bad.csv:3: quoted field is never closed"), std::string::npos) << log;
  EXPECT_NE(run_command(run + " --dataset_path " + (work / "bad.csv").string(), &log), 0);
  EXPECT_NE(log.find("--dataset_path needs --batch_size"), std::string::npos) << log;
  EXPECT_NE(run_command(run + " --batch_size 1 --prompt x --resume", &log), 0);
  EXPECT_NE(log.find("--resume needs --dataset_path"), std::string::npos) << log;
  std::ofstream(work / "p.txt") << "a\n";
  EXPECT_NE(
      run_command(run + " --prompt x --batch_size 1 --dataset_path " + (work / "p.txt").string(),
                  &log),
      0);
  EXPECT_NE(log.find("exclusive"), std::string::npos) << log;
}

}  // namespace
