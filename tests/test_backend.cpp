// The backend contract: wrap() walks compile -> override -> eager and records every attempt with
// its reason; the CPU backend's hand-written kernels compute the eager math; a FLUX forward with
// the kernels the runner resolves still matches diffusers' fixture.
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/device.h"
#include "backends/dtype.h"
#include "backends/kernels.h"
#include "backends/memory.h"
#include "backends/threads.h"
#include "models/common/component.h"
#include "models/common/kernels.h"
#include "models/common/layers.h"
#include "models/flux/flux_transformer.h"
#include "models/weights/safetensors.h"
#include "tests/test_util.h"

namespace {

using xfuser::backends::Backend;
using xfuser::backends::backend_for;
using xfuser::backends::NormModulateFn;
using xfuser::backends::RopeQkFn;
using xfuser::models::KernelScope;
using xfuser::models::KernelTable;
using xfuser::testing::max_rel_error;

using UnaryFn = at::Tensor(const at::Tensor&);

// The timeline entries of `tag` appended after index `from`.
xfuser::backends::BackendTimelineEntry last_entry(const Backend& b, const std::string& tag) {
  auto t = b.timeline();
  for (auto it = t.rbegin(); it != t.rend(); ++it) {
    if (it->tag == tag) return *it;
  }
  ADD_FAILURE() << "no timeline entry for " << tag;
  return {};
}

TEST(Backend, CpuHasNoCompilePathAndSaysWhy) {
  Backend& cpu = backend_for("cpu");
  EXPECT_EQ(cpu.name(), "cpu");
  EXPECT_TRUE(cpu.is_available());
  EXPECT_FALSE(cpu.capabilities().compile_available);
  auto fn = cpu.wrap<UnaryFn>(
      "test.unary_no_override", [](const at::Tensor& x) { return x * 2; }, /*try_compile=*/true);
  EXPECT_TRUE(at::equal(fn(at::ones({3})), at::full({3}, 2.0)));
  auto e = last_entry(cpu, "test.unary_no_override");
  ASSERT_EQ(e.attempts.size(), 3u);
  EXPECT_EQ(e.attempts[0].level, "compile");
  EXPECT_FALSE(e.attempts[0].ok);
  EXPECT_NE(e.attempts[0].reason.find("no compile path"), std::string::npos)
      << e.attempts[0].reason;
  EXPECT_EQ(e.attempts[1].level, "override");
  EXPECT_FALSE(e.attempts[1].ok);
  EXPECT_NE(e.attempts[1].reason.find("no override registered"), std::string::npos);
  EXPECT_EQ(e.attempts[2].level, "eager");
  EXPECT_TRUE(e.attempts[2].ok);
  EXPECT_EQ(e.chosen, "eager");
}

TEST(Backend, OverrideIsChosenAndCompileNotRequestedIsRecorded) {
  Backend& cpu = backend_for("cpu");
  cpu.register_override<UnaryFn>("test.unary", [](const at::Tensor& x) { return x * 3; });
  EXPECT_TRUE(cpu.has_override("test.unary"));
  auto fn = cpu.wrap<UnaryFn>(
      "test.unary", [](const at::Tensor& x) { return x * 2; }, false);
  EXPECT_TRUE(at::equal(fn(at::ones({2})), at::full({2}, 3.0)));
  auto e = last_entry(cpu, "test.unary");
  ASSERT_EQ(e.attempts.size(), 2u);
  EXPECT_NE(e.attempts[0].reason.find("not requested"), std::string::npos);
  EXPECT_TRUE(e.attempts[1].ok);
  EXPECT_EQ(e.chosen, "override");
  // Overrides can be switched off; the timeline says so.
  auto eager = cpu.wrap<UnaryFn>(
      "test.unary", [](const at::Tensor& x) { return x * 2; }, false,
      /*allow_override=*/false);
  EXPECT_TRUE(at::equal(eager(at::ones({2})), at::full({2}, 2.0)));
  e = last_entry(cpu, "test.unary");
  EXPECT_EQ(e.chosen, "eager");
  EXPECT_NE(e.attempts[1].reason.find("disabled"), std::string::npos);
}

TEST(Backend, OverrideWithAnotherSignatureFallsBackWithAReason) {
  Backend& cpu = backend_for("cpu");
  using BinaryFn = at::Tensor(const at::Tensor&, const at::Tensor&);
  cpu.register_override<BinaryFn>("test.mismatch",
                                  [](const at::Tensor& a, const at::Tensor& b) { return a + b; });
  auto fn = cpu.wrap<UnaryFn>(
      "test.mismatch", [](const at::Tensor& x) { return x + 1; }, true);
  EXPECT_TRUE(at::equal(fn(at::zeros({2})), at::ones({2})));
  auto e = last_entry(cpu, "test.mismatch");
  EXPECT_EQ(e.chosen, "eager");
  EXPECT_NE(e.attempts[1].reason.find("another signature"), std::string::npos);
}

TEST(Backend, UnknownDeviceIsNamed) {
  try {
    backend_for("tpu");
    FAIL() << "expected an error";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
  }
}

TEST(Backend, CpuMemoryStatsReadTheProcess) {
  auto m = backend_for("cpu").memory_stats();
  EXPECT_GT(m.peak_bytes, 0);
  EXPECT_GT(m.allocated_bytes, 0);
  EXPECT_GE(m.peak_bytes, m.allocated_bytes);
}

// The host tensor counter (the measured peaks beside the memory plan): a tensor adds exactly its
// bytes while it lives, the peak holds the most, a reset brings the peak down to what is held,
// and raw allocations (libtorch kernels' scratch) are counted and freed alike.
TEST(HostTensorMemory, CountsEveryTensorWhileItLives) {
  xfuser::track_host_tensor_memory();
  xfuser::track_host_tensor_memory();  // once only
  ASSERT_TRUE(xfuser::host_tensor_memory().tracked);
  const c10::Device cpu(c10::kCPU);
  xfuser::backends::reset_tensor_memory_peak(cpu);
  const auto before = xfuser::backends::tensor_memory(cpu);
  ASSERT_TRUE(before.available);
  EXPECT_EQ(before.peak, before.allocated);
  {
    at::Tensor a = at::ones({1000, 250}, at::kFloat);  // 1,000,000 bytes
    EXPECT_EQ(xfuser::host_tensor_memory().allocated - before.allocated, 1000000);
    at::Tensor b = at::empty({3, 7}, at::kBFloat16);  // 42 bytes
    EXPECT_EQ(xfuser::host_tensor_memory().allocated - before.allocated, 1000042);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u) << "64-byte aligned, as before";
    EXPECT_FLOAT_EQ(a.sum().item<float>(), 250000.0f);
  }
  const auto after = xfuser::backends::tensor_memory(cpu);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak - before.allocated, 1000042);
  xfuser::backends::reset_tensor_memory_peak(cpu);
  EXPECT_EQ(xfuser::backends::tensor_memory(cpu).peak, after.allocated);
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(4096);
  EXPECT_EQ(xfuser::host_tensor_memory().allocated - after.allocated, 4096);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(xfuser::host_tensor_memory().allocated, after.allocated);
  at::Tensor empty = at::empty({0}, at::kFloat);
  EXPECT_EQ(xfuser::host_tensor_memory().allocated, after.allocated);
}

// OMP_NUM_THREADS is honoured up to the cores available and capped beyond (libtorch would create
// a pool of that many threads); anything that is not a positive count falls back to a fair share.
TEST(Threads, OmpNumThreadsIsCappedAtTheCoresAndCheckedForSense) {
  using xfuser::threads_per_rank;
  EXPECT_EQ(threads_per_rank(nullptr, 8, 2), 4);
  EXPECT_EQ(threads_per_rank("", 8, 3), 2);
  EXPECT_EQ(threads_per_rank(nullptr, 2, 4), 1);
  EXPECT_EQ(threads_per_rank("3", 8, 2), 3);
  EXPECT_EQ(threads_per_rank("4,2", 8, 1), 4);  // an OpenMP list: the first level
  EXPECT_EQ(threads_per_rank("8", 8, 1), 8);
  EXPECT_EQ(threads_per_rank("9", 8, 1), 8);
  EXPECT_EQ(threads_per_rank("100000", 8, 1), 8);
  for (const char* bad : {"0", "-3", "abc", "4x", " "}) {
    EXPECT_EQ(threads_per_rank(bad, 8, 2), 4) << bad;
  }
  EXPECT_GE(xfuser::available_cores(), 1);
}

// Half-type GEMMs on a CPU that cannot multiply them natively run in float32 on the widened
// operands: the same products and float32 sums as a native bf16 kernel, rounded once. Whichever
// path this CPU takes, the result is the float32 product of the same values, rounded to bf16.
TEST(WidenedProducts, HalfTypeLinearOnTheCpuIsTheFloatProductRoundedOnce) {
  using xfuser::backends::widen_cpu_products;
  EXPECT_FALSE(widen_cpu_products(at::zeros({2}, at::kFloat)));
  EXPECT_TRUE(widen_cpu_products(at::zeros({2}, at::kHalf)));
  EXPECT_EQ(widen_cpu_products(at::zeros({2}, at::kBFloat16)),
            !xfuser::backends::cpu_has_native_bf16());
  at::manual_seed(3);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto x = at::randn({37, 96}).to(dtype), w = at::randn({80, 96}).to(dtype);
    auto b = at::randn({80}).to(dtype);
    at::Tensor y = xfuser::models::linear(x, w, b);
    ASSERT_EQ(y.scalar_type(), dtype);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{37, 80}));
    at::Tensor want = at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat));
    // At most one rounding of the result (2^-8 relative for bf16, 2^-11 for fp16), plus float32
    // sums in another order.
    const double ulp = dtype == at::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    at::Tensor err = (y.to(at::kFloat) - want).abs() - want.abs() * ulp;
    EXPECT_LE(err.max().item<double>(), 1e-4) << c10::toString(dtype);
  }
}

// The video VAEs' 3-D convolution: oneDNN on float32 CPU tensors (where libtorch has it), ATen's
// own kernel otherwise; either way at::conv3d's result, with strides, zero padding and without a
// bias, on the small batch-1 inputs that ATen itself would send to its im2col kernel.
TEST(Kernels, Conv3dEqualsAtenConv3d) {
  c10::InferenceMode guard;
  at::manual_seed(4);
  struct Case {
    std::vector<int64_t> x, w, stride, padding;
    bool bias;
  };
  for (const Case& c : {Case{{1, 4, 5, 9, 11}, {6, 4, 3, 3, 3}, {1, 1, 1}, {0, 1, 1}, true},
                        Case{{1, 3, 4, 8, 8}, {5, 3, 3, 3, 3}, {1, 2, 2}, {0, 0, 0}, true},
                        Case{{2, 2, 3, 6, 7}, {4, 2, 1, 1, 1}, {1, 1, 1}, {0, 0, 0}, false}}) {
    auto x = at::randn(c.x), w = at::randn(c.w);
    at::Tensor b = c.bias ? at::randn({c.w[0]}) : at::Tensor();
    at::Tensor want = at::conv3d(x, w, b, c.stride, c.padding);
    at::Tensor got = xfuser::backends::conv3d(x, w, b, c.stride, c.padding);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE(((got - want).abs().max() / want.abs().max()).item<double>(), 1e-5);
    at::Tensor half =
        xfuser::backends::conv3d(x.to(at::kBFloat16), w.to(at::kBFloat16),
                                 c.bias ? b.to(at::kBFloat16) : b, c.stride, c.padding);
    EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  }
  EXPECT_THROW(xfuser::backends::conv3d(at::randn({1, 4, 5, 9}), at::randn({6, 4, 3, 3, 3}), {},
                                        {1, 1, 1}, {0, 0, 0}),
               xfuser::Error);
}

TEST(Kernels, NormModulateFusedMatchesEager) {
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int64_t b : {1, 3}) {
    auto x = at::empty({b, 37, 64}).normal_(0.5, 2.0, gen);  // [B, S, D]
    auto shift = at::empty({b, 64}).normal_(0, 1, gen);
    auto scale = at::empty({b, 64}).normal_(0, 1, gen);
    auto ref = xfuser::backends::norm_modulate_eager(x, shift, scale, 1e-6);
    auto got = xfuser::backends::norm_modulate_fused(x, shift, scale, 1e-6);
    EXPECT_LE(max_rel_error(got, ref), 1e-6) << "B=" << b;
    // bf16: the fused kernel rounds once, the eager ops three times.
    auto refb = xfuser::backends::norm_modulate_eager(x.to(at::kBFloat16), shift.to(at::kBFloat16),
                                                      scale.to(at::kBFloat16), 1e-6);
    auto gotb = xfuser::backends::norm_modulate_fused(x.to(at::kBFloat16), shift.to(at::kBFloat16),
                                                      scale.to(at::kBFloat16), 1e-6);
    EXPECT_EQ(gotb.scalar_type(), at::kBFloat16);
    EXPECT_LE(max_rel_error(gotb, ref), 1.6e-2) << "B=" << b;
    EXPECT_LE(max_rel_error(refb, ref), 1.6e-2) << "B=" << b;
  }
  // A batch-1 modulation broadcast over B rows.
  auto x = at::empty({2, 5, 16}).normal_(0, 1, gen);
  auto shift = at::empty({1, 16}).normal_(0, 1, gen), scale = at::empty({1, 16}).normal_(0, 1, gen);
  EXPECT_LE(max_rel_error(xfuser::backends::norm_modulate_fused(x, shift, scale, 1e-6),
                          xfuser::backends::norm_modulate_eager(x, shift, scale, 1e-6)),
            1e-6);
  EXPECT_THROW(xfuser::backends::norm_modulate_fused(x, at::zeros({2, 8}), scale, 1e-6),
               xfuser::Error);
}

TEST(Kernels, RopeQkFusedMatchesApplyRotaryEmb) {
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const int64_t s = 24, d = 32;
  auto ids = at::stack({at::zeros({s}), at::arange(s, at::kFloat), at::arange(s, at::kFloat) * 2},
                       1);  // [S, 3]
  auto rope = xfuser::models::multi_axis_rope(ids, {8, 12, 12}, 10000.0);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto q = at::empty({2, s, 3, d}).normal_(0, 1, gen).to(dtype);
    // k as a strided view (a slice of a wider projection), as the models produce it.
    auto k = at::empty({2, s, 3, 2 * d}).normal_(0, 1, gen).to(dtype).narrow(3, 0, d);
    auto [qf, kf] = xfuser::backends::rope_qk_fused(q, k, rope.cos, rope.sin);
    auto qr = xfuser::models::apply_rotary_emb(q, rope);
    auto kr = xfuser::models::apply_rotary_emb(k, rope);
    EXPECT_EQ(qf.scalar_type(), dtype);
    const double tol = dtype == at::kFloat ? 1e-6 : 8e-3;
    EXPECT_LE(max_rel_error(qf, qr), tol);
    EXPECT_LE(max_rel_error(kf, kr), tol);
  }
}

TEST(Kernels, ScopeInstallsAndRestoresTheTable) {
  const auto& eager = KernelTable::eager();
  EXPECT_EQ(&xfuser::models::kernels(), &eager);
  KernelTable resolved = KernelTable::resolve(backend_for("cpu"), /*try_compile=*/true);
  {
    KernelScope scope(&resolved);
    EXPECT_EQ(&xfuser::models::kernels(), &resolved);
    {
      KernelScope inner(nullptr);
      EXPECT_EQ(&xfuser::models::kernels(), &eager);
    }
    EXPECT_EQ(&xfuser::models::kernels(), &resolved);
  }
  EXPECT_EQ(&xfuser::models::kernels(), &eager);
  auto e = last_entry(backend_for("cpu"), "norm_modulate");
  EXPECT_EQ(e.chosen, "override");
  e = last_entry(backend_for("cpu"), "rope_qk");
  EXPECT_EQ(e.chosen, "override");
}

// The fixture forward with the CPU backend's kernels: still diffusers' numbers.
TEST(Kernels, FluxFixtureWithOverrides) {
  const auto dir = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "flux-tiny-s1";
  XF_REQUIRE_FIXTURE(dir / "output.safetensors");
  c10::InferenceMode guard;
  std::ifstream cf(dir / "config.json");
  auto model = std::make_shared<xfuser::models::flux::FluxTransformer2DModel>(
      xfuser::models::flux::FluxConfig::from_json(nlohmann::json::parse(cf),
                                                  (dir / "config.json").string()));
  xfuser::models::SafetensorsFile weights((dir / "diffusion_pytorch_model.safetensors").string());
  model->load(weights, at::kFloat);
  auto read = [](const std::filesystem::path& p) {
    xfuser::models::SafetensorsFile f(p.string());
    xfuser::models::TensorMap m;
    for (const auto& n : f.names()) m[n] = f.get(n).clone();
    return m;
  };
  auto inputs = read(dir / "inputs.safetensors");
  auto expected = read(dir / "output.safetensors").at("sample");
  KernelTable resolved = KernelTable::resolve(backend_for("cpu"), true);
  KernelScope scope(&resolved);
  auto out = model->call("forward", inputs).at("sample");
  const double err = max_rel_error(out, expected);
  std::cout << "[ flux fp32 with cpu overrides vs diffusers ] " << err << "\n";
  EXPECT_LE(err, 1e-4);
}

}  // namespace
