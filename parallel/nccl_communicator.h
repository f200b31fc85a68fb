// NCCL backend of the Communicator interface (parallel/communicator.h), for CUDA tensors.
//
// The backend is compiled in with the CMake option XFUSER_WITH_NCCL (parallel/
// nccl_communicator.cpp); without it (parallel/nccl_disabled.cpp) the same functions exist and
// throw "no NCCL support", so this header carries no build flags.
//
// NcclCommunicator (defined in the .cpp) behaves as follows:
// - Bound to the CUDA device current when it is created, with its own CUDA stream. Every
//   operation waits (event) for the work already queued on the compute stream (the current torch
//   CUDA stream when the libtorch has CUDA, else the default stream) and is enqueued on its own
//   stream; the host does not wait for it (only barrier() does). Collectives and send/recv order
//   the compute stream after themselves (event) before returning, so later kernels see the
//   result; isend/irecv/batch_p2p do that in Work::wait(), which does not block the host either
//   (Work::test() asks whether the operation completed). The tensors an operation uses are kept
//   alive until it completes.
// - NCCL runs in non-blocking mode. A Watchdog thread per communicator (parallel/watchdog.h)
//   polls every operation in flight (its event and the communicator's async error); when one
//   fails or is not done within the timeout, it aborts the communicator and ends the job on
//   every rank (MPI_Abort), naming the operation, the group, the peer (point-to-point) or the
//   members (collectives: NCCL cannot tell which one is missing) and the bytes. A later call on
//   an aborted communicator throws xfuser::Error saying why.
// - Communication time is the CUDA-event time of each operation on the communicator's stream
//   (from when its inputs were ready to when it completed), counted when it completes; stats()
//   and reset_stats() first wait for the operations in flight.
// - Tensors must be contiguous CUDA tensors on the communicator's device; a CPU tensor is an
//   error naming the operation. Dtypes: float, double, half, bfloat16, int64, int32, uint8
//   (+ float8 e4m3fn/e5m2 with libtorch >= 2.1 and NCCL >= 2.19).
// - Stats as the MPI backend counts them (bytes this rank sends): all_reduce the buffer,
//   all_gather the input times (size - 1), all_to_all the chunks for the other ranks, broadcast
//   the buffer on the root (0 elsewhere), send the message, recv and barrier 0. isend/irecv are
//   counted as "send"/"recv" when they complete.
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

// The PCI bus id of CUDA device `device` ("0000:3b:00.0"): which physical GPU a rank drives,
// whatever CUDA_VISIBLE_DEVICES numbering it sees. Needs the NCCL backend (its CUDA runtime).
std::string gpu_bus_id(int device);

// Creates the NCCL communicator of the group of `bootstrap` (same members, same ranks): runs
// nccl_probe() first, then group rank 0 creates the ncclUniqueId and broadcasts its bytes over
// `bootstrap` (a CPU uint8 tensor), and every member joins on the current CUDA device.
// Collective over `bootstrap`: every member must call it. `timeout` bounds every later wait,
// and the initialisation itself.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const std::string& name,
                                                     std::chrono::milliseconds timeout);

}  // namespace xfuser::parallel
