// Communicator: one process group and its collectives, with an MPI backend for CPU tensors
// (parallel/mpi_communicator.h) and an NCCL backend for CUDA tensors (XFUSER_WITH_NCCL).
//
// Contract for every backend:
// - Options are fixed at creation: the group's name (used in every error and in the run
//   report), and the timeout of every blocking wait. A wait past the timeout throws
//   xfuser::Error naming the operation, the group, the peer (if any) and the bytes, so main can
//   MPI_Abort the job instead of hanging.
// - Tensors are contiguous; collectives are in-place where the signature says so.
// - Every call counts calls, bytes moved (sent by this rank) and seconds per operation kind; the
//   counts go into the per-rank run report.
// - The default implementation of each operation throws "<backend> does not support <op>".
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace xfuser::profiling {
class Span;
}

namespace xfuser::parallel {

enum class ReduceOp { kSum, kMax, kMin };

// Every MPI/NCCL point-to-point tag used by xfuser, in one place.
enum class Tag : int {
  kGeneric = 100,
  kRingKv = 200,
  kPipeActivation = 300,
  kPipeLatent = 310,
  kVaeHalo = 400,
  kHeartbeat = 900,
};

struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // bytes this rank sent (for all-reduce: the buffer size per call)
  double seconds = 0.0;

  OpStats& operator+=(const OpStats& other) {
    calls += other.calls;
    bytes += other.bytes;
    seconds += other.seconds;
    return *this;
  }
};

// A pending asynchronous operation. wait() makes its result usable: on the MPI backend it blocks
// until done or the communicator's timeout (then throws naming the operation); on NCCL it orders
// the compute stream after it and returns (the watchdog bounds it). test() polls.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

// A Work that completed when it was made.
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// One operation of a grouped point-to-point exchange (Communicator::batch_p2p). A send reads
// `tensor`; a receive writes it in place (its shape and dtype give the message size).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor tensor;
  int peer = 0;  // group rank
  Tag tag = Tag::kGeneric;

  static P2POp send(const at::Tensor& t, int dst, Tag tag = Tag::kGeneric) {
    return {Kind::kSend, t, dst, tag};
  }
  static P2POp recv(const at::Tensor& t, int src, Tag tag = Tag::kGeneric) {
    return {Kind::kRecv, t, src, tag};
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string backend() const = 0;  // "mpi", "nccl"
  virtual int rank() const = 0;             // rank within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  // World ranks of the members, in group-rank order.
  virtual const std::vector<int>& world_ranks() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // In place over all members.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Concatenation of every member's `tensor` (same shape everywhere) along `dim`, in rank order.
  virtual at::Tensor all_gather(const at::Tensor& tensor, int64_t dim = 0);
  // `input` is split along dim 0 into size() equal chunks; chunk j goes to rank j; the result
  // holds, along dim 0, the chunk received from rank 0, then rank 1, ... (same shape as input).
  virtual at::Tensor all_to_all(const at::Tensor& input);
  virtual void broadcast(at::Tensor& tensor, int root);
  virtual void send(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric);
  virtual void recv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric);
  virtual std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, Tag tag = Tag::kGeneric);
  virtual std::unique_ptr<Work> irecv(at::Tensor& tensor, int src, Tag tag = Tag::kGeneric);
  // Posts every operation of `ops` as one group and returns one Work for all of them: NCCL
  // wraps them in ncclGroupStart/ncclGroupEnd, MPI posts every isend/irecv before waiting. No
  // exchange pattern depends on the order of `ops` (receives may come before the sends they
  // pair with, a rank may send to and receive from itself). Each operation is counted as a
  // "send" (its bytes) or "recv" (0 bytes) call when the Work completes; a wait past the
  // timeout throws naming the group, and the operations and peers that did not complete.
  // An empty batch returns a completed Work.
  virtual std::unique_ptr<Work> batch_p2p(std::vector<P2POp> ops);
  // Starts gathering every member's `inputs[i]` (contiguous; same dtype and element count on
  // every member) into `outputs[i]` (contiguous, size() times as many elements, rank order),
  // all pairs as one operation; the outputs hold the result once the Work's wait() returned.
  // Counted as one "all_gather" call per pair. MPI posts non-blocking gathers (they progress
  // whenever the process enters MPI, and in wait()); NCCL enqueues them on its stream and
  // wait() orders the compute stream after them. The default gathers at once and returns a
  // completed Work. The inputs and outputs must stay untouched until the Work completes.
  virtual std::unique_ptr<Work> all_gather_into(const std::vector<at::Tensor>& inputs,
                                                const std::vector<at::Tensor>& outputs);
  virtual void barrier();
  // A sub-group of the members with the same `color`, ordered by (key, rank); `name` names it.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name);

  // Counters per operation kind ("all_reduce", "all_gather", "all_to_all", "broadcast", "send",
  // "recv", "barrier"). A communicator made of others (TwoPlaneCommunicator) sums theirs.
  virtual std::map<std::string, OpStats> stats() const { return stats_; }
  virtual void reset_stats() { stats_.clear(); }

 protected:
  void count(const std::string& op, int64_t bytes, double seconds);
  // Trace args of an operation of this group: group, backend, bytes, and the peer (group and
  // world rank) or, for collectives (peer < 0), the world ranks of the other members.
  void trace_args(profiling::Span& span, int64_t bytes, int peer = -1) const;
  [[noreturn]] void unsupported(const std::string& op) const;

 private:
  std::map<std::string, OpStats> stats_;
};

// Checks the pairs of an all_gather_into (counts, dtypes, devices, contiguity), naming the pair.
void check_gather_pairs(const Communicator& comm, const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs);

}  // namespace xfuser::parallel
