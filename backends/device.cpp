#include "backends/device.h"

#include <cstdlib>
#include <string>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backends/error.h"

namespace xfuser::backends {

DeviceProbe probe_devices() {
  DeviceProbe p;
  p.libtorch_has_cuda = at::hasCUDA();
  // getNumGPUs() answers 0 in a CPU-only libtorch and never throws without a driver.
  p.visible_gpus = p.libtorch_has_cuda ? at::detail::getCUDAHooks().getNumGPUs() : 0;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  p.cuda_visible_devices = env ? env : "<unset>";
  return p;
}

int local_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    XF_CHECK(*end == '\0' && rank >= 0 && rank < (1 << 20), "$", name, "='", value,
             "' is not a local rank (a non-negative integer)");
    return static_cast<int>(rank);
  }
  return 0;
}

c10::Device resolve_device(const std::string& requested, int local_rank, const DeviceProbe& probe) {
  XF_CHECK(requested == "auto" || requested == "cpu" || requested == "cuda", "--device '",
           requested, "' is not a device (expected auto, cpu or cuda)");
  XF_CHECK(local_rank >= 0, "local rank ", local_rank, " is negative");
  if (requested == "cpu") return c10::Device(c10::kCPU);
  const bool usable = probe.libtorch_has_cuda && probe.visible_gpus > 0;
  if (requested == "auto" && !usable) return c10::Device(c10::kCPU);
  XF_CHECK(probe.libtorch_has_cuda,
           "--device cuda: this libtorch has no CUDA (a CPU-only build); run with --device cpu "
           "(or auto), or build xfuser against a CUDA libtorch");
  XF_CHECK(probe.visible_gpus > 0,
           "--device cuda: no GPU is visible (the CUDA runtime reports 0 devices; "
           "CUDA_VISIBLE_DEVICES=",
           probe.cuda_visible_devices, "); run with --device cpu (or auto)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % probe.visible_gpus));
}

c10::Device select_device(const std::string& requested) {
  const c10::Device device = resolve_device(requested, local_rank_from_env(), probe_devices());
  if (device.is_cuda()) {
    // Through libtorch's device guard registry: no CUDA headers needed here.
    c10::impl::VirtualGuardImpl guard(c10::kCUDA);
    guard.setDevice(device);
  }
  return device;
}

std::string device_name(const c10::Device& device) { return device.str(); }

}  // namespace xfuser::backends
