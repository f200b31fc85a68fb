#include "tests/test_util.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/safetensors.h"
#include "runner/outputs.h"

namespace xfuser::testing {

std::filesystem::path fixtures_dir() {
  if (const char* env = std::getenv("XFUSER_FIXTURES"); env && *env) return env;
  return std::filesystem::path(XFUSER_FIXTURES_DEFAULT).lexically_normal();
}

std::filesystem::path binary_dir() {
  if (const char* env = std::getenv("XFUSER_BINARY_DIR"); env && *env) return env;
  return XFUSER_BINARY_DIR;
}

std::filesystem::path source_dir() { return XFUSER_SOURCE_DIR; }

TempDir::TempDir(const std::string& tag) {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / (tag + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("could not create a temporary directory under " + base.string());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  auto a64 = a.to(at::kDouble);
  auto b64 = b.to(at::kDouble);
  double denom = b64.abs().max().item<double>();
  double num = (a64 - b64).abs().max().item<double>();
  if (denom == 0.0) return num;
  return num / denom;
}

int run_command(const std::string& command, std::string* output) {
  std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  std::string out;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string mpirun_prefix(int np, int timeout_seconds) {
  std::string cmd = timeout_seconds > 0 ? "timeout " + std::to_string(timeout_seconds) + " " : "";
  cmd += "mpirun -np " + std::to_string(np) + " --oversubscribe";
  if (::geteuid() == 0) cmd += " --allow-run-as-root";
  return cmd + " -x XFUSER_CACHE -x OMP_NUM_THREADS=1 ";
}

int max_pixel_diff(const std::filesystem::path& a, const std::filesystem::path& b) {
  at::Tensor x = xfuser::runner::read_png(a).to(at::kInt);
  at::Tensor y = xfuser::runner::read_png(b).to(at::kInt);
  if (x.sizes() != y.sizes()) return 1000;
  return (x - y).abs().max().item<int>();
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return nlohmann::json::parse(in);
}

std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path) {
  xfuser::models::SafetensorsFile file(path.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.get(name).clone();
  return out;
}

void expect_error_containing(const std::function<void()>& fn,
                             const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an xfuser::Error";
  } catch (const xfuser::Error& e) {
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
    }
  }
}

}  // namespace xfuser::testing
