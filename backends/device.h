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

#include <string>

#include <c10/core/Device.h>

namespace xfuser::backends {

// What the process can see.
struct DeviceProbe {
  bool libtorch_has_cuda = false;    // at::hasCUDA(): a CUDA build of libtorch
  int visible_gpus = 0;              // devices the CUDA runtime reports (0 without CUDA)
  std::string cuda_visible_devices;  // $CUDA_VISIBLE_DEVICES ("<unset>" when unset)
};

DeviceProbe probe_devices();

// The launcher's node-local rank (0 without a launcher); a malformed value is an error naming
// the variable.
int local_rank_from_env();

// Pure decision: `requested` is "auto", "cpu" or "cuda" (anything else is an error naming
// --device and the accepted values).
c10::Device resolve_device(const std::string& requested, int local_rank, const DeviceProbe& probe);

// probe_devices() + resolve_device() for this process, and, for a CUDA device, makes it the
// current device. Idempotent.
c10::Device select_device(const std::string& requested);

// "cpu", "cuda:1": the name in logs and run reports.
std::string device_name(const c10::Device& device);

}  // namespace xfuser::backends
