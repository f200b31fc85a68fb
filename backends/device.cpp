#include "backends/device.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backends/error.h"
#include "backends/memory.h"

#if XFUSER_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

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

namespace {

// The file a code address belongs to ("" if the dynamic linker cannot tell).
std::string object_of(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

std::string std_filesystem_provider() {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  const RemoveAll remove_all = &std::filesystem::remove_all;
  return object_of(reinterpret_cast<const void*>(remove_all));
}

void check_cxx_runtime() {
  const std::string provider = std_filesystem_provider();
  if (provider.empty() || provider.find("libstdc++") != std::string::npos) return;
  // This program's own code (xfuser's libraries are linked in statically).
  if (provider == object_of(reinterpret_cast<const void*>(&check_cxx_runtime))) return;
  XF_THROW("std::filesystem resolves into ", provider,
           " instead of libstdc++: that library exports its own copy (some PyTorch wheels "
           "do), which crashes when xfuser calls it. Relink with libstdc++.so.6 ahead of "
           "libtorch (xfuser's CMake build does: reconfigure in an empty build folder), or run "
           "with LD_PRELOAD set to the libstdc++.so.6 that libtorch loads (ldd libtorch.so)");
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

void set_fp32_math(c10::ScalarType compute_dtype, const c10::Device& device) {
  if (!device.is_cuda() || compute_dtype != at::kFloat) return;
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
}

std::string device_name(const c10::Device& device) { return device.str(); }

void synchronize_device(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl guard(device.type());
  c10::Event done(device.type());
  done.record(guard.getStream(device));
  while (!done.query()) std::this_thread::yield();
}

DeviceMemoryStats device_memory_stats(const c10::Device& device) {
  DeviceMemoryStats out;
#if XFUSER_TORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // Index 0 is StatType::AGGREGATE (every pool).
    out.available = true;
    out.allocated = stats.allocated_bytes[0].current;
    out.reserved = stats.reserved_bytes[0].current;
    out.peak_allocated = stats.allocated_bytes[0].peak;
    out.peak_reserved = stats.reserved_bytes[0].peak;
  }
#endif
  return out;
}

TensorMemory tensor_memory(const c10::Device& device) {
  TensorMemory out;
  if (device.is_cpu()) {
    const HostTensorMemory m = host_tensor_memory();
    out.available = m.tracked;
    out.allocated = m.allocated;
    out.peak = m.peak;
    return out;
  }
  const DeviceMemoryStats stats = device_memory_stats(device);
  out.available = stats.available;
  out.allocated = stats.allocated;
  out.peak = stats.peak_allocated;
  return out;
}

void reset_tensor_memory_peak(const c10::Device& device) {
  if (device.is_cpu()) {
    reset_host_tensor_peak();
    return;
  }
#if XFUSER_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

// One pinned host buffer and the event of the last copy out of it. Everything goes through
// libtorch's device-generic interfaces (c10::Event, the guard registry), so this compiles
// against any libtorch and needs no CUDA headers.
struct DeviceUploader::Staging {
  at::Tensor buffer;  // uint8, pinned
  std::optional<c10::Event> event;

  void wait() {
    if (!event) return;
    while (!event->query()) std::this_thread::yield();
    event.reset();
  }
};

DeviceUploader::DeviceUploader(c10::Device device) : device_(device) {
  XF_CHECK(device_.is_cpu() || device_.is_cuda() || device_.type() == c10::DeviceType::PrivateUse1,
           "weights cannot be loaded to device ", device_.str(), " (expected cpu or cuda)");
  staging_[0] = std::make_unique<Staging>();
  staging_[1] = std::make_unique<Staging>();
}

DeviceUploader::~DeviceUploader() {
  try {
    finish();
  } catch (...) {  // a failed device is reported by whoever uses it next
  }
}

at::Tensor DeviceUploader::upload(const at::Tensor& host, c10::ScalarType dtype) {
  XF_CHECK(host.device().is_cpu(), "DeviceUploader: the source tensor is on ", host.device().str(),
           ", expected host memory");
  if (device_.is_cpu()) return host.scalar_type() == dtype ? host : host.to(dtype);
  if (!device_.is_cuda()) {  // an in-process backend (tests' checked device): a plain copy
    bytes_ += host.numel() * static_cast<int64_t>(c10::elementSize(dtype));
    return host.to(at::TensorOptions().dtype(dtype).device(device_)).contiguous();
  }
  const int64_t nbytes = host.numel() * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor out = at::empty(host.sizes(), at::TensorOptions().dtype(dtype).device(device_));
  if (nbytes == 0) return out;
  Staging& st = *staging_[next_];
  next_ ^= 1;
  st.wait();  // its previous copy has left the buffer
  if (!st.buffer.defined() || st.buffer.numel() < nbytes) {
    st.buffer = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  at::Tensor staged =
      at::from_blob(st.buffer.data_ptr(), host.sizes(), at::TensorOptions().dtype(dtype));
  staged.copy_(host);  // the one read of the host tensor, converting the dtype
  out.copy_(staged, /*non_blocking=*/true);
  c10::impl::VirtualGuardImpl guard(device_.type());
  st.event.emplace(device_.type());
  st.event->record(guard.getStream(device_));
  bytes_ += nbytes;
  return out;
}

void DeviceUploader::finish() {
  for (auto& st : staging_) st->wait();
}

}  // namespace xfuser::backends
