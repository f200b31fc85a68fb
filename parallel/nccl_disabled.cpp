// Compiled only without XFUSER_WITH_NCCL (see parallel/CMakeLists.txt).
#include "backends/error.h"
#include "parallel/nccl_communicator.h"

namespace xfuser::parallel {

bool nccl_compiled_in() { return false; }

std::string nccl_probe() {
  XF_THROW(
      "NCCL backend selected but this build has no NCCL support: reconfigure with "
      "-DXFUSER_WITH_NCCL=ON and NCCL installed (XFUSER_CUDA_ROOT or NCCL_ROOT)");
}

}  // namespace xfuser::parallel
