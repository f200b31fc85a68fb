// NCCL backend availability. The NCCL communicator itself implements the Communicator
// interface (parallel/communicator.h); this header is what callers use to ask whether it can run.
#pragma once

#include <string>

namespace xfuser::parallel {

// True when this build includes the NCCL backend (CMake option XFUSER_WITH_NCCL).
bool nccl_compiled_in();

// Checks that NCCL can run here: the backend is compiled in, the CUDA runtime finds a driver
// and at least one device. Returns a description ("NCCL 2.27.3, 8 CUDA devices"); throws
// xfuser::Error naming what is missing otherwise. Never crashes on a machine without a GPU.
std::string nccl_probe();

}  // namespace xfuser::parallel
