// MpiCommunicator: the Communicator backend over MPI, for CPU tensors.
//
// - Created from MPI_COMM_WORLD (duplicated) with a name and a timeout; MPI must be initialised
//   first (parallel::MpiEnvironment). Sub-groups come from split().
// - Every blocking wait is a non-blocking MPI call polled with MPI_Test (sched_yield, then short
//   sleeps) up to the timeout; on expiry it throws xfuser::Error: "timed out after 5s in
//   all_to_all on group 'ulysses[0,1]' (rank 1 of 2, 4096 bytes)". The pending request and its
//   tensors are then parked for the rest of the process (MPI may still write them) and the
//   communicator is unusable: every later call throws naming the operation that timed out.
// - CPU tensors only (CUDA-aware MPI is not supported): any other device is an error naming the
//   operation. Non-contiguous tensors are made contiguous (in-place ops copy back).
// - dtypes: float32, float64, bfloat16 and float16 (moved as 2-byte words; all_reduce converts to
//   float32, reduces and converts back), int64, int32, int16, int8, uint8, bool (all_reduce of
//   bool: kSum/kMax = logical or, kMin = logical and).
// - Messages above max_elements_per_call() elements (INT_MAX) are split into several MPI calls
//   for all_reduce, broadcast and send/recv; all_gather and all_to_all refuse per-rank chunks
//   above it with a clear error.
// - Bytes counted per call (bytes this rank sends): all_reduce the buffer size, all_gather the
//   input size x (P-1), all_to_all (P-1)/P of the input, broadcast the buffer size on the root and
//   0 elsewhere, send/isend the tensor size, recv/irecv and barrier 0. Sizes are those of the
//   caller's dtype.
// - Work objects returned by isend/irecv hold the tensors until completion and must not outlive
//   their communicator; a Work destroyed while pending parks its request like a timeout does.
// - Not thread-safe: call from the thread that initialised MPI (MPI_THREAD_FUNNELED).
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace xfuser::parallel {

class MpiCommunicator : public Communicator {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300000};

  // A duplicate of MPI_COMM_WORLD.
  explicit MpiCommunicator(std::string name = "world",
                           std::chrono::milliseconds timeout = kDefaultTimeout);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  at::Tensor all_gather(const at::Tensor& tensor, int64_t dim = 0) override;
  at::Tensor all_to_all(const at::Tensor& input) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void send(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric) override;
  void recv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric) override;
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric) override;
  std::unique_ptr<Work> irecv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric) override;
  // Posts every isend/irecv, then one Work waits for all (MpiCommunicator::batch_p2p in the .cpp
  // names the operations and peers still pending at a timeout).
  std::unique_ptr<Work> batch_p2p(std::vector<P2POp> ops) override;
  std::unique_ptr<Work> all_gather_into(const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& outputs) override;
  void barrier() override;
  // Collective over all members; the (color, key) exchange is bounded by the timeout.
  // color must be >= 0. The sub-communicator inherits the timeout.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  // The same with its own timeout for the sub-communicator.
  std::unique_ptr<MpiCommunicator> split(int color, int key, const std::string& name,
                                         std::chrono::milliseconds timeout);

  // Largest element count of one MPI call (INT_MAX); tests lower it to exercise chunking.
  int64_t max_elements_per_call() const { return max_elements_; }
  void set_max_elements_per_call(int64_t n);

  // Empty while usable; otherwise names the operation that timed out.
  const std::string& broken_reason() const { return broken_; }

 private:
  friend class MpiWork;
  friend class MpiBatchWork;
  friend class MpiGatherWork;

  MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout,
                  std::vector<int> world_ranks, int64_t max_elements);

  void check_usable(const char* op) const;
  void check_tensor(const at::Tensor& t, const char* op) const;
  void check_peer(int peer, const char* op) const;
  // Polls `requests` to completion or the deadline; on expiry parks them with `keep_alive`,
  // marks the communicator broken and throws the timeout error.
  void wait_requests(std::vector<MPI_Request>& requests, std::vector<at::Tensor> keep_alive,
                     const char* op, int64_t bytes, int peer,
                     std::chrono::steady_clock::time_point deadline);
  std::unique_ptr<Work> start_p2p(const at::Tensor& tensor, int peer, Tag tag, bool is_send);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::vector<int> world_ranks_;
  int64_t max_elements_;
  int rank_ = 0;
  int size_ = 1;
  std::string broken_;
};

}  // namespace xfuser::parallel
