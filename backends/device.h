// The compute device of a run: --device auto|cpu|cuda (xfuser-run, xfuser forward, the Runner).
//
// - auto: CUDA when this libtorch has CUDA and a GPU is visible, else the CPU.
// - cpu: the CPU.
// - cuda: CUDA, or an xfuser::Error naming why not ("this libtorch has no CUDA" / "no GPU is
//   visible"); every rank reaches the same verdict from the same facts, so a multi-rank job
//   fails on every rank with the reason, before any communicator exists.
// Each rank takes cuda:(local_rank % visible GPUs), the local rank read from the launcher
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID; 0 without one), and
// select_device() makes it the current CUDA device before any CUDA or NCCL call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace xfuser::backends {

// What the process can see.
struct DeviceProbe {
  bool libtorch_has_cuda = false;    // at::hasCUDA(): a CUDA build of libtorch
  int visible_gpus = 0;              // devices the CUDA runtime reports (0 without CUDA)
  std::string cuda_visible_devices;  // $CUDA_VISIBLE_DEVICES ("<unset>" when unset)
};

DeviceProbe probe_devices();

// The library that serves this process's std::filesystem calls: libstdc++ (or this program,
// when it carries its own copy) as it should, or another one. Some PyTorch wheels export a copy
// of libstdc++'s std::filesystem from libtorch.so; where it wins the dynamic linker's lookup,
// its remove_all jumps to address 0. The build names libstdc++ first to prevent that.
std::string std_filesystem_provider();
// Throws an xfuser::Error naming that library when it is not libstdc++ or this program, with
// the remedy, so that a binary linked in a way the build did not foresee stops with a message
// rather than a crash. xfuser-run and xfuser call it first.
void check_cxx_runtime();

// The launcher's node-local rank (0 without a launcher); a malformed value is an error naming
// the variable.
int local_rank_from_env();

// Pure decision: `requested` is "auto", "cpu" or "cuda" (anything else is an error naming
// --device and the accepted values).
c10::Device resolve_device(const std::string& requested, int local_rank, const DeviceProbe& probe);

// probe_devices() + resolve_device() for this process, and, for a CUDA device, makes it the
// current device. Idempotent.
c10::Device select_device(const std::string& requested);

// fp32 runs on a GPU compute in IEEE fp32. libtorch lets cuDNN convolutions use TF32 by default
// (inputs rounded to 10 mantissa bits, ~1e-3 relative; diffusers inherits it), and cuBLAS GEMMs
// when float32_matmul_precision is lowered: xfuser's fp32 is the reference dtype that equals the
// CPU and diffusers to 1e-4, so a CUDA run in fp32 turns both off. Other dtypes and devices keep
// libtorch's settings. Process-wide (libtorch's global context).
void set_fp32_math(c10::ScalarType compute_dtype, const c10::Device& device);

// "cpu", "cuda:1": the name in logs and run reports.
std::string device_name(const c10::Device& device);

// Waits until the work queued so far on `device`'s current stream has run (nothing on the CPU):
// stage timings measure the device's time, not the time to queue it.
void synchronize_device(const c10::Device& device);

// The caching allocator's counters of a CUDA device, in bytes (`available` is false for the
// CPU, or a libtorch without CUDA). Peaks are since the process started.
struct DeviceMemoryStats {
  bool available = false;
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
};
DeviceMemoryStats device_memory_stats(const c10::Device& device);

// Bytes the tensors of `device` hold now and at their peak since the last reset: the host
// tensor counter on the CPU (backends/memory.h; `available` once it is installed), the caching
// allocator's allocated bytes on CUDA. A run resets the peak after loading, so that the peak of
// its generations can be set beside the memory plan.
struct TensorMemory {
  bool available = false;
  int64_t allocated = 0, peak = 0;
};
TensorMemory tensor_memory(const c10::Device& device);
void reset_tensor_memory_peak(const c10::Device& device);

// Copies host tensors (a checkpoint's memory map, a converted copy) to the run's device once,
// at load. On the CPU, upload() is a dtype conversion (a view when the dtype already matches).
// On a GPU, each tensor is read once from host memory into one of two pinned staging buffers,
// converting the dtype on the way, and copied to the device asynchronously on the current
// stream: the host fills one buffer while the other's copy runs. A buffer is reused only after
// its copy's event has completed; finish() (and the destructor) waits for every copy, so the
// staging memory is never freed under a pending copy. Uploaded tensors are ordered before any
// later work on the current stream. A PrivateUse1 device (the tests' checked device,
// tests/checked_device.h) gets a plain synchronous copy.
class DeviceUploader {
 public:
  explicit DeviceUploader(c10::Device device);
  ~DeviceUploader();
  DeviceUploader(const DeviceUploader&) = delete;
  DeviceUploader& operator=(const DeviceUploader&) = delete;

  // `host` (any strides, on the CPU) as a contiguous `dtype` tensor on the device.
  at::Tensor upload(const at::Tensor& host, c10::ScalarType dtype);
  // Waits until every copy issued so far has completed.
  void finish();
  const c10::Device& device() const { return device_; }
  // Bytes copied to the device so far.
  int64_t bytes_uploaded() const { return bytes_; }

 private:
  struct Staging;
  c10::Device device_;
  std::unique_ptr<Staging> staging_[2];
  int next_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace xfuser::backends
