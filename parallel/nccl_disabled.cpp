// Compiled only without XFUSER_WITH_NCCL (see parallel/CMakeLists.txt): the NCCL entry points
// exist and fail with a clear error, so callers need no build flags.
#include "backends/error.h"
#include "parallel/nccl_communicator.h"

namespace xfuser::parallel {

bool nccl_compiled_in() { return false; }

std::string nccl_probe() {
  XF_THROW(
      "NCCL backend selected but this build has no NCCL support: reconfigure with "
      "-DXFUSER_WITH_NCCL=ON and NCCL installed (XFUSER_CUDA_ROOT or NCCL_ROOT)");
}

std::string gpu_bus_id(int device) {
  nccl_probe();  // throws
  XF_THROW("unreachable: nccl_probe() succeeded in a build without NCCL (device ", device, ")");
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const std::string& name,
                                                     std::chrono::milliseconds timeout) {
  XF_CONTEXT("creating NCCL communicator '", name, "' over ", bootstrap.backend(), " group '",
             bootstrap.name(), "'");
  nccl_probe();  // throws
  XF_THROW("unreachable: nccl_probe() succeeded in a build without NCCL");
}

}  // namespace xfuser::parallel
