// Compiled only with XFUSER_WITH_NCCL (see parallel/CMakeLists.txt).
#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backends/error.h"

namespace xfuser::parallel {

bool nccl_compiled_in() { return true; }

std::string nccl_probe() {
  int version = 0;
  ncclResult_t nr = ncclGetVersion(&version);
  XF_CHECK(nr == ncclSuccess, "NCCL backend: ncclGetVersion failed: ", ncclGetErrorString(nr));
  const int major = version / 10000, minor = (version % 10000) / 100, patch = version % 100;
  int devices = 0;
  cudaError_t cr = cudaGetDeviceCount(&devices);
  XF_CHECK(cr == cudaSuccess && devices > 0,
           "NCCL backend selected but no CUDA device is usable on this machine (",
           cr == cudaSuccess ? "0 devices" : cudaGetErrorString(cr),
           "); use the MPI backend (--comm_backend mpi) on CPU-only hosts");
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(patch) + ", " + std::to_string(devices) + " CUDA devices";
}

}  // namespace xfuser::parallel
