// The committed tiny pipelines (tests/fixtures/pipelines/<name>/ with <name>.ref/ diffusers
// references), one or more per contract model, for tests that run all of them on a device.
#pragma once

#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace xfuser::testing {

inline const std::vector<std::string>& committed_tiny_pipelines() {
  static const std::vector<std::string> names = {
      "flux-tiny",      "kontext-tiny",       "flux2-tiny",           "sd3-tiny",
      "sd3-tiny-no-t5", "wan-t2v-tiny",       "wan-i2v-tiny",         "wan22-t2v-tiny",
      "wan22-i2v-tiny", "hunyuan-video-tiny", "hunyuan_video15-tiny", "hunyuan_video15-i2v-tiny"};
  return names;
}

// A GoogleTest parameter name: letters and digits kept, everything else '_'.
inline std::string gtest_name(std::string n) {
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

// The parameter name of a pipeline ("flux-tiny" -> "flux_tiny").
inline std::string pipeline_test_name(const ::testing::TestParamInfo<std::string>& info) {
  return gtest_name(info.param);
}

}  // namespace xfuser::testing
