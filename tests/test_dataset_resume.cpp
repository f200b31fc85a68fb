// Dataset runs on one rank, small and fast: --resume regenerates every image whose
// recorded parameters differ and never replaces earlier timings with nothing; each image is logged
// as it is written and progress shows images, rate and time left; flags that change nothing warn;
// An image does not depend on the batch it was made in (exact guarantee per dtype,
// docs/dataset.md).
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "models/weights/safetensors.h"
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

int64_t mtime_ns(const fs::path& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

class DatasetResume : public ::testing::Test {
 protected:
  // xfuser-run (or `xfuser <sub>`) with the shared tiny-flux cache and one thread.
  static int run(const std::string& args, std::string* log,
                 const std::string& tool = "xfuser-run") {
    const std::string cmd =
        "XFUSER_CACHE=" + (xfuser::testing::binary_dir() / "test-cache").string() +
        " OMP_NUM_THREADS=1 timeout 300 " +
        (xfuser::testing::binary_dir() / "bin" / tool).string() + " " + args;
    return run_command(cmd, log);
  }
  void SetUp() override {
    std::ofstream(work_ / "prompts.txt") << "a cat in the garden\nan owl at night\na red car\n";
  }
  std::string name(int64_t i) const {
    return "tiny-flux_u1r1_tc_False_32x32_" + std::to_string(i) + ".png";
  }
  std::string dataset_run(const std::string& out, const std::string& extra) const {
    return "--model tiny-flux --height 32 --width 32 --max_sequence_length 8 --dtype fp32 "
           "--dataset_path " +
           (work_ / "prompts.txt").string() + " --output_directory " + out + " " + extra;
  }
  xfuser::testing::TempDir work_{"xfuser-resume"};
};

// Images logged as written, progress with rate and time left.
TEST_F(DatasetResume, ResumeRegeneratesWhatDiffersAndKeepsEarlierTimings) {
  const std::string out = (work_ / "out").string();
  std::string log;
  ASSERT_EQ(run(dataset_run(out, "--batch_size 2 --num_inference_steps 2"), &log), 0) << log;
  // Each image is logged as it is written, with the count; the progress line after each batch
  // gives done / total, the rate and the time left.
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(log.find("wrote " + (fs::path(out) / name(i)).string() + " (" +
                       std::to_string(i + 1) + "/3 on this data-parallel group)"),
              std::string::npos)
        << log;
  }
  EXPECT_NE(log.find("2/3 images | "), std::string::npos) << log;
  EXPECT_NE(log.find("3/3 images | "), std::string::npos) << log;
  EXPECT_NE(log.find(" images/s | "), std::string::npos) << log;
  EXPECT_NE(log.find(" left | batch 2: "), std::string::npos) << log;

  const std::string timings = slurp(fs::path(out) / "timings.json");
  ASSERT_EQ(nlohmann::json::parse(timings).size(), 2u) << timings;
  std::map<int, int64_t> written;
  for (int i = 0; i < 3; ++i) written[i] = mtime_ns(fs::path(out) / name(i));

  // Everything complete: nothing generated, and the earlier timings stay (not "[]").
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(run(dataset_run(out, "--batch_size 2 --num_inference_steps 2 --resume"), &log), 0)
      << log;
  EXPECT_NE(log.find("3 of 3 outputs complete, 0 to generate"), std::string::npos) << log;
  EXPECT_EQ(slurp(fs::path(out) / "timings.json"), timings);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(mtime_ns(fs::path(out) / name(i)), written[i]) << i;

  // Another step count: every image is stale, named with what differs, and made again.
  ASSERT_EQ(run(dataset_run(out, "--batch_size 2 --num_inference_steps 3 --resume"), &log), 0)
      << log;
  EXPECT_NE(log.find("0 of 3 outputs complete, 3 to generate"), std::string::npos) << log;
  EXPECT_NE(log.find("num_inference_steps '2' -> '3'"), std::string::npos) << log;
  for (int i = 0; i < 3; ++i) {
    std::map<std::string, std::string> text;
    xfuser::runner::read_png(fs::path(out) / name(i), &text);
    EXPECT_EQ(text["num_inference_steps"], "3") << i;
  }

  // One image made with another guidance and a negative prompt: only it is made again.
  {
    const fs::path other = work_ / "other";
    ASSERT_EQ(run("--model tiny-flux --height 32 --width 32 --max_sequence_length 8 --dtype fp32 "
                  "--num_inference_steps 3 --guidance_scale 7 --prompt 'an owl at night' "
                  "--output_directory " +
                      other.string(),
                  &log),
              0)
        << log;
    fs::copy_file(other / name(0), fs::path(out) / name(1), fs::copy_options::overwrite_existing);
  }
  const int64_t kept = mtime_ns(fs::path(out) / name(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(run(dataset_run(out, "--batch_size 2 --num_inference_steps 3 --resume"), &log), 0)
      << log;
  EXPECT_NE(log.find("2 of 3 outputs complete, 1 to generate"), std::string::npos) << log;
  EXPECT_NE(log.find("guidance_scale '7' -> '3.5'"), std::string::npos) << log;
  EXPECT_EQ(mtime_ns(fs::path(out) / name(0)), kept);
  std::map<std::string, std::string> text;
  xfuser::runner::read_png(fs::path(out) / name(1), &text);
  EXPECT_EQ(text["guidance_scale"], "3.5");
  // The resumed run's timings: its one batch.
  EXPECT_EQ(nlohmann::json::parse(slurp(fs::path(out) / "timings.json")).size(), 1u);
}

// Flags that change nothing are accepted with one warning naming the flag.
TEST_F(DatasetResume, FlagsThatChangeNothingWarn) {
  std::string log;
  const std::string base = "validate --model tiny-flux --height 32 --width 32 ";
  ASSERT_EQ(run(base + "--prompt x --negative_prompt blurry", &log, "xfuser"), 0) << log;
  EXPECT_NE(log.find("--negative_prompt has no effect: tiny-flux uses it only with true CFG, "
                     "--true_cfg_scale > 1 (got 1)"),
            std::string::npos)
      << log;
  ASSERT_EQ(run(base + "--prompt x --prompt y --batch_size 2", &log, "xfuser"), 0) << log;
  EXPECT_NE(log.find("--batch_size 2 has no effect: the 2 --prompt(s) are denoised in one batch"),
            std::string::npos)
      << log;
  // Flags that do change the run: no warning.
  ASSERT_EQ(run(base + "--prompt x --negative_prompt blurry --true_cfg_scale 2", &log, "xfuser"), 0)
      << log;
  EXPECT_EQ(log.find("has no effect"), std::string::npos) << log;
  ASSERT_EQ(run(base + "--prompt x --prompt y --prompt z --batch_size 2", &log, "xfuser"), 0)
      << log;
  EXPECT_EQ(log.find("has no effect"), std::string::npos) << log;
}

// --resume records the --latents file by digest: the same file name with other values is
// generated again; the unchanged file is complete.
TEST_F(DatasetResume, ResumeComparesTheLatentsFile) {
  std::ofstream(work_ / "one.txt") << "a cat in the garden\n";
  const fs::path out = work_ / "latents-out";
  const fs::path latents = work_ / "latents.safetensors";
  auto cmd = [&] {
    return "--model tiny-flux --height 32 --width 32 --max_sequence_length 8 --dtype fp32 "
           "--num_inference_steps 1 --batch_size 1 --resume --dataset_path " +
           (work_ / "one.txt").string() + " --latents " + latents.string() +
           " --output_directory " + out.string();
  };
  at::Tensor noise = at::randn({1, 4, 64}, at::TensorOptions().dtype(at::kFloat));
  xfuser::models::save_safetensors(latents.string(), {{"latents", noise}});
  std::string log;
  ASSERT_EQ(run(cmd(), &log), 0) << log;
  ASSERT_EQ(run(cmd(), &log), 0) << log;
  EXPECT_NE(log.find("1 of 1 outputs complete, 0 to generate"), std::string::npos) << log;
  xfuser::models::save_safetensors(latents.string(), {{"latents", noise * 0.5}});
  ASSERT_EQ(run(cmd(), &log), 0) << log;
  EXPECT_NE(log.find("was made with other parameters (latents 'latents.safetensors@"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("0 of 1 outputs complete, 1 to generate"), std::string::npos) << log;
}

// An image does not depend on the batch it was made in, within the bound docs/dataset.md states
// per dtype. fp32: equal to the one-prompt-per-batch image within 1/255 on at most 0.1% of the
// values (GEMM blocking over the batch's rows may round one value the other way). bf16: within
// what two bf16 roundings of the same picture can differ by, bounded from bf16's own error
// measured in the same run (bf16 vs fp32), not from one machine's numbers: batch 3 vs 1 moved
// values by up to 23/255 with PyPI's torch 2.15, 11/255 with Debian's libtorch 1.13, and the
// same 11/255 against a bf16 error of 5/255 on a CPU with AVX512-BF16. The fp32 check is the
// sharp one: a batch that leaked between prompts would move its images by far more.
TEST_F(DatasetResume, AnImageDoesNotDependOnItsBatchBeyondItsDtypeNoise) {
  std::map<std::string, std::vector<at::Tensor>> images;  // "dtype/batch" -> images
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (int b : {1, 3}) {
      const std::string key = dtype + "-b" + std::to_string(b);
      const fs::path out = work_ / key;
      std::string log;
      std::string args =
          dataset_run(out.string(), "--num_inference_steps 2 --batch_size " + std::to_string(b));
      args.replace(args.find("--dtype fp32"), 12, "--dtype " + dtype);
      ASSERT_EQ(run(args, &log), 0) << log;
      for (int i = 0; i < 3; ++i) {
        images[key].push_back(xfuser::runner::read_png(out / name(i)).to(at::kInt));
      }
    }
  }
  // bf16's own noise: how far each prompt's bf16 picture is from its fp32 picture (batch 1).
  // A batch of 3 may take other GEMM kernels than a batch of 1 (another blocking; AVX512-BF16 dot
  // products on some CPUs), so its bf16 picture is another rounding of the same fp32 picture. Two
  // roundings differ by at most the sum of their errors: on average by up to twice bf16's mean
  // error; at the worst pixel the tails of two roundings add up, so allow four times the largest
  // bf16 error of the three prompts.
  // A batching defect (one prompt's text, noise or mask reaching another) moves the whole picture
  // by tens of levels, far beyond both bounds.
  double noise = 1;  // the largest bf16 vs fp32 difference of the three prompts
  for (int i = 0; i < 3; ++i) {
    noise =
        std::max(noise, (images["bf16-b1"][i] - images["fp32-b1"][i]).abs().max().item<double>());
  }
  for (int i = 0; i < 3; ++i) {
    const at::Tensor fp32 = (images["fp32-b3"][i] - images["fp32-b1"][i]).abs();
    const int fp32_max = fp32.max().item<int>();
    const int64_t fp32_count = fp32.gt(0).sum().item<int64_t>();
    const at::Tensor own = (images["bf16-b1"][i] - images["fp32-b1"][i]).abs().to(at::kFloat);
    const at::Tensor bf16 = (images["bf16-b3"][i] - images["bf16-b1"][i]).abs().to(at::kFloat);
    const double own_mean = own.mean().item<double>(), own_max = own.max().item<double>();
    const double bf16_mean = bf16.mean().item<double>(), bf16_max = bf16.max().item<double>();
    std::printf(
        "prompt %d: batch 3 vs 1: fp32 max %d (%lld values), bf16 mean %.3f max %.0f; bf16 vs "
        "fp32: mean %.3f max %.0f\n",
        i, fp32_max, static_cast<long long>(fp32_count), bf16_mean, bf16_max, own_mean, own_max);
    EXPECT_LE(fp32_max, 1) << "prompt " << i;
    EXPECT_LE(fp32_count, std::max<int64_t>(4, fp32.numel() / 1000)) << "prompt " << i;
    EXPECT_LE(bf16_mean, 2 * own_mean + 0.25) << "prompt " << i;
    EXPECT_LE(bf16_max, 4 * noise) << "prompt " << i;
  }
}

}  // namespace
