// TwoPlaneCommunicator: the communicator of one group on a GPU run, made of two planes over the
// same members and ranks:
// - the host plane (MPI) carries CPU tensors: prompts, shapes, control, host buffers;
// - the device plane (NCCL) carries CUDA tensors.
// Each operation goes to the plane of its tensors' device. Without a device plane (the ranks
// share GPUs, or --comm_backend mpi) CUDA tensors cross the host plane through host memory: a
// device-to-host copy, the MPI operation, a host-to-device copy back (correct, and slow: for
// tests on one GPU and for hosts without NCCL).
//
// split() splits both planes, so a ProcessGroups mesh built over a TwoPlaneCommunicator has the
// two planes in every group. stats() sums both planes' counters. A batch_p2p must not mix CPU
// and CUDA tensors (an error naming the group). The timeout is the host plane's; the device
// plane has its own (make_world_communicator gives both the same).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "parallel/communicator.h"

namespace xfuser::parallel {

class TwoPlaneCommunicator final : public Communicator {
 public:
  // `host` is required; `device` may be null (CUDA tensors then go through host memory). Both
  // must have the same members in the same order.
  TwoPlaneCommunicator(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device);

  std::string backend() const override;  // "mpi+nccl", or "mpi" (staged through the host)
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  const std::vector<int>& world_ranks() const override { return host_->world_ranks(); }
  std::chrono::milliseconds timeout() const override { return host_->timeout(); }

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  at::Tensor all_gather(const at::Tensor& tensor, int64_t dim = 0) override;
  at::Tensor all_to_all(const at::Tensor& input) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void send(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric) override;
  void recv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric) override;
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric) override;
  std::unique_ptr<Work> irecv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric) override;
  std::unique_ptr<Work> batch_p2p(std::vector<P2POp> ops) override;
  std::unique_ptr<Work> all_gather_into(const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& outputs) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  std::map<std::string, OpStats> stats() const override;
  void reset_stats() override;

  Communicator& host() const { return *host_; }
  Communicator* device_plane() const { return device_.get(); }

 private:
  // The device plane for a tensor on a GPU when there is one; null for the host plane (CPU
  // tensors, or CUDA tensors staged through host memory).
  Communicator* plane_for(const at::Tensor& t) const;

  std::shared_ptr<Communicator> host_;
  std::shared_ptr<Communicator> device_;
};

// The world communicator of a run on `device` (a launch under MPI with more than one rank):
// - CPU: the MPI world communicator.
// - CUDA: a TwoPlaneCommunicator of the MPI world and, by `comm_backend`,
//   "nccl": an NCCL world (an error naming the reason when NCCL is not compiled in or two ranks
//           of a node share a GPU: NCCL needs one rank per GPU),
//   "mpi":  none (device tensors staged through host memory over MPI),
//   "auto": NCCL when it is compiled in and no GPU is shared, else the MPI plane (logged).
// Every rank reaches the same decision (the facts are all-reduced over the world first), so an
// error is raised on every rank. `local_size`: the ranks on this node; `visible_gpus`: the GPUs
// this rank sees. Collective over the MPI world.
std::shared_ptr<Communicator> make_world_communicator(const std::string& comm_backend,
                                                      const c10::Device& device, int local_size,
                                                      int visible_gpus,
                                                      std::chrono::milliseconds timeout);

}  // namespace xfuser::parallel
