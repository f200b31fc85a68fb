#include "tests/test_util.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "models/xfuser_model.h"
#include "runner/image_input.h"
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

namespace {

std::vector<std::string> strings(const nlohmann::json& j) {
  if (j.is_null()) return {};
  if (j.is_string()) return {j.get<std::string>()};
  return j.get<std::vector<std::string>>();
}

}  // namespace

models::GenerationRequest reference_case_request(const std::filesystem::path& dir) {
  std::ifstream in(dir / "case.json");
  const auto c = nlohmann::json::parse(in);
  models::GenerationRequest r;
  r.prompts = strings(c["prompt"]);
  const auto negatives = strings(c["negative_prompt"]);
  for (size_t i = 0; i < r.prompts.size() && !negatives.empty(); ++i) {
    r.negative_prompts.push_back(negatives.size() == 1 ? negatives[0] : negatives[i]);
  }
  r.height = c["height"];
  r.width = c["width"];
  r.num_inference_steps = c["num_inference_steps"];
  r.guidance_scale = c["guidance_scale"];
  r.true_cfg_scale = c.value("true_cfg_scale", 1.0);
  r.max_sequence_length = c["max_sequence_length"];
  r.num_frames = c.value("num_frames", 0);
  if (c.contains("guidance_scale_2") && !c["guidance_scale_2"].is_null()) {
    r.guidance_scale_2 = c["guidance_scale_2"].get<double>();
  }
  if (c.contains("input_image")) {
    r.input_images = {xfuser::runner::read_image(dir / c["input_image"].get<std::string>())};
  }
  if (c.contains("input_images")) {  // several pictures (FLUX.2 editing)
    for (const auto& file : c["input_images"]) {
      r.input_images.push_back(xfuser::runner::read_image(dir / file.get<std::string>()));
    }
  }
  r.seeds.assign(r.prompts.size(), 0);  // unused: the latents are given
  r.latents = xfuser::models::SafetensorsFile((dir / "latents.safetensors").string())
                  .get("latents")
                  .clone();
  return r;
}

void check_pipeline(const std::string& name, const std::filesystem::path& given_folder,
                    c10::Device device, const std::filesystem::path& given_refs,
                    const models::WeightFormat& transformer_weights, models::OffloadMode offload) {
  namespace fs = std::filesystem;
  const fs::path folder = given_folder.empty() ? fixtures_dir() / "pipelines" / name : given_folder;
  const fs::path refs =
      given_refs.empty() ? fixtures_dir() / "pipelines" / (name + ".ref") : given_refs;
  XF_REQUIRE_FIXTURE(folder);
  XF_REQUIRE_FIXTURE(refs);
  const auto& spec = models::ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  models::ModelLoadOptions options;  // fp32
  options.device = device;
  options.transformer_weights = transformer_weights;
  // With an offload: the same model without it, whose outputs the offloaded run must equal.
  std::unique_ptr<models::XFuserModel> plain;
  if (offload != models::OffloadMode::kNone) {
    plain = spec.create(spec);
    plain->load(folder, options);
    options.offload = offload;
  }
  model->load(folder, options);
  if (plain) {
    ASSERT_NE(model->offloader(), nullptr);
    const auto s = model->offloader()->stats();
    EXPECT_GE(s.components, 3) << "a pipeline has a text encoder, a transformer and a VAE";
    EXPECT_EQ(s.resident_bytes, 0) << "weights on the device before the first generation";
    if (offload == models::OffloadMode::kSequential) {
      EXPECT_GT(s.blocks, 0) << "no transformer block is streamed";
    }
  }
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(refs)) {
    if (!entry.is_directory()) continue;  // a case is a folder; files beside them describe them
    const fs::path dir = entry.path();
    SCOPED_TRACE(dir.string());
    const models::GenerationRequest r = reference_case_request(dir);
    const auto out = model->generate(r);
    if (plain) {
      const auto base = plain->generate(r);
      const double rel_plain = max_rel_error(out.latents.cpu(), base.latents.cpu());
      EXPECT_LE(rel_plain, 1e-6) << "final latents with " << models::offload_mode_name(offload)
                                 << " offload vs without";
      EXPECT_TRUE(at::equal(out.images.cpu(), base.images.cpu()))
          << "pixels with " << models::offload_mode_name(offload) << " offload vs without";
      const auto s = model->offloader()->stats();
      EXPECT_GT(s.onloads, 0);
      EXPECT_GT(s.peak_resident_bytes, 0);
      EXPECT_LE(s.peak_resident_bytes, s.bound_bytes)
          << "device bytes at the peak exceed the offload's bound";
      EXPECT_EQ(s.resident_bytes, 0) << "weights left on the device after the generation";
      if (offload == models::OffloadMode::kSequential) {
        EXPECT_GT(s.peak_streamed_bytes, 0) << "no transformer block was streamed";
        EXPECT_LE(s.peak_streamed_bytes, s.streamed_bound_bytes)
            << "the transformer held more than its resident part and two blocks";
      }
      std::printf(
          "%s/%s: %s offload: %d components, %d streamed blocks, device peak %lld "
          "bytes (largest component %lld, bound %lld; while streaming %lld, bound "
          "%lld), rel vs plain %.2e\n",
          name.c_str(), dir.filename().string().c_str(), models::offload_mode_name(offload),
          s.components, s.blocks, static_cast<long long>(s.peak_resident_bytes),
          static_cast<long long>(s.largest_component_bytes), static_cast<long long>(s.bound_bytes),
          static_cast<long long>(s.peak_streamed_bytes),
          static_cast<long long>(s.streamed_bound_bytes), rel_plain);
    }
    const at::Tensor want =
        xfuser::models::SafetensorsFile((dir / "final.safetensors").string()).get("latents");
    // The run reports the latents it started from, in the pipeline's own layout.
    EXPECT_TRUE(at::equal(out.initial_latents.cpu(), r.latents));
    EXPECT_EQ(out.latents.device(), device);
    ASSERT_EQ(out.latents.sizes(), want.sizes());
    const double rel = max_rel_error(out.latents.cpu(), want);
    EXPECT_LE(rel, 1e-4) << "final latents vs diffusers";
    std::printf("%s/%s on %s: final latents rel %.2e\n", name.c_str(),
                dir.filename().string().c_str(), device.str().c_str(), rel);
    if (fs::exists(dir / "image.safetensors")) {
      const at::Tensor image =
          xfuser::models::SafetensorsFile((dir / "image.safetensors").string()).get("image");
      const at::Tensor ref = (image * 255).round().to(at::kInt);  // [B, (F,) H, W, 3]
      ASSERT_EQ(out.images.sizes(), ref.sizes());
      const int diff = (out.images.cpu().to(at::kInt) - ref).abs().max().item<int>();
      EXPECT_LE(diff, 1) << "decoded image vs diffusers (levels of 255)";
    }
    ++cases;
  }
  EXPECT_GT(cases, 0) << "no reference cases under " << refs;
}

std::filesystem::path resaved_pipeline(const std::string& name, const std::string& version,
                                       const std::filesystem::path& into) {
  namespace fs = std::filesystem;
  const fs::path original = fixtures_dir() / "pipelines" / name;
  const fs::path overlay = fixtures_dir() / ("pipelines-v" + version) / name;
  XF_CHECK(fs::exists(original / "model_index.json") && fs::exists(overlay / "removed.json"),
           "missing fixture ", original, " or ", overlay / "removed.json");
  const fs::path folder = into / name;
  fs::copy(original, folder, fs::copy_options::recursive);
  std::ifstream in(overlay / "removed.json");
  const auto listing = nlohmann::json::parse(in);
  for (const auto& file : listing["removed"]) {
    XF_CHECK(fs::remove(folder / file.get<std::string>()), folder / file.get<std::string>(),
             " is listed as removed but is not in the pipeline");
  }
  for (const auto& file : listing["changed"]) {
    const fs::path rel = file.get<std::string>();
    fs::create_directories((folder / rel).parent_path());
    fs::copy_file(overlay / rel, folder / rel, fs::copy_options::overwrite_existing);
  }
  return folder;
}

void check_resaved_pipeline(const std::string& name, const std::string& version) {
  namespace fs = std::filesystem;
  const fs::path refs = fixtures_dir() / ("pipelines-v" + version) / (name + ".ref");
  XF_REQUIRE_FIXTURE(fixtures_dir() / ("pipelines-v" + version) / name / "removed.json");
  XF_REQUIRE_FIXTURE(refs);
  TempDir tmp("xfuser-resaved");
  check_pipeline(name, resaved_pipeline(name, version, tmp.path()), c10::Device(c10::kCPU), refs);
}

std::string png_declaring(uint32_t width, uint32_t height) {
  std::string png = xfuser::runner::encode_png(at::zeros({1, 1, 3}, at::kByte), {});
  // Signature (8), IHDR length (4), "IHDR" at 12, width at 16, height at 20, CRC of type + data
  // (17 bytes from 12) at 29.
  auto put32 = [&png](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xFF);
  };
  put32(16, width);
  put32(20, height);
  uint32_t crc = 0xFFFFFFFFU;  // CRC-32 (ISO 3309), as PNG's chunks use
  for (size_t i = 12; i < 29; ++i) {
    crc ^= static_cast<unsigned char>(png[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320U & (0U - (crc & 1U)));
  }
  put32(29, crc ^ 0xFFFFFFFFU);
  return png;
}

}  // namespace xfuser::testing
