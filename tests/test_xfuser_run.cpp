// xfuser-run end to end on the embedded tiny model: files, naming, determinism, bad inputs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/attention.h"
#include "models/weights/safetensors.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::max_pixel_diff;

namespace fs = std::filesystem;

class XfuserRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cache_ = new xfuser::testing::TempDir("xfuser-run-cache"); }
  static void TearDownTestSuite() {
    delete cache_;
    cache_ = nullptr;
  }
  // Runs xfuser-run with the tiny model cache in a temp folder; returns the exit code.
  static int run(const std::string& args, std::string* out = nullptr) {
    std::string cmd = "XFUSER_CACHE=" + cache_->path().string() + " " +
                      (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string() + " " + args;
    std::string local;
    int code = xfuser::testing::run_command(cmd, out ? out : &local);
    return code;
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static xfuser::testing::TempDir* cache_;
};
xfuser::testing::TempDir* XfuserRun::cache_ = nullptr;

const char* kBase =
    "--model tiny-flux --prompt 'a cat in the garden' --height 256 --width 256 "
    "--num_inference_steps 4 --dtype fp32";

TEST_F(XfuserRun, WritesAPngAndTimingsAndIsDeterministic) {
  xfuser::testing::TempDir out1, out2, out3;
  std::string log;
  ASSERT_EQ(run(std::string(kBase) + " --output_directory " + out1.path().string(), &log), 0)
      << log;
  const std::string name = "tiny-flux_u1r1_tc_False_256x256_0.png";
  ASSERT_TRUE(fs::exists(out1 / name)) << log;
  std::map<std::string, std::string> text;
  at::Tensor img = xfuser::runner::read_png(out1 / name, &text);
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{256, 256, 3}));
  EXPECT_EQ(text["prompt"], "a cat in the garden");
  EXPECT_EQ(text["seed"], "42");
  EXPECT_EQ(text["num_inference_steps"], "4");
  EXPECT_EQ(text["model"], "tiny-flux");
  auto timings = nlohmann::json::parse(read(out1 / "timings.json"));
  ASSERT_TRUE(timings.is_array());
  ASSERT_EQ(timings.size(), 1u);
  EXPECT_GT(timings[0].get<double>(), 0.0);
  // Attention on the CPU: the unmasked FLUX blocks run the CPU kernel for this libtorch (PyTorch's
  // fused one from 2.3, else the blocked one), chosen automatically.
  auto report = nlohmann::json::parse(read(out1 / "timings_rank0.json"));
  EXPECT_EQ(report["config"]["attention_backend"], "auto");
  EXPECT_GT(
      report["attention_kernel_calls"].value(xfuser::backends::cpu_attention_kernel_name(), 0), 0)
      << report.dump(2);

  ASSERT_EQ(run(std::string(kBase) + " --output_directory " + out2.path().string(), &log), 0)
      << log;
  EXPECT_EQ(read(out1 / name), read(out2 / name));

  ASSERT_EQ(run(std::string(kBase) + " --seed 43 --output_directory " + out3.path().string(), &log),
            0)
      << log;
  EXPECT_NE(read(out1 / name), read(out3 / name));
}

// --attention_backend chunked runs every attention call on the chunked kernel (the report counts
// them) and gives the picture of the automatic choice within rounding.
TEST_F(XfuserRun, AttentionBackendChoosesTheKernel) {
  xfuser::testing::TempDir auto_out, chunked_out;
  std::string log;
  ASSERT_EQ(run(std::string(kBase) + " --output_directory " + auto_out.path().string(), &log), 0)
      << log;
  ASSERT_EQ(run(std::string(kBase) + " --attention_backend chunked --output_directory " +
                    chunked_out.path().string(),
                &log),
            0)
      << log;
  auto report = nlohmann::json::parse(read(chunked_out / "timings_rank0.json"));
  EXPECT_EQ(report["config"]["attention_backend"], "chunked");
  const auto& calls = report["attention_kernel_calls"];
  ASSERT_EQ(calls.size(), 1u) << calls.dump();
  EXPECT_GT(calls.value("chunked", 0), 0) << calls.dump();
  const std::string name = "tiny-flux_u1r1_tc_False_256x256_0.png";
  at::Tensor a = xfuser::runner::read_png(auto_out / name).to(at::kInt);
  at::Tensor b = xfuser::runner::read_png(chunked_out / name).to(at::kInt);
  EXPECT_LE((a - b).abs().max().item<int>(), 2);
}

TEST_F(XfuserRun, NegativePromptWithTrueCfgChangesTheImage) {
  xfuser::testing::TempDir a, b;
  std::string log;
  ASSERT_EQ(run(std::string(kBase) + " --output_directory " + a.path().string(), &log), 0) << log;
  ASSERT_EQ(run(std::string(kBase) + " --negative_prompt 'blurry' --true_cfg_scale 4 " +
                    "--output_directory " + b.path().string(),
                &log),
            0)
      << log;
  const std::string name = "tiny-flux_u1r1_tc_False_256x256_0.png";
  EXPECT_NE(read(a / name), read(b / name));
}

TEST_F(XfuserRun, IterationsGiveOneTimingEach) {
  xfuser::testing::TempDir out;
  std::string log;
  ASSERT_EQ(run("--model tiny-flux --prompt x --height 64 --width 64 --num_inference_steps 2 "
                "--num_iterations 3 --warmup_calls 1 --output_directory " +
                    out.path().string(),
                &log),
            0)
      << log;
  auto timings = nlohmann::json::parse(read(out / "timings.json"));
  EXPECT_EQ(timings.size(), 3u);
  // The per-rank report: one entry per timed iteration, stages consistent with the totals.
  auto report = nlohmann::json::parse(read(out / "timings_rank0.json"));
  EXPECT_EQ(report["schema"], "xfuser.timings_rank");
  EXPECT_EQ(report["version"], 1);
  EXPECT_EQ(report["rank"], 0);
  EXPECT_EQ(report["config"]["num_inference_steps"], 2);
  ASSERT_EQ(report["iterations"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& it = report["iterations"][i];
    EXPECT_DOUBLE_EQ(it["total_seconds"].get<double>(), timings[i].get<double>());
    ASSERT_EQ(it["stages"].size(), 5u);  // encode, latents, 2 steps, decode
    EXPECT_EQ(it["stages"][0]["name"], "encode_prompt");
    EXPECT_EQ(it["stages"][3]["name"], "denoise_step");
    EXPECT_EQ(it["stages"][3]["step"], 1);
    EXPECT_EQ(it["stages"][4]["name"], "decode");
    double sum = 0;
    for (const auto& st : it["stages"]) sum += st["seconds"].get<double>();
    EXPECT_NEAR(sum, it["stages_seconds"].get<double>(), 1e-9);
    EXPECT_LE(sum, it["total_seconds"].get<double>());
    EXPECT_GE(sum, 0.5 * it["total_seconds"].get<double>());
  }
  EXPECT_GT(report["memory"]["peak_rss_bytes"].get<int64_t>(), 0);
}

struct BadCase {
  std::string args;
  std::string expected;
};

TEST_F(XfuserRun, BadInputsFailBeforeComputeWithANamedError) {
  xfuser::testing::TempDir out;
  const std::string o = " --output_directory " + out.path().string();
  std::vector<BadCase> cases = {
      {"--model tiny-flux --prompt x --height 250" + o,
       "--height must be a positive multiple of 16 (got 250)"},
      {"--model tiny-flux --prompt x --num_inference_steps 0" + o,
       "--num_inference_steps must be >= 1 (got 0)"},
      {"--model no-such-model --prompt x" + o, "unknown model 'no-such-model'"},
      {"--model tiny-flux --model_path /nonexistent/flux --prompt x" + o,
       "model folder /nonexistent/flux does not exist"},
      {"--model tiny-flux --prompt x --output_directory /proc/xfuser-out",
       "--output_directory /proc/xfuser-out"},
      {"--model tiny-flux --prompt x --use_fsdp" + o,
       "--use_fsdp shards the weights over the ranks that run a generation together"},
      {"--model tiny-flux --prompt x --device cpu --attention_backend cudnn" + o,
       "--attention_backend cudnn is a CUDA kernel: it needs --device cuda"},
      {"--model tiny-flux --prompt x --attention_backend flash3" + o, "--attention_backend"},
      {"--model tiny-flux --prompt x --ulysses_degree 2" + o, "but the world size is 1"},
      {"--model tiny-flux" + o, "--prompt is required"},
      {"--model tiny-flux --prompt x --guidance_scale inf" + o,
       "--guidance_scale must be a finite number"},
  };
  for (const auto& c : cases) {
    std::string log;
    int code = run(c.args, &log);
    EXPECT_NE(code, 0) << c.args;
    EXPECT_NE(log.find(c.expected), std::string::npos) << c.args << "\n" << log;
  }
  EXPECT_TRUE(fs::is_empty(out.path()));
}

TEST_F(XfuserRun, FindsARepoIdInTheHuggingFaceCache) {
  // A FLUX-format pipeline placed where the hub cache keeps black-forest-labs/FLUX.1-dev.
  xfuser::testing::TempDir hf, out;
  const fs::path repo = hf / "hub" / "models--black-forest-labs--FLUX.1-dev";
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(
                (xfuser::testing::binary_dir() / "bin" / "xfuser").string() +
                    " make-tiny --arch flux --out " + (repo / "snapshots" / "abc123").string(),
                &log),
            0)
      << log;
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "abc123";
  const std::string args =
      " --model black-forest-labs/FLUX.1-dev --prompt x --height 64 --width 64 "
      "--num_inference_steps 1 --max_sequence_length 16 --output_directory " +
      out.path().string();
  auto with_hf_home = [&](const fs::path& home) {
    return "env -u HF_HUB_CACHE -u HUGGINGFACE_HUB_CACHE -u XDG_CACHE_HOME HOME=" + home.string() +
           " HF_HOME=" + home.string() + " " +
           (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string() + args;
  };
  ASSERT_EQ(xfuser::testing::run_command(with_hf_home(hf.path()), &log), 0) << log;
  EXPECT_TRUE(fs::exists(out / "FLUX.1-dev_u1r1_tc_False_64x64_0.png")) << log;
  // Without the cache the error says where it looked.
  xfuser::testing::TempDir empty;
  EXPECT_NE(xfuser::testing::run_command(with_hf_home(empty.path()), &log), 0);
  EXPECT_NE(log.find("is not in the local Hugging Face cache"), std::string::npos) << log;
  EXPECT_NE(log.find((empty.path() / "hub").string()), std::string::npos) << log;
}

TEST_F(XfuserRun, MissingTokenizerFileIsNamed) {
  xfuser::testing::TempDir dir, out;
  std::string log;
  ASSERT_EQ(
      xfuser::testing::run_command((xfuser::testing::binary_dir() / "bin" / "xfuser").string() +
                                       " make-tiny --arch flux --out " + (dir / "pipe").string(),
                                   &log),
      0)
      << log;
  fs::remove(dir / "pipe" / "tokenizer" / "merges.txt");
  int code = run("--model tiny-flux --model_path " + (dir / "pipe").string() +
                     " --prompt x --output_directory " + out.path().string(),
                 &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("merges.txt"), std::string::npos) << log;
}

}  // namespace

namespace {

// mpirun with the flags these machines need (oversubscribed 2 cores; root in containers).
// --use_torch_compile goes through the backend contract: the CPU backend has no compile path,
// says so in the run report, and the hand-written overrides run; the picture is the same as
// without the flag, and within one level of the eager reference ops (XFUSER_KERNEL_OVERRIDES=0).
TEST_F(XfuserRun, UseTorchCompileRecordsTheBackendTimeline) {
  xfuser::testing::TempDir with, without, eager;
  std::string log;
  ASSERT_EQ(
      run(std::string(kBase) + " --use_torch_compile --output_directory " + with.path().string(),
          &log),
      0)
      << log;
  ASSERT_EQ(run(std::string(kBase) + " --output_directory " + without.path().string(), &log), 0)
      << log;
  ASSERT_EQ(xfuser::testing::run_command(
                "XFUSER_KERNEL_OVERRIDES=0 XFUSER_CACHE=" + cache_->path().string() + " " +
                    (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string() + " " + kBase +
                    " --output_directory " + eager.path().string(),
                &log),
            0)
      << log;
  auto report = nlohmann::json::parse(read(with / "timings_rank0.json"));
  EXPECT_TRUE(report["config"]["use_torch_compile"].get<bool>());
  const auto& timeline = report["backend_timeline"];
  ASSERT_EQ(timeline.size(), 2u) << timeline.dump(2);
  for (const auto& e : timeline) {
    EXPECT_EQ(e["backend"], "cpu");
    EXPECT_EQ(e["chosen"], "override") << e.dump();
    ASSERT_GE(e["attempts"].size(), 2u);
    EXPECT_EQ(e["attempts"][0]["level"], "compile");
    EXPECT_FALSE(e["attempts"][0]["ok"].get<bool>());
    EXPECT_NE(e["attempts"][0]["reason"].get<std::string>().find("no compile path"),
              std::string::npos);
  }
  auto eager_report = nlohmann::json::parse(read(eager / "timings_rank0.json"));
  for (const auto& e : eager_report["backend_timeline"]) EXPECT_EQ(e["chosen"], "eager");
  at::Tensor a = xfuser::runner::read_png(with / "tiny-flux_u1r1_tc_True_256x256_0.png");
  at::Tensor b = xfuser::runner::read_png(without / "tiny-flux_u1r1_tc_False_256x256_0.png");
  at::Tensor c = xfuser::runner::read_png(eager / "tiny-flux_u1r1_tc_False_256x256_0.png");
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_LE((a.to(at::kInt) - c.to(at::kInt)).abs().max().item<int>(), 1);
}

}  // namespace

TEST_F(XfuserRun, UnderMpirunEveryStrategyWritesTheSerialImages) {
  setenv("XFUSER_CACHE", cache_->path().c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  const std::string common =
      " --model tiny-flux --prompt 'a cat' --prompt 'an owl at night' --prompt 'a red car' "
      "--height 64 --width 48 --num_inference_steps 2 --dtype fp32 --max_sequence_length 8 "
      "--negative_prompt blurry --true_cfg_scale 3";
  xfuser::testing::TempDir serial;
  std::string log;
  ASSERT_EQ(run(common + " --output_directory " + serial.path().string(), &log), 0) << log;
  struct Case {
    int np;
    std::string flags;
    std::string tag;  // layout part of the file names (u/r, then tp/pp/cfg/dp when not 1)
  };
  for (const Case& c :
       {Case{2, "--ulysses_degree 2", "u2r1"}, Case{2, "--ring_degree 2", "u1r2"},
        Case{2, "--use_cfg_parallel", "u1r1_cfg2"},
        Case{4, "--data_parallel_degree 2 --ulysses_degree 2", "u2r1_dp2"},
        Case{4, "--use_cfg_parallel --ring_degree 2", "u1r2_cfg2"},
        Case{2, "--tensor_parallel_degree 2", "u1r1_tp2"},
        Case{4, "--tensor_parallel_degree 2 --ulysses_degree 2 --use_parallel_vae", "u2r1_tp2"},
        Case{4, "--use_fsdp --data_parallel_degree 2 --ulysses_degree 2", "u2r1_dp2"}}) {
    xfuser::testing::TempDir out;
    ASSERT_EQ(
        xfuser::testing::run_command(xfuser::testing::mpirun_prefix(c.np) + bin + common + " " +
                                         c.flags + " --output_directory " + out.path().string(),
                                     &log),
        0)
        << c.flags << "\n"
        << log;
    for (int i = 0; i < 3; ++i) {
      const std::string suffix = "_64x48_" + std::to_string(i) + ".png";
      const fs::path got = out / ("tiny-flux_" + c.tag + "_tc_False" + suffix);
      ASSERT_TRUE(fs::exists(got)) << c.flags << " " << got << "\n" << log;
      EXPECT_LE(max_pixel_diff(got, serial / ("tiny-flux_u1r1_tc_False" + suffix)), 1)
          << c.flags << " prompt " << i;
    }
    EXPECT_TRUE(fs::exists(out / "timings.json")) << c.flags;
    for (int r = 0; r < c.np; ++r) {
      const fs::path report_path = out / ("timings_rank" + std::to_string(r) + ".json");
      ASSERT_TRUE(fs::exists(report_path)) << c.flags << " rank " << r;
      if (c.flags.find("--use_fsdp") != std::string::npos) {
        // FSDP within each data-parallel group: ranks {0,1} and {2,3} shard among themselves.
        auto report = nlohmann::json::parse(read(report_path));
        const auto& f = report["memory"]["fsdp"];
        EXPECT_EQ(f["group"], r < 2 ? "fsdp[0,1]" : "fsdp[2,3]") << report.dump();
        EXPECT_EQ(f["group_size"], 2);
        EXPECT_GT(f["gathers"].get<int64_t>(), 0);
        EXPECT_LT(f["shard_bytes"].get<int64_t>(), f["model_parameter_bytes"].get<int64_t>());
        EXPECT_LE(f["peak_resident_parameter_bytes"].get<int64_t>(),
                  f["bound_bytes"].get<int64_t>());
        EXPECT_EQ(report["config"]["use_fsdp"], true);
        // The layout: every rank's host, and this rank's groups with their members' hosts.
        const auto& layout = report["layout"];
        EXPECT_EQ(layout["hosts"].size(), 4u) << layout.dump();
        const std::string fsdp_group = r < 2 ? "fsdp[0,1]" : "fsdp[2,3]";
        ASSERT_TRUE(layout["groups"].contains(fsdp_group)) << layout.dump();
        EXPECT_EQ(layout["groups"][fsdp_group].size(), 2u);
        EXPECT_EQ(layout["groups"][fsdp_group][0], layout["hosts"][r < 2 ? 0 : 2]);
        continue;
      }
      if (c.flags != "--ulysses_degree 2") continue;
      // Every rank reports its Ulysses all-to-alls: 2 per attention layer per step (tiny-flux:
      // 2 double + 2 single blocks, 2 steps, true CFG doubles the forwards).
      auto report = nlohmann::json::parse(read(report_path));
      const auto& a2a = report["iterations"][0]["comm"]["ulysses[0,1]"]["all_to_all"];
      EXPECT_EQ(a2a["calls"], 2 * 4 * 2 * 2) << report.dump();
      EXPECT_GT(a2a["bytes"].get<int64_t>(), 0);
    }
  }
}

TEST_F(XfuserRun, UnderMpirunABadLayoutFailsOnEveryRank) {
  setenv("XFUSER_CACHE", cache_->path().c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  xfuser::testing::TempDir out;
  std::string log;
  int code = xfuser::testing::run_command(
      xfuser::testing::mpirun_prefix(2) + bin +
          " --model tiny-flux --prompt x --ulysses_degree 4 --output_directory " +
          out.path().string(),
      &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 124) << "timed out: " << log;  // `timeout` exit code: a hang
  EXPECT_NE(log.find("ulysses 4"), std::string::npos) << log;
  EXPECT_NE(log.find("world size is 2"), std::string::npos) << log;
  // CFG parallel without a negative prompt: named, every rank ends.
  code = xfuser::testing::run_command(
      xfuser::testing::mpirun_prefix(2) + bin +
          " --model tiny-flux --prompt x --height 32 --width 32 --use_cfg_parallel "
          "--output_directory " +
          out.path().string(),
      &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 124) << "timed out: " << log;
  EXPECT_NE(log.find("--use_cfg_parallel needs true CFG"), std::string::npos) << log;
  // FSDP with tensor parallelism: refused by name on every rank.
  code = xfuser::testing::run_command(
      xfuser::testing::mpirun_prefix(2) + bin +
          " --model tiny-flux --prompt x --height 32 --width 32 --use_fsdp "
          "--tensor_parallel_degree 2 --output_directory " +
          out.path().string(),
      &log);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 124) << "timed out: " << log;
  EXPECT_NE(log.find("--use_fsdp with --tensor_parallel_degree 2 is not supported"),
            std::string::npos)
      << log;
}

TEST_F(XfuserRun, ARankThatThrowsMidStepEndsTheWholeJob) {
  setenv("XFUSER_CACHE", cache_->path().c_str(), 1);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  xfuser::testing::TempDir out;
  std::string log;
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 throws at step 1 while rank 0 waits for it inside a Ulysses all-to-all; a generous
  // --comm_timeout proves the job ends by MPI_Abort, not by the timeout.
  const int code = xfuser::testing::run_command(
      "XFUSER_INJECT_FAILURE=1:1 " + xfuser::testing::mpirun_prefix(2) +
          "-x XFUSER_INJECT_FAILURE " + bin +
          " --model tiny-flux --prompt x --height 64 --width 64 --num_inference_steps 3 "
          "--ulysses_degree 2 --comm_timeout 300 --output_directory " +
          out.path().string(),
      &log);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(code, 124) << "timed out: " << log;
  EXPECT_LT(seconds, 60.0) << log;
  EXPECT_NE(log.find("injected failure"), std::string::npos) << log;
  EXPECT_NE(log.find("[rank 1]"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "timings.json"));
}

TEST_F(XfuserRun, ForwardToolUnderMpirunEqualsTheFixture) {
  const fs::path fixture = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "flux-tiny-s1";
  XF_REQUIRE_FIXTURE(fixture);
  const std::string bin = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  struct Case {
    int np;
    std::string flags;
  };
  for (const Case& c : {Case{2, "--ulysses_degree 2"}, Case{2, "--ring_degree 2"},
                        Case{4, "--ulysses_degree 2 --ring_degree 2"},
                        Case{4, "--ulysses_degree 4"}, Case{2, "--tensor_parallel_degree 2"},
                        Case{4, "--tensor_parallel_degree 2 --ulysses_degree 2"}}) {
    xfuser::testing::TempDir out;
    std::string log;
    ASSERT_EQ(xfuser::testing::run_command(
                  xfuser::testing::mpirun_prefix(c.np) + bin + " forward --model-dir " +
                      fixture.string() + " --inputs " + (fixture / "inputs.safetensors").string() +
                      " --output " + (out / "out.safetensors").string() + " " + c.flags,
                  &log),
              0)
        << c.flags << "\n"
        << log;
    xfuser::models::SafetensorsFile got((out / "out.safetensors").string());
    xfuser::models::SafetensorsFile want((fixture / "output.safetensors").string());
    const double rel = xfuser::testing::max_rel_error(got.get("sample"), want.get("sample"));
    EXPECT_LE(rel, 1e-4) << c.flags;
    std::printf("xfuser forward %-36s rel %.2e\n", c.flags.c_str(), rel);
  }
}

TEST_F(XfuserRun, TheApiExampleGeneratesAnImage) {
  const fs::path example = xfuser::testing::binary_dir() / "bin" / "xfuser-example-generate";
  if (!fs::exists(example)) GTEST_SKIP() << "examples not built (XFUSER_BUILD_EXAMPLES=OFF)";
  xfuser::testing::TempDir out;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command("XFUSER_CACHE=" + cache_->path().string() + " " +
                                             example.string() + " 'a dog' " + out.path().string(),
                                         &log),
            0)
      << log;
  at::Tensor img = xfuser::runner::read_png(out / "tiny-flux_u1r1_tc_False_256x256_0.png");
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{256, 256, 3}));
}

// --task on a multi-task model (xDiT's runner's valid_tasks): HunyuanVideo-1.5 with i2v runs the
// image-to-video pipeline and adds the task to the output name; a folder of the other pipeline, an
// unknown task and a model of one task are refused by name.
TEST_F(XfuserRun, TaskPicksThePipelineOfAMultiTaskModel) {
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  xfuser::testing::TempDir dir, out;
  std::string log;
  for (const char* arch : {"hunyuan-video15", "hunyuan-video15-i2v"}) {
    ASSERT_EQ(xfuser::testing::run_command(
                  tool + " make-tiny --arch " + arch + " --out " + (dir / arch).string(), &log),
              0)
        << log;
  }
  xfuser::runner::write_png(dir / "first.png", at::full({32, 48, 3}, 90, at::kByte));
  const std::string base =
      "--model HunyuanVideo-1.5 --prompt x --num_inference_steps 1 "
      "--num_frames 5 --output_directory " +
      out.path().string();
  ASSERT_EQ(run(base + " --task i2v --model_path " + (dir / "hunyuan-video15-i2v").string() +
                    " --input_images " + (dir / "first.png").string(),
                &log),
            0)
      << log;
  bool found = false;
  for (const auto& entry : fs::directory_iterator(out.path())) {
    const std::string name = entry.path().filename().string();
    found = found || (name.rfind("HunyuanVideo-1.5-I2V_u1r1_tc_False_", 0) == 0 &&
                      name.find("_i2v_0.mp4") != std::string::npos);
  }
  EXPECT_TRUE(found) << log;
  EXPECT_NE(run(base + " --task i2v --model_path " + (dir / "hunyuan-video15").string(), &log), 0);
  EXPECT_NE(log.find("--task i2v runs HunyuanVideo-1.5-I2V (a HunyuanVideo15ImageToVideoPipeline)"),
            std::string::npos)
      << log;
  EXPECT_NE(run(base + " --task x2y", &log), 0);
  EXPECT_NE(log.find("--task 'x2y' is not a task of HunyuanVideo-1.5 (i2v, t2v)"),
            std::string::npos)
      << log;
  EXPECT_NE(run("--model tiny-flux --prompt x --task t2i", &log), 0);
  EXPECT_NE(log.find("--task is not supported by model tiny-flux: it has one task (text-to-image)"),
            std::string::npos)
      << log;
}

// `xfuser validate` agrees with xfuser-run both ways: every tiny pipeline layout validates, and a
// folder the run refuses is refused by validate with the same reason, before any weight is read.
TEST_F(XfuserRun, ValidateAgreesWithTheRun) {
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  xfuser::testing::TempDir dir, out;
  std::string log;
  for (const char* arch :
       {"flux", "flux-kontext", "flux2", "sd3", "sd3-no-t5", "wan-t2v", "wan-i2v", "wan22-t2v",
        "wan22-i2v", "hunyuan-video", "hunyuan-video15", "hunyuan-video15-i2v"}) {
    ASSERT_EQ(xfuser::testing::run_command(
                  tool + " make-tiny --arch " + arch + " --out " + (dir / arch).string(), &log),
              0)
        << log;
    EXPECT_EQ(xfuser::testing::run_command(
                  tool + " validate --model_path " + (dir / arch).string() + " --prompt x", &log),
              0)
        << arch << "\n"
        << log;
    EXPECT_NE(log.find("\nvalid"), std::string::npos) << arch << "\n" << log;
  }
  // An edit of one JSON file of the folder, by its path in the folder.
  using Change = std::function<void(nlohmann::json&)>;
  auto edit = [](const std::string& file, const Change& change) {
    return [file, change](const fs::path& p) {
      std::ifstream in(p / file);
      auto j = nlohmann::json::parse(in);
      change(j);
      std::ofstream(p / file) << j.dump();
    };
  };
  // The FLUX.1 tiny layout's transformer in place of the folder's own.
  auto flux_transformer = [&](const fs::path& p) {
    fs::remove_all(p / "transformer");
    fs::copy(dir / "flux" / "transformer", p / "transformer", fs::copy_options::recursive);
  };
  struct Broken {
    std::string name, arch;
    std::function<void(const fs::path&)> edit;
    std::string expected;
  };
  const std::vector<Broken> broken = {
      {"no-boundary", "wan22-t2v",
       edit("model_index.json", [](auto& j) { j.erase("boundary_ratio"); }),
       "lists a transformer_2 but no boundary_ratio in (0, 1)"},
      {"boundary-2", "wan22-t2v",
       edit("model_index.json", [](auto& j) { j["boundary_ratio"] = 2.0; }),
       "lists a transformer_2 but no boundary_ratio in (0, 1)"},
      {"boundary-high", "wan22-t2v",
       edit("model_index.json", [](auto& j) { j["boundary_ratio"] = "high"; }),
       "'boundary_ratio' is a pipeline setting and must be a number, got \"high\""},
      {"flow-shift-0", "wan-t2v",
       edit("scheduler/scheduler_config.json", [](auto& j) { j["flow_shift"] = 0; }),
       "scheduler config: flow_shift must be a number in (0, 1000] (got 0)"},
      {"shift-negative", "hunyuan-video15",
       edit("scheduler/scheduler_config.json", [](auto& j) { j["shift"] = -3; }),
       "scheduler config: shift must be a number in (0, 1000] (got -3)"},
      {"flux2-over-flux1", "flux2", flux_transformer,
       "transformer/config.json holds a FluxTransformer2DModel, but FLUX.2-dev needs a "
       "Flux2Transformer2DModel as its transformer"},
      {"wan-layers-huge", "wan-t2v",
       edit("transformer/config.json", [](auto& j) { j["num_layers"] = 1000000000; }),
       "config key 'num_layers' = 1000000000 is out of range for a layer or block count"},
      {"hunyuan-heads-negative", "hunyuan-video",
       edit("transformer/config.json", [](auto& j) { j["num_attention_heads"] = -1; }),
       "config key 'num_attention_heads' = -1 is out of range for a head count"},
      {"flux2-width-huge", "flux2",
       edit("transformer/config.json", [](auto& j) { j["attention_head_dim"] = 1LL << 40; }),
       "config key 'attention_head_dim' = 1099511627776 is out of range"},
      {"flux-over-wan", "wan-t2v", flux_transformer,
       "holds a FluxTransformer2DModel, but Wan2.1-T2V needs a WanTransformer3DModel"},
  };
  for (const auto& b : broken) {
    const fs::path p = dir / b.name;
    fs::copy(dir / b.arch, p, fs::copy_options::recursive);
    b.edit(p);
    const std::string args = " --model_path " + p.string() + " --prompt x --num_inference_steps 1" +
                             " --output_directory " + out.path().string();
    EXPECT_NE(xfuser::testing::run_command(tool + " validate" + args, &log), 0) << b.name;
    EXPECT_NE(log.find(b.expected), std::string::npos) << b.name << " (validate)\n" << log;
    EXPECT_NE(run(args, &log), 0) << b.name;
    EXPECT_NE(log.find(b.expected), std::string::npos) << b.name << " (xfuser-run)\n" << log;
    EXPECT_EQ(log.find("] loading "), std::string::npos) << b.name << " (xfuser-run)\n" << log;
  }
  EXPECT_TRUE(fs::is_empty(out.path()));
}

TEST_F(XfuserRun, ValidateChecksFlagsMeshAndWeightsWithoutRunning) {
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  xfuser::testing::TempDir dir, out;
  std::string log;
  ASSERT_EQ(xfuser::testing::run_command(
                tool + " make-tiny --arch flux --out " + (dir / "pipe").string(), &log),
            0)
      << log;
  const std::string base = tool + " validate --model tiny-flux --model_path " +
                           (dir / "pipe").string() + " --prompt x --output_directory " +
                           out.path().string();
  ASSERT_EQ(xfuser::testing::run_command(base + " --ulysses_degree 2 --world_size 2", &log), 0)
      << log;
  EXPECT_NE(log.find("transformer: ok (FluxTransformer2DModel"), std::string::npos) << log;
  EXPECT_NE(log.find("valid"), std::string::npos) << log;
  EXPECT_NE(log.find("layout: ok"), std::string::npos) << log;
  EXPECT_NE(log.find("memory: ok (about "), std::string::npos) << log;
  EXPECT_TRUE(fs::is_empty(out.path()));  // nothing generated or written
  // Layouts that pass the mesh but not the model fail here as in xfuser-run
  // (the same check, before any weight is read), and absurd guidance is refused.
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--use_cfg_parallel --world_size 2", "--use_cfg_parallel needs true CFG"},
           {"--tensor_parallel_degree 3 --world_size 3",
            "--tensor_parallel_degree 3 does not divide the 2 attention heads"},
           {"--pipefusion_parallel_degree 5 --world_size 5",
            "--pipefusion_parallel_degree 5 exceeds the 4 transformer blocks"},
           // 256x256 is 16 token rows: 17 patches cannot be cut from them.
           {"--pipefusion_parallel_degree 2 --num_pipeline_patch 17 --world_size 2",
            "--num_pipeline_patch 17 must be between 1 and the 16 latent token rows"},
           {"--guidance_scale 1e30", "--guidance_scale must be at most 1000"},
           {"--height 16384 --width 16384 --prompt y --prompt z --prompt w --prompt v "
            "--prompt u --prompt t --prompt s",
            "this run needs about"}}) {
    EXPECT_NE(xfuser::testing::run_command(base + " " + flags, &log), 0) << flags;
    EXPECT_NE(log.find(expected), std::string::npos) << flags << "\n" << log;
    EXPECT_EQ(log.find("transformer: ok"), std::string::npos) << flags << "\n" << log;
  }
  // Degrees that do not fit the world size.
  EXPECT_NE(xfuser::testing::run_command(base + " --ulysses_degree 2", &log), 0);
  EXPECT_NE(log.find("but the world size is 1"), std::string::npos) << log;
  // A config that no longer matches the weights: the missing tensors are named.
  {
    std::ifstream in(dir / "pipe" / "transformer" / "config.json");
    auto config = nlohmann::json::parse(in);
    config["num_layers"] = 3;
    std::ofstream(dir / "pipe" / "transformer" / "config.json") << config.dump();
  }
  EXPECT_NE(xfuser::testing::run_command(base, &log), 0);
  EXPECT_NE(log.find("transformer_blocks.2.attn.to_q.weight"), std::string::npos) << log;
}
