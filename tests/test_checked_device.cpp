// Device correctness without a GPU, on the checked device (tests/checked_device.h: host memory
// that is another device, with a CUDA kernel's device checks on every operator):
// - every component fixture (tests/fixtures/<library>-v*/<case>/: config.json, weights,
//   inputs.safetensors) loaded there through the load options and called there: outputs on the
//   device and equal to the CPU run (the same CPU kernels on copies: within 2e-5); a transformer's
//   forward reads nothing of the device's on the host (a GPU sync per step), HunyuanVideo-1.5
//   excepted (counted);
// - every committed tiny pipeline (all eight contract models) there against diffusers' final
//   latents and pictures, from the same initial latents (tests/test_util.h check_pipeline);
// - the checker itself: a CPU tensor among device tensors fails naming the operator, argument
//   and shape; scalars pass; host reads are counted; views alias.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/dit/dit.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "tests/checked_device.h"
#include "tests/test_util.h"
#include "tests/tiny_pipelines.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::TensorMap;

struct Case {
  std::string name;  // "diffusers-v0.33.1/flux-tiny-s1"
  fs::path dir;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Every component fixture: a folder with a config.json, a case.json and inputs.safetensors.
std::vector<Case> component_cases() {
  std::vector<Case> cases;
  const fs::path root = xfuser::testing::fixtures_dir();
  if (!fs::exists(root)) return cases;
  for (const auto& library : fs::directory_iterator(root)) {
    const std::string lib = library.path().filename().string();
    if (!library.is_directory() ||
        (lib.rfind("diffusers-v", 0) != 0 && lib.rfind("transformers-v", 0) != 0)) {
      continue;
    }
    for (const auto& entry : fs::directory_iterator(library.path())) {
      const fs::path d = entry.path();
      if (fs::exists(d / "config.json") && fs::exists(d / "case.json") &&
          fs::exists(d / "inputs.safetensors")) {
        cases.push_back({lib + "/" + d.filename().string(), d});
      }
    }
  }
  std::sort(cases.begin(), cases.end(),
            [](const Case& a, const Case& b) { return a.name < b.name; });
  return cases;
}

// The calls a case makes: its method with every input, or for a VAE case ("encode, decode")
// encode on each `sample*` input and decode on each `z*` input, as tests/fixtures/generate.py
// calls them.
std::vector<std::pair<std::string, TensorMap>> calls_of(const nlohmann::json& case_json,
                                                        const TensorMap& inputs) {
  const std::string method = case_json.value("method", "forward");
  if (method != "encode, decode") return {{method, inputs}};
  std::vector<std::pair<std::string, TensorMap>> calls;
  for (const auto& [name, t] : inputs) {
    if (name.rfind("sample", 0) == 0) calls.push_back({"encode", {{"sample", t}}});
    if (name.rfind("z", 0) == 0) calls.push_back({"decode", {{"z", t}}});
  }
  return calls;
}

// The text of the exception `fn` throws ("" if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A test over parameters P that runs on the checked device (skipped where libtorch has none).
template <typename P>
class OnCheckedDevice : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    if (!xfuser::testing::checked_device_available()) {
      GTEST_SKIP() << "the checked device needs libtorch >= 2.4";
    }
    xfuser::models::register_builtin_components();
  }
};

using CheckedDevice = OnCheckedDevice<Case>;

TEST_P(CheckedDevice, ComponentRunsOnItsInputsDevice) {
  const Case& c = GetParam();
  const auto case_json = xfuser::testing::read_json(c.dir / "case.json");
  const c10::Device device = xfuser::testing::checked_device();
  const auto cpu = xfuser::models::load_component(c.dir.string(), at::kFloat);
  std::shared_ptr<xfuser::models::Component> component;
  try {
    component = xfuser::models::load_component(c.dir.string(), at::kFloat, device);
  } catch (const std::exception& e) {
    FAIL() << c.name << ": loading onto " << device << ": " << e.what();
  }
  for (const auto& [name, slot] : component->named_parameters()) {
    ASSERT_EQ(slot->tensor.device(), device) << c.name << ": parameter " << name;
  }
  const TensorMap host = xfuser::testing::read_tensors(c.dir / "inputs.safetensors");
  TensorMap inputs;
  for (const auto& [name, t] : host) inputs[name] = t.to(device);
  const auto host_calls = calls_of(case_json, host);
  const auto device_calls = calls_of(case_json, inputs);
  int checked = 0;
  for (size_t k = 0; k < device_calls.size(); ++k) {
    const std::string& method = device_calls[k].first;
    const TensorMap want = cpu->call(method, host_calls[k].second);
    TensorMap got;
    try {
      got = component->call(method, device_calls[k].second);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": " << component->class_name() << "." << method << " on "
                    << device << ": " << e.what();
      continue;
    }
    ASSERT_EQ(got.size(), want.size()) << c.name << ": " << method;
    for (const auto& [name, w] : want) {
      ASSERT_TRUE(got.count(name)) << c.name << ": " << method << " has no output " << name;
      const at::Tensor& g = got.at(name);
      EXPECT_EQ(g.device(), device) << c.name << ": " << method << " output " << name;
      EXPECT_EQ(g.sizes(), w.sizes()) << c.name << ": " << method << " output " << name;
      if (g.sizes() == w.sizes()) {
        // The same CPU kernels on copies (a convolution's input may differ in layout).
        EXPECT_LE(xfuser::testing::max_rel_error(g.cpu(), w), 2e-5)
            << c.name << ": " << method << " output " << name;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << c.name;

  // A transformer's forward reads nothing of the device's on the host: on a GPU each read would
  // synchronise every denoising step. HunyuanVideo-1.5 sizes its text stream from the masks
  // (diffusers drops the padding common to the batch) and tells T2V from I2V by its image
  // embeddings being zero: data-dependent shapes and branches, so its reads are counted only.
  if (auto dit = std::dynamic_pointer_cast<xfuser::models::dit::DiTTransformer>(component)) {
    const auto in = dit->parse_forward_inputs(inputs);
    const int64_t reads = xfuser::testing::checked_device_host_reads();
    (void)dit->forward(in);
    const int64_t forward_reads = xfuser::testing::checked_device_host_reads() - reads;
    std::printf("%s %s forward: %lld host reads\n", c.name.c_str(), component->class_name().c_str(),
                static_cast<long long>(forward_reads));
    RecordProperty("forward_host_reads", std::to_string(forward_reads));
    if (component->class_name() != "HunyuanVideo15Transformer3DModel") {
      EXPECT_EQ(forward_reads, 0) << c.name << ": host reads in " << component->class_name()
                                  << "'s forward (each a GPU synchronisation per step)";
    }
  }
}

// The checker itself: a CPU tensor among device tensors is an error naming the operator, the
// argument and its shape; 0-dim CPU tensors pass (as on CUDA); host reads are counted; views
// alias; results equal the CPU's.
TEST(CheckedDeviceBackend, CatchesACpuTensorAmongDeviceTensors) {
  if (!xfuser::testing::checked_device_available()) GTEST_SKIP() << "needs libtorch >= 2.4";
  const c10::Device device = xfuser::testing::checked_device();
  const at::Tensor x =
      at::arange(6, at::TensorOptions().dtype(at::kFloat).device(device)).reshape({2, 3});
  EXPECT_EQ(x.device(), device);
  // Elementwise operators check devices themselves (TensorIterator), the others here.
  EXPECT_NE(error_of([&] {
              (void)(x + at::ones({2, 3}));
            }).find("found at least two devices, xfcheck:0 and cpu"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              (void)at::cat({x, at::zeros({1, 3})});
            }).find("aten::cat.out argument 'tensors'[1] is a CPU tensor of shape [1, 3]"),
            std::string::npos)
      << error_of([&] {
           (void)at::cat({x, at::zeros({1, 3})});
         });
  EXPECT_NE(error_of([&] {
              (void)at::matmul(x, at::ones({3, 2}));
            }).find("is a CPU tensor of shape [3, 2]"),
            std::string::npos)
      << error_of([&] {
           (void)at::matmul(x, at::ones({3, 2}));
         });
  const at::Tensor y = x * at::scalar_tensor(2.0) + 1;  // a 0-dim CPU tensor is a scalar
  EXPECT_TRUE(at::equal(y.cpu(), at::arange(6, at::kFloat).reshape({2, 3}) * 2 + 1));

  const int64_t reads = xfuser::testing::checked_device_host_reads();
  EXPECT_EQ(x.sum().item<double>(), 15.0);
  (void)x.cpu();
  EXPECT_EQ(xfuser::testing::checked_device_host_reads(), reads + 2);

  at::Tensor z = at::zeros({2, 3}, x.options());
  z.select(0, 1).copy_(x.select(0, 0));  // a write through a view lands in z
  z.narrow(1, 0, 1).add_(5);
  EXPECT_TRUE(at::equal(z.cpu(), at::tensor({5, 0, 0, 5, 1, 2}, at::kFloat).reshape({2, 3})));
  EXPECT_GT(xfuser::testing::checked_device_ops(), 0);
}

// Every committed tiny pipeline (all eight contract models) on the checked device against
// diffusers' final latents and pictures, from the same initial latents: text encoders,
// transformer, scheduler and VAE, every tensor the pipeline makes.
using CheckedDevicePipeline = OnCheckedDevice<std::string>;

TEST_P(CheckedDevicePipeline, EqualsDiffusers) {
  const int64_t ops = xfuser::testing::checked_device_ops();
  const int64_t reads = xfuser::testing::checked_device_host_reads();
  xfuser::testing::check_pipeline(GetParam(), {}, xfuser::testing::checked_device());
  EXPECT_GT(xfuser::testing::checked_device_ops(), ops) << "nothing ran on the checked device";
  // Reads of device data on the host (each a synchronisation on a GPU), for the record.
  const int64_t host_reads = xfuser::testing::checked_device_host_reads() - reads;
  std::printf("%s: %lld operators on the checked device, %lld host reads\n", GetParam().c_str(),
              static_cast<long long>(xfuser::testing::checked_device_ops() - ops),
              static_cast<long long>(host_reads));
  RecordProperty("host_reads", std::to_string(host_reads));
}

INSTANTIATE_TEST_SUITE_P(Pipelines, CheckedDevicePipeline,
                         ::testing::ValuesIn(xfuser::testing::committed_tiny_pipelines()),
                         xfuser::testing::pipeline_test_name);

// The same pipelines with model and with sequential CPU offload onto the checked device: the
// weights load into host memory and move to the device per component (per block), so a weight
// read that bypasses the offloader is a host tensor among device tensors, which the checked
// device refuses by name. Equal to the run without offload (1e-6) and to diffusers. Kontext is
// left out here (its components are flux-tiny's, its VAE encoding of an input picture is also
// FLUX.2's and Wan I2V's; on the checked device it takes a minute): tests/test_offload_pipelines
// runs it on the CPU.
using CheckedDeviceOffload = OnCheckedDevice<std::tuple<std::string, xfuser::models::OffloadMode>>;

TEST_P(CheckedDeviceOffload, EqualsTheRunWithoutOffload) {
  const auto& [name, mode] = GetParam();
  xfuser::testing::check_pipeline(name, {}, xfuser::testing::checked_device(), {}, {}, mode);
}

INSTANTIATE_TEST_SUITE_P(
    Pipelines, CheckedDeviceOffload,
    ::testing::Combine(::testing::ValuesIn([] {
                         auto names = xfuser::testing::committed_tiny_pipelines();
                         names.erase(std::remove(names.begin(), names.end(), "kontext-tiny"),
                                     names.end());
                         return names;
                       }()),
                       ::testing::Values(xfuser::models::OffloadMode::kModel,
                                         xfuser::models::OffloadMode::kSequential)),
    [](const auto& info) {
      return xfuser::testing::gtest_name(
          std::get<0>(info.param) + "_" +
          xfuser::models::offload_mode_name(std::get<1>(info.param)));
    });

// Device memory under CPU offload, as the checked device's allocator counts it (as a GPU's
// allocated bytes): the run without offload holds its weights W on the device and needs A more at
// its peak (activations, temporaries); with an offload the device holds none of the weights after
// loading, at most the offloader's bound of them plus A at the peak, and none after the generation.
TEST(CheckedDeviceOffloadMemory, DevicePeakIsTheBoundPlusActivations) {
  if (!xfuser::testing::checked_device_available()) GTEST_SKIP() << "needs libtorch >= 2.4";
  namespace fs = std::filesystem;
  using xfuser::models::OffloadMode;
  xfuser::models::register_builtin_components();
  const c10::Device device = xfuser::testing::checked_device();
  for (const std::string name :
       {"flux-tiny", "sd3-tiny", "wan22-t2v-tiny", "hunyuan_video15-tiny"}) {
    SCOPED_TRACE(name);
    const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
    const fs::path refs = xfuser::testing::fixtures_dir() / "pipelines" / (name + ".ref");
    XF_REQUIRE_FIXTURE(folder);
    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(refs)) {
      if (e.is_directory()) cases.push_back(e.path());
    }
    ASSERT_FALSE(cases.empty());
    std::sort(cases.begin(), cases.end());
    const auto request = xfuser::testing::reference_case_request(cases.front());
    const auto& spec = xfuser::models::ModelRegistry::for_pipeline_folder(folder);
    xfuser::models::ModelLoadOptions options;
    options.device = device;
    const int64_t base = xfuser::testing::checked_device_allocated_bytes();
    // kept: what a model keeps on the device after a generation besides its weights (tables
    // cached for the next generation of the same size).
    int64_t weights = 0, activations = 0, kept = 0;
    {
      auto plain = spec.create(spec);
      plain->load(folder, options);
      weights = xfuser::testing::checked_device_allocated_bytes() - base;
      xfuser::testing::checked_device_reset_peak();
      const int64_t before = xfuser::testing::checked_device_allocated_bytes();
      {
        const auto out = plain->generate(request);
        kept = xfuser::testing::checked_device_allocated_bytes() - before -
               static_cast<int64_t>(out.latents.nbytes());
      }
      activations = xfuser::testing::checked_device_peak_bytes() - before;
    }
    for (const auto mode : {OffloadMode::kModel, OffloadMode::kSequential}) {
      SCOPED_TRACE(xfuser::models::offload_mode_name(mode));
      auto model = spec.create(spec);
      options.offload = mode;
      model->load(folder, options);
      const int64_t after_load = xfuser::testing::checked_device_allocated_bytes() - base;
      xfuser::testing::checked_device_reset_peak();
      const int64_t before = xfuser::testing::checked_device_allocated_bytes();
      int64_t left = 0;
      {
        const auto out = model->generate(request);
        left = xfuser::testing::checked_device_allocated_bytes() - before -
               static_cast<int64_t>(out.latents.nbytes());
      }
      const int64_t peak = xfuser::testing::checked_device_peak_bytes() - before;
      const auto s = model->offloader()->stats();
      std::printf(
          "%s, %s offload: weights %lld bytes, activations %lld; device after loading "
          "%lld, at the peak %lld (bound %lld + activations %lld), kept %lld (without "
          "offload %lld)\n",
          name.c_str(), xfuser::models::offload_mode_name(mode), static_cast<long long>(weights),
          static_cast<long long>(activations), static_cast<long long>(after_load),
          static_cast<long long>(peak), static_cast<long long>(s.bound_bytes),
          static_cast<long long>(activations), static_cast<long long>(left),
          static_cast<long long>(kept));
      EXPECT_LT(after_load, weights / 10) << "the weights went to the device while loading";
      EXPECT_LE(peak, s.bound_bytes + activations);
      EXPECT_LE(left, kept) << "weights left on the device after the generation";
    }
  }
}

std::string case_test_name(const ::testing::TestParamInfo<Case>& info) {
  return xfuser::testing::gtest_name(info.param.name);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CheckedDevice, ::testing::ValuesIn(component_cases()),
                         case_test_name);

// The discovery itself: every family's transformer and VAE and every text encoder has a case, so
// an empty or shrunken fixture tree fails here instead of passing with nothing checked.
TEST(CheckedDeviceCases, CoverEveryComponentClass) {
  std::set<std::string> classes;
  for (const Case& c : component_cases()) {
    classes.insert(xfuser::testing::read_json(c.dir / "case.json").value("class", ""));
  }
  for (const char* want : {"FluxTransformer2DModel",
                           "SD3Transformer2DModel",
                           "WanTransformer3DModel",
                           "HunyuanVideoTransformer3DModel",
                           "HunyuanVideo15Transformer3DModel",
                           "Flux2Transformer2DModel",
                           "AutoencoderKL",
                           "AutoencoderKLWan",
                           "AutoencoderKLHunyuanVideo",
                           "AutoencoderKLHunyuanVideo15",
                           "AutoencoderKLFlux2",
                           "CLIPTextModel",
                           "CLIPTextModelWithProjection",
                           "CLIPVisionModelWithProjection",
                           "T5EncoderModel",
                           "UMT5EncoderModel",
                           "LlamaModel",
                           "SiglipVisionModel",
                           "Mistral3ForConditionalGeneration",
                           "Qwen2_5_VLForConditionalGeneration"}) {
    EXPECT_TRUE(classes.count(want))
        << "no fixture case of " << want << " under " << xfuser::testing::fixtures_dir();
  }
}

}  // namespace
