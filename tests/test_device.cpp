// --device (backends/device.h): resolve_device on every branch from hand-made probes, the local
// rank from the launcher's variables, and the binaries on this build: --device cpu / auto run
// and report their device in timings_rank{r}.json; --device cuda on a build or host without CUDA
// exits non-zero on every rank naming the reason, without hanging (one rank and mpirun -np 2).
// Also: the binaries take std::filesystem from libstdc++ even where the libtorch exports copies
// of its own (PyTorch 2.11's wheel does; its remove_all crashed xfuser-run).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/device.h"
#include "backends/error.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::backends::DeviceProbe;
using xfuser::backends::resolve_device;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

// libtorch.so of some PyTorch wheels defines std::filesystem functions (a statically linked
// copy, exported). The build puts the shared libstdc++ first among each binary's libraries so
// that xfuser's calls bind to libstdc++'s: here, the function this binary calls is libstdc++'s,
// it works, and check_cxx_runtime() (xfuser-run's and xfuser's first step) agrees.
TEST(Toolchain, StdFilesystemComesFromLibstdcxx) {
  const std::string provider = xfuser::backends::std_filesystem_provider();
  EXPECT_NE(provider.find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all resolves into " << provider;
  EXPECT_NO_THROW(xfuser::backends::check_cxx_runtime());
  xfuser::testing::TempDir dir;
  fs::create_directories(dir / "a" / "b");
  std::ofstream(dir / "a" / "b" / "f") << "x";
  std::error_code ec;
  EXPECT_EQ(fs::remove_all(dir / "a", ec), 3u) << ec.message();
  EXPECT_FALSE(fs::exists(dir / "a"));
}

DeviceProbe probe(bool cuda, int gpus) {
  DeviceProbe p;
  p.libtorch_has_cuda = cuda;
  p.visible_gpus = gpus;
  p.cuda_visible_devices = "<unset>";
  return p;
}

TEST(ResolveDevice, AutoIsCudaOnlyWithACudaLibtorchAndAVisibleGpu) {
  EXPECT_EQ(resolve_device("auto", 0, probe(false, 0)), c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_device("auto", 3, probe(true, 0)), c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_device("auto", 0, probe(true, 2)), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(resolve_device("auto", 3, probe(true, 2)), c10::Device(c10::kCUDA, 1));
}

TEST(ResolveDevice, CudaTakesLocalRankModuloVisibleGpus) {
  for (int r = 0; r < 10; ++r) {
    EXPECT_EQ(resolve_device("cuda", r, probe(true, 4)), c10::Device(c10::kCUDA, r % 4)) << r;
  }
  EXPECT_EQ(resolve_device("cpu", 5, probe(true, 4)), c10::Device(c10::kCPU));
}

TEST(ResolveDevice, CudaWithoutOneNamesTheReason) {
  std::string msg = error_of([] { resolve_device("cuda", 0, probe(false, 0)); });
  EXPECT_NE(msg.find("--device cuda: this libtorch has no CUDA"), std::string::npos) << msg;
  DeviceProbe hidden = probe(true, 0);
  hidden.cuda_visible_devices = "";
  msg = error_of([&] { resolve_device("cuda", 0, hidden); });
  EXPECT_NE(msg.find("--device cuda: no GPU is visible"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA_VISIBLE_DEVICES="), std::string::npos) << msg;
  msg = error_of([] { resolve_device("gpu", 0, probe(true, 1)); });
  EXPECT_NE(msg.find("--device 'gpu' is not a device (expected auto, cpu or cuda)"),
            std::string::npos)
      << msg;
}

TEST(Fp32Math, Fp32OnCudaTurnsTf32OffOtherRunsKeepLibtorchSettings) {
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuDNN(true);
  ctx.setAllowTF32CuBLAS(true);
  xfuser::backends::set_fp32_math(at::kBFloat16, c10::Device(c10::kCUDA, 0));
  xfuser::backends::set_fp32_math(at::kFloat, c10::Device(c10::kCPU));
  EXPECT_TRUE(ctx.allowTF32CuDNN());  // a bf16 run, a CPU run: untouched
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  // Only the global flags change (no CUDA call), so this runs without a GPU too.
  xfuser::backends::set_fp32_math(at::kFloat, c10::Device(c10::kCUDA, 0));
  EXPECT_FALSE(ctx.allowTF32CuDNN());
  EXPECT_FALSE(ctx.allowTF32CuBLAS());
}

TEST(LocalRank, FromTheLauncher) {
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const std::string keep = saved ? saved : "";
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(xfuser::backends::local_rank_from_env(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);
  const std::string msg = error_of([] { xfuser::backends::local_rank_from_env(); });
  EXPECT_NE(msg.find("$OMPI_COMM_WORLD_LOCAL_RANK='x1' is not a local rank"), std::string::npos)
      << msg;
  if (saved) {
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", keep.c_str(), 1);
  } else {
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  }
}

// ---- the binaries on this build ---------------------------------------------------------------

std::string bin(const std::string& name) {
  return (xfuser::testing::binary_dir() / "bin" / name).string();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool host_has_cuda() { return at::hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0; }

// The reason this build/host gives for --device cuda.
std::string expected_reason() {
  return at::hasCUDA() ? "--device cuda: no GPU is visible"
                       : "--device cuda: this libtorch has no CUDA";
}

class DeviceRun : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  }
  const std::string run_ =
      " --model tiny-flux --prompt 'a cat' --height 32 --width 32 --num_inference_steps 2 "
      "--dtype fp32 --max_sequence_length 8";
};

TEST_F(DeviceRun, CpuAndAutoRunAndReportTheirDevice) {
  for (const std::string device : {"cpu", "auto"}) {
    xfuser::testing::TempDir out;
    std::string log;
    ASSERT_EQ(xfuser::testing::run_command(bin("xfuser-run") + run_ + " --device " + device +
                                               " --output_directory " + out.path().string(),
                                           &log),
              0)
        << log;
    const auto report = nlohmann::json::parse(read_file(out / "timings_rank0.json"));
    const std::string expected = device == "cpu" || !host_has_cuda() ? "cpu" : "cuda:0";
    EXPECT_EQ(report["device"], expected) << device;
  }
}

TEST_F(DeviceRun, CudaWithoutOneFailsOnEveryRankNamingTheReason) {
  if (host_has_cuda()) GTEST_SKIP() << "this host has CUDA";
  for (int np : {1, 2}) {
    xfuser::testing::TempDir out;
    std::string cmd = "timeout 120 ";
    if (np > 1) {
      cmd += "mpirun -np 2 --oversubscribe ";
      if (geteuid() == 0) cmd += "--allow-run-as-root ";
      cmd += "-x XFUSER_CACHE -x OMP_NUM_THREADS=1 ";
    }
    std::string log;
    const int rc = xfuser::testing::run_command(
        cmd + bin("xfuser-run") + run_ + " --ulysses_degree " + std::to_string(np) +
            " --device cuda --output_directory " + out.path().string(),
        &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(rc, 124) << "timed out (a hang): " << log;
    for (int r = 0; r < np; ++r) {
      EXPECT_NE(log.find("[rank " + std::to_string(r) + "] [error] " + expected_reason()),
                std::string::npos)
          << "np " << np << ", rank " << r << ": " << log;
    }
    EXPECT_EQ(log.find("loading"), std::string::npos) << "failed before loading: " << log;
    EXPECT_FALSE(fs::exists(out / "timings_rank0.json")) << log;
  }
}

TEST_F(DeviceRun, ForwardToolRefusesCudaWithoutOne) {
  if (host_has_cuda()) GTEST_SKIP() << "this host has CUDA";
  xfuser::testing::TempDir out;
  std::string log;
  const int rc = xfuser::testing::run_command(
      bin("xfuser") + " forward --model-dir " + out.path().string() + " --inputs " +
          (out / "in.safetensors").string() + " --output " + (out / "out.safetensors").string() +
          " --device cuda",
      &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find(expected_reason()), std::string::npos) << log;
}

TEST_F(DeviceRun, UnknownDeviceIsAFlagError) {
  std::string log;
  const int rc = xfuser::testing::run_command(bin("xfuser-run") + run_ + " --device gpu", &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--device"), std::string::npos) << log;
  EXPECT_NE(log.find("gpu"), std::string::npos) << log;
}

// --comm_backend nccl moves CUDA tensors only: on a CPU run it is an error naming both flags,
// before anything loads; an unknown backend is a flag error.
TEST_F(DeviceRun, CommBackendNcclNeedsCuda) {
  std::string log;
  int rc = xfuser::testing::run_command(
      bin("xfuser-run") + run_ + " --device cpu --comm_backend nccl", &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--comm_backend nccl needs --device cuda"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading"), std::string::npos) << log;
  rc = xfuser::testing::run_command(bin("xfuser-run") + run_ + " --comm_backend gloo", &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--comm_backend"), std::string::npos) << log;
}

// A CUDA attention kernel on a CPU run is an error naming the flag (xfuser-run before anything
// loads, and xfuser forward), and so is a bad XFUSER_ATTENTION_KERNEL.
TEST_F(DeviceRun, CudaAttentionKernelNeedsCuda) {
  std::string log;
  int rc = xfuser::testing::run_command(
      bin("xfuser-run") + run_ + " --device cpu --attention_backend flash", &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--attention_backend flash is a CUDA kernel: it needs --device cuda"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("loading"), std::string::npos) << log;
  xfuser::testing::TempDir out;
  rc = xfuser::testing::run_command(bin("xfuser") + " forward --model-dir " + out.path().string() +
                                        " --inputs " + (out / "in.safetensors").string() +
                                        " --output " + (out / "out.safetensors").string() +
                                        " --device cpu --attention_backend cudnn",
                                    &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("--attention_backend cudnn is a CUDA kernel"), std::string::npos) << log;
  rc = xfuser::testing::run_command(
      "XFUSER_ATTENTION_KERNEL=flash4 " + bin("xfuser-run") + run_ + " --device cpu", &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("XFUSER_ATTENTION_KERNEL: unknown attention kernel 'flash4'"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("loading"), std::string::npos) << log;
}

// On the CPU the uploader is what loading always did: a view when the dtype matches (no copy of
// a memory-mapped weight), else one conversion; nothing is counted as uploaded.
TEST(DeviceUploader, CpuIsAViewOrOneConversion) {
  xfuser::backends::DeviceUploader up(at::Device(at::kCPU));
  at::Tensor w = at::randn({4, 6});
  at::Tensor same = up.upload(w, at::kFloat);
  EXPECT_EQ(same.data_ptr(), w.data_ptr());
  at::Tensor strided = w.t();
  at::Tensor bf = up.upload(strided, at::kBFloat16);
  EXPECT_EQ(bf.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf, strided.to(at::kBFloat16)));
  up.finish();
  EXPECT_EQ(up.bytes_uploaded(), 0);
}

TEST(DeviceUploader, ErrorsNameTheDevice) {
  EXPECT_NE(error_of([] {
              xfuser::backends::DeviceUploader up(at::Device(at::kMeta));
            }).find("cannot be loaded to device meta"),
            std::string::npos);
  xfuser::backends::DeviceUploader up(at::Device(at::kCPU));
  const std::string msg = error_of([&] { up.upload(at::empty({2}, at::kMeta), at::kFloat); });
  EXPECT_NE(msg.find("the source tensor is on meta, expected host memory"), std::string::npos)
      << msg;
}

}  // namespace
