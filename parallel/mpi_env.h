// The MPI environment of one process: initialised once (works without mpirun as a singleton
// world of 1), with the world rank/size and the ranks sharing this node.
#pragma once

namespace xfuser::parallel {

class MpiEnvironment {
 public:
  // MPI_Init_thread (MPI_THREAD_FUNNELED) unless MPI is already initialised by the caller.
  MpiEnvironment(int* argc, char*** argv);
  // MPI_Finalize when this object initialised MPI, unless an exception is unwinding (then the
  // caller aborts the job).
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // Ends every rank of the job (MPI_Abort on MPI_COMM_WORLD). Never returns.
  [[noreturn]] static void abort(int code);

 private:
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

}  // namespace xfuser::parallel
