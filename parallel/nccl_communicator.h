// NCCL backend of the Communicator interface (parallel/communicator.h), for CUDA tensors.
//
// The backend is compiled in with the CMake option XFUSER_WITH_NCCL (parallel/
// nccl_communicator.cpp); without it (parallel/nccl_disabled.cpp) the same functions exist and
// throw "no NCCL support", so this header carries no build flags.
//
// NcclCommunicator (defined in the .cpp) behaves as follows:
// - Bound to the CUDA device current when it is created, with its own CUDA stream. Every
//   operation waits (event) for the work already queued on the compute stream (the current torch
//   CUDA stream when the libtorch has CUDA, else the default stream), runs on its own stream, and
//   the compute stream waits (event) for the collective before later kernels use the result.
// - NCCL runs in non-blocking mode: a blocking operation polls the communicator's async error and
//   the completion event until the timeout, then aborts the communicator and throws
//   xfuser::Error naming the operation, the group, the peer (if any) and the bytes.
// - Tensors must be contiguous CUDA tensors on the communicator's device; a CPU tensor is an
//   error naming the operation. Dtypes: float, double, half, bfloat16, int64, int32, uint8
//   (+ float8 e4m3fn/e5m2 with libtorch >= 2.1 and NCCL >= 2.19).
// - Stats as the MPI backend counts them (bytes this rank sends): all_reduce the buffer,
//   all_gather the input times (size - 1), all_to_all the chunks for the other ranks, broadcast
//   the buffer on the root (0 elsewhere), send the message, recv and barrier 0. isend/irecv are
//   counted as "send"/"recv" when their Work completes.
// - NCCL has no tags: point-to-point messages between two ranks match in issue order.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace xfuser::parallel {

// True when this build includes the NCCL backend (CMake option XFUSER_WITH_NCCL).
bool nccl_compiled_in();

// Checks that NCCL can run here: the backend is compiled in, the CUDA runtime finds a driver
// and at least one device. Returns a description ("NCCL 2.27.3, 8 CUDA devices"); throws
// xfuser::Error naming what is missing otherwise. Never crashes on a machine without a GPU.
std::string nccl_probe();

// Creates the NCCL communicator of the group of `bootstrap` (same members, same ranks): runs
// nccl_probe() first, then group rank 0 creates the ncclUniqueId and broadcasts its bytes over
// `bootstrap` (a CPU uint8 tensor), and every member joins on the current CUDA device.
// Collective over `bootstrap`: every member must call it. `timeout` bounds every later wait,
// and the initialisation itself.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const std::string& name,
                                                     std::chrono::milliseconds timeout);

}  // namespace xfuser::parallel
