// Every tiny pipeline with --enable_model_cpu_offload and with --enable_sequential_cpu_offload:
// the final latents equal diffusers' (the reference cases) and the same run without offload
// (1e-6), the offloader's device bytes stay within its bound (the largest component; the
// transformer's resident part + two blocks), and nothing is left on the device after a
// generation. On the CPU the device copies are the host tensors themselves; the checked-device
// variant of this test (test_checked_device) moves them for real.
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "models/common/offload.h"
#include "tests/test_util.h"
#include "tests/tiny_pipelines.h"

namespace {

using xfuser::models::OffloadMode;

class OffloadPipeline : public ::testing::TestWithParam<std::tuple<std::string, OffloadMode>> {};

TEST_P(OffloadPipeline, EqualsTheRunWithoutOffload) {
  const auto& [name, mode] = GetParam();
  xfuser::testing::check_pipeline(name, {}, c10::Device(c10::kCPU), {}, {}, mode);
}

INSTANTIATE_TEST_SUITE_P(
    Families, OffloadPipeline,
    ::testing::Combine(::testing::ValuesIn(xfuser::testing::committed_tiny_pipelines()),
                       ::testing::Values(OffloadMode::kModel, OffloadMode::kSequential)),
    [](const auto& info) {
      return xfuser::testing::gtest_name(
          std::get<0>(info.param) + "_" +
          xfuser::models::offload_mode_name(std::get<1>(info.param)));
    });

}  // namespace
