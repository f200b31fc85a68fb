#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/nccl_communicator.h"

// On CPU-only machines selecting NCCL must be a clear error, never a crash; where a GPU exists
// the probe describes it.
TEST(Nccl, ProbeIsAClearErrorWithoutAGpu) {
  try {
    std::string desc = xfuser::parallel::nccl_probe();
    EXPECT_TRUE(xfuser::parallel::nccl_compiled_in());
    EXPECT_NE(desc.find("NCCL "), std::string::npos) << desc;
    EXPECT_NE(desc.find("CUDA devices"), std::string::npos) << desc;
  } catch (const xfuser::Error& e) {
    std::string msg = e.what();
    if (xfuser::parallel::nccl_compiled_in()) {
      EXPECT_NE(msg.find("no CUDA device is usable"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("no NCCL support"), std::string::npos) << msg;
    }
  }
}
