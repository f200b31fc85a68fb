// Compiled only with XFUSER_WITH_NCCL (see parallel/CMakeLists.txt). Builds and links on hosts
// without a GPU (CUDA toolkit + NCCL headers and libraries); runs on GPU hosts.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/error.h"
#include "parallel/watchdog.h"
#include "profiling/trace.h"

// The current torch CUDA stream is the compute stream when this libtorch has CUDA; a CPU-only
// libtorch has no CUDA tensors, and the default stream stands in. Some CPU-only packages (Debian
// libtorch-dev) ship c10/cuda headers without the generated cuda_cmake_macros.h that a CUDA
// build of libtorch has: both must be present.
#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDAStream.h>
#define XFUSER_HAVE_C10_CUDA 1
#else
#define XFUSER_HAVE_C10_CUDA 0
#endif

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL backend needs NCCL >= 2.14 (ncclConfig_t, non-blocking communicators)"
#endif
#define XFUSER_NCCL_HAS_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))
#define XFUSER_NCCL_HAS_FP8                       \
  (NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0) && \
   (XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 1)))

// Throws xfuser::Error with the call text and NCCL's error string unless `call` returns
// ncclSuccess. For calls that take no non-blocking communicator.
#define XF_NCCL_CHECK(call)                                                                      \
  do {                                                                                           \
    const ncclResult_t xf_nccl_result_ = (call);                                                 \
    if (xf_nccl_result_ != ncclSuccess) {                                                        \
      throw ::xfuser::Error(__FILE__, __LINE__, #call,                                           \
                            ::xfuser::detail::str_cat("NCCL call `" #call "` failed: ",          \
                                                      ncclGetErrorString(xf_nccl_result_), " (", \
                                                      ncclGetLastError(nullptr), ")"));          \
    }                                                                                            \
  } while (0)

// Throws xfuser::Error with the call text and CUDA's error name and string unless `call`
// returns cudaSuccess.
#define XF_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    const cudaError_t xf_cuda_result_ = (call);                                                \
    if (xf_cuda_result_ != cudaSuccess) {                                                      \
      throw ::xfuser::Error(__FILE__, __LINE__, #call,                                         \
                            ::xfuser::detail::str_cat("CUDA call `" #call "` failed: ",        \
                                                      cudaGetErrorName(xf_cuda_result_), ": ", \
                                                      cudaGetErrorString(xf_cuda_result_)));   \
    }                                                                                          \
  } while (0)

// For calls on a non-blocking communicator (`self` a NcclCommunicator): ncclInProgress is
// accepted and the communicator polled until ready (or the timeout, then abort); any other
// error throws naming the call and `what` (operation, group, bytes).
#define XF_NCCL_CHECK_ASYNC(self, call, what) \
  (self).check_enqueued((call), "NCCL call `" #call "`", __FILE__, __LINE__, (what))

namespace xfuser::parallel {

bool nccl_compiled_in() { return true; }

std::string nccl_probe() {
  int version = 0;
  ncclResult_t nr = ncclGetVersion(&version);
  XF_CHECK(nr == ncclSuccess, "NCCL backend: ncclGetVersion failed: ", ncclGetErrorString(nr));
  const int major = version / 10000, minor = (version % 10000) / 100, patch = version % 100;
  int devices = 0;
  cudaError_t cr = cudaGetDeviceCount(&devices);
  XF_CHECK(cr == cudaSuccess && devices > 0,
           "NCCL backend selected but no CUDA device is usable on this machine (",
           cr == cudaSuccess ? "0 devices" : cudaGetErrorString(cr),
           "); CPU-only hosts use the MPI backend");
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(patch) + ", " + std::to_string(devices) + " CUDA devices";
}

std::string gpu_bus_id(int device) {
  char id[64] = {0};
  const cudaError_t cr = cudaDeviceGetPCIBusId(id, sizeof(id) - 1, device);
  XF_CHECK(cr == cudaSuccess, "cudaDeviceGetPCIBusId(cuda:", device,
           ") failed: ", cudaGetErrorString(cr));
  return id;
}

namespace {

using Clock = std::chrono::steady_clock;

// Busy polling for short operations, then 100 us sleeps so a long wait does not burn a core.
void backoff(int polls) {
  if (polls < 1000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Makes `device` current for a scope and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    XF_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) XF_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    // Cannot throw here; a failure to restore surfaces at the next checked CUDA call.
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

ncclDataType_t nccl_dtype(at::ScalarType type, const std::string& what) {
  switch (type) {
    case at::ScalarType::Float:
      return ncclFloat32;
    case at::ScalarType::Double:
      return ncclFloat64;
    case at::ScalarType::Half:
      return ncclFloat16;
    case at::ScalarType::BFloat16:
      return ncclBfloat16;
    case at::ScalarType::Long:
      return ncclInt64;
    case at::ScalarType::Int:
      return ncclInt32;
    case at::ScalarType::Byte:
      return ncclUint8;
    case at::ScalarType::Char:
      return ncclInt8;
#if XFUSER_NCCL_HAS_FP8
    case at::ScalarType::Float8_e4m3fn:
      return ncclFloat8e4m3;
    case at::ScalarType::Float8_e5m2:
      return ncclFloat8e5m2;
#endif
    default:
      break;  // at::ScalarType is libtorch's enum: the unsupported rest lands here
  }
  XF_THROW(what, ": dtype ", type,
           " is not supported by the NCCL backend (float, double, half, bfloat16, int64, int32, "
           "uint8, int8",
           XFUSER_NCCL_HAS_FP8 ? ", float8_e4m3fn, float8_e5m2)" : ")");
}

ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  XF_THROW("invalid ReduceOp value ", static_cast<int>(op));
}

// One NCCL group on this thread, closed on every path: an error thrown between ncclGroupStart and
// ncclGroupEnd would leave the thread's group open, and NCCL would queue every later call of the
// thread into it (an abort included).
class NcclGroup {
 public:
  NcclGroup() { XF_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();  // unwinding: the error being thrown is the one to report
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  // Closes the group, launching its operations; the result goes through XF_NCCL_CHECK_ASYNC.
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Polls a non-blocking communicator until it leaves ncclInProgress or `deadline` passes; returns
// its last state (ncclInProgress when the deadline passed).
ncclResult_t poll_comm(ncclComm_t comm, Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    XF_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress || Clock::now() > deadline) return state;
    backoff(polls);
  }
}

// Finishes the creation of a communicator by a non-blocking call (init or split) that returned
// `result`: waits until it is ready; on an error or past the deadline aborts it and throws.
ncclComm_t await_new_comm(ncclComm_t comm, ncclResult_t result, const char* call,
                          std::chrono::milliseconds timeout, Clock::time_point deadline,
                          const std::string& what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    const std::string detail = ncclGetLastError(comm);
    // Best effort cleanup: the error being reported is the failed call, not the abort.
    if (comm != nullptr) (void)ncclCommAbort(comm);
    XF_THROW(call, " failed while ", what, ": ", ncclGetErrorString(result), " (", detail, ")");
  }
  XF_CHECK(comm != nullptr, call, " returned no communicator while ", what);
  const ncclResult_t state = poll_comm(comm, deadline);
  if (state == ncclSuccess) return comm;
  const std::string detail = ncclGetLastError(comm);
  (void)ncclCommAbort(comm);
  if (state == ncclInProgress) {
    XF_THROW(what, " timed out after ", timeout.count(), " ms in ", call,
             "; the NCCL communicator was aborted (are all members calling it?)");
  }
  XF_THROW(call, " failed while ", what, ": ", ncclGetErrorString(state), " (", detail, ")");
}

ncclComm_t init_comm(int nranks, const ncclUniqueId& id, int rank,
                     std::chrono::milliseconds timeout, const std::string& what) {
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  return await_new_comm(comm, result, "NCCL call `ncclCommInitRankConfig`", timeout, deadline,
                        what);
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class NcclCommunicator;

// One enqueued operation: its two events on the communicator's stream and the tensors it uses.
// Shared by the watchdog entry and, for point-to-point operations, the Work; the last owner
// destroys the events (the watchdog thread has the communicator's device current).
struct NcclPending {
  cudaEvent_t start = nullptr;  // after the stream waited for the compute stream
  cudaEvent_t done = nullptr;   // after the operation
  std::vector<at::Tensor> keep;
  NcclPending() = default;
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;
  ~NcclPending() {
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (done != nullptr) (void)cudaEventDestroy(done);
  }
};

// The Work of an isend/irecv/batch_p2p: wait() orders the compute stream after the operation
// (the host does not block); test() asks whether it completed. The watchdog watches it from the
// moment it was enqueued, whether or not it is waited for.
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator& comm, std::shared_ptr<NcclPending> pending, std::string what)
      : comm_(comm), pending_(std::move(pending)), what_(std::move(what)) {}
  ~NcclWork() override;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  void wait() override;
  bool test() override;

 private:
  NcclCommunicator& comm_;
  std::shared_ptr<NcclPending> pending_;  // nullptr once waited for
  std::string what_;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (ready, non-blocking), bound to CUDA device `device`.
  NcclCommunicator(ncclComm_t comm, int device, std::string name, std::chrono::milliseconds timeout,
                   int rank, std::vector<int> world_ranks)
      : comm_(comm),
        device_(device),
        name_(std::move(name)),
        timeout_(timeout),
        rank_(rank),
        world_ranks_(std::move(world_ranks)) {
    try {
      DeviceGuard guard(device_);
      XF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      XF_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      watchdog_ = std::make_unique<Watchdog>(
          name_, [this] { abort(); }, Watchdog::Fatal{},
          [device = device_] { (void)cudaSetDevice(device); });
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override {
    watchdog_.reset();  // waits for the operations in flight (bounded by their deadlines)
    release();
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  at::Tensor all_gather(const at::Tensor& tensor, int64_t dim) override;
  at::Tensor all_to_all(const at::Tensor& input) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void send(const at::Tensor& tensor, int dst, Tag tag) override;
  void recv(at::Tensor& tensor, int src, Tag tag) override;
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int dst, Tag tag) override;
  std::unique_ptr<Work> irecv(at::Tensor& tensor, int src, Tag tag) override;
  std::unique_ptr<Work> batch_p2p(std::vector<P2POp> ops) override;
  std::unique_ptr<Work> all_gather_into(const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& outputs) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  // Counts come in as operations complete (CUDA-event times, on the watchdog thread): both wait
  // for the operations in flight first.
  std::map<std::string, OpStats> stats() const override;
  void reset_stats() override;

  // See XF_NCCL_CHECK_ASYNC.
  void check_enqueued(ncclResult_t result, const char* call, const char* file, int line,
                      const std::string& what);

 private:
  friend class NcclWork;
  using Calls = std::vector<std::pair<std::string, int64_t>>;  // (op, bytes) to count

  std::string describe(const char* op, int64_t bytes, int peer = -1) const;
  void check_usable(const std::string& what) const;
  void check_tensor(const at::Tensor& tensor, const std::string& what) const;
  void check_peer(int peer, const std::string& what) const;
  cudaStream_t compute_stream() const;
  // Locks the communicator against an abort from the watchdog, checks it is usable, orders its
  // stream after the compute stream and records the start event. Hold the lock while enqueuing.
  std::shared_ptr<NcclPending> begin(const std::string& what);
  // Records the done event after the enqueued operation, hands it to the watchdog (which counts
  // `calls` with the operation's CUDA-event time when it completes, sharing it among them) and,
  // unless `ordered_later`, orders the compute stream after it now.
  void enqueued(const std::shared_ptr<NcclPending>& pending, std::vector<at::Tensor> keep,
                const std::string& what, Calls calls, bool ordered_later = false);
  // Blocks the host until `pending` completed (barrier). The watchdog bounds the wait.
  void host_wait(const NcclPending& pending, const std::string& what);
  // The watchdog's poll: the done event and the communicator's asynchronous error.
  Watchdog::Status poll(const NcclPending& pending);
  // Enqueues a send (or recv) of `tensor` to (from) `peer`, counted as "send" (the message
  // bytes) or "recv" (0 bytes) when it completes.
  std::unique_ptr<NcclWork> point_to_point(bool is_send, const at::Tensor& tensor, int peer,
                                           const std::string& what);
  // [size * numel]: every member's `tensor`, flattened, in rank order.
  at::Tensor gather_flat(const at::Tensor& tensor, const std::string& what, Calls calls);
  void count_completed(const Calls& calls, double seconds);
  void abort();
  void release() noexcept;

  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  // Held while enqueuing and while aborting: the watchdog never aborts under an enqueue.
  mutable std::recursive_mutex comm_mutex_;
  int device_ = 0;
  std::string name_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  std::vector<int> world_ranks_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before each operation
  at::Tensor barrier_buffer_;    // [1] float on device_
  mutable std::mutex stats_mutex_;
  std::map<std::string, OpStats> completed_;  // counted by the watchdog thread
  std::unique_ptr<Watchdog> watchdog_;
};

// ---- NcclWork ---------------------------------------------------------------------------------

NcclWork::~NcclWork() {
  if (pending_ == nullptr) return;
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{} was not waited for and failed: {}", what_, e.what());
  }
}

void NcclWork::wait() {
  if (pending_ == nullptr) return;
  XF_CONTEXT(what_);
  DeviceGuard guard(comm_.device_);
  XF_CUDA_CHECK(cudaStreamWaitEvent(comm_.compute_stream(), pending_->done, 0));
  pending_.reset();
}

bool NcclWork::test() {
  if (pending_ == nullptr) return true;
  XF_CONTEXT(what_);
  DeviceGuard guard(comm_.device_);
  const cudaError_t query = cudaEventQuery(pending_->done);
  if (query == cudaErrorNotReady) {
    comm_.check_usable(what_);  // throws once the watchdog aborted the communicator
    return false;
  }
  if (query != cudaSuccess) {
    XF_THROW(what_, ": CUDA call `cudaEventQuery(done)` failed: ", cudaGetErrorName(query), ": ",
             cudaGetErrorString(query));
  }
  wait();
  return true;
}

// ---- NcclCommunicator: plumbing ---------------------------------------------------------------

std::string NcclCommunicator::describe(const char* op, int64_t bytes, int peer) const {
  std::string s = std::string("nccl ") + op;
  if (peer >= 0) {
    s += std::string(std::strstr(op, "recv") != nullptr ? " from" : " to") + " rank " +
         std::to_string(peer);
    if (peer < size()) s += " (world rank " + std::to_string(world_ranks_[peer]) + ")";
  }
  s += " on group '" + name_ + "' (" + std::to_string(bytes) + " bytes";
  if (peer < 0 && size() > 1) {
    // A collective: NCCL cannot tell which member is missing, so name them all.
    s += "; members: world ranks";
    for (size_t i = 0; i < world_ranks_.size(); ++i) {
      s += (i == 0 ? " " : ", ") + std::to_string(world_ranks_[i]);
    }
  }
  return s + ")";
}

void NcclCommunicator::check_usable(const std::string& what) const {
  if (!aborted_.load()) return;
  const std::string why = watchdog_ != nullptr ? watchdog_->message() : std::string();
  XF_THROW(what, ": the NCCL communicator of group '", name_,
           "' was aborted after an earlier error or timeout", why.empty() ? "" : ": ", why);
}

void NcclCommunicator::check_tensor(const at::Tensor& tensor, const std::string& what) const {
  XF_CHECK(tensor.defined(), what, ": the tensor is undefined");
  XF_CHECK(tensor.is_cuda(), what, " needs a CUDA tensor, got a ", tensor.device(),
           " tensor of shape ", tensor.sizes(), " (use the MPI backend for CPU tensors)");
  XF_CHECK(tensor.device().index() == device_, what, ": the tensor is on ", tensor.device(),
           " but the communicator on cuda:", device_);
  XF_CHECK(tensor.is_contiguous(), what, ": the tensor of shape ", tensor.sizes(),
           " is not contiguous");
}

void NcclCommunicator::check_peer(int peer, const std::string& what) const {
  XF_CHECK(peer >= 0 && peer < size(), what, ": peer rank ", peer, " is outside the group of ",
           size());
}

cudaStream_t NcclCommunicator::compute_stream() const {
#if XFUSER_HAVE_C10_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
  return nullptr;  // the default stream
#endif
}

std::shared_ptr<NcclPending> NcclCommunicator::begin(const std::string& what) {
  check_usable(what);
  auto pending = std::make_shared<NcclPending>();
  XF_CUDA_CHECK(cudaEventCreate(&pending->start));  // timing events: the operation's time
  XF_CUDA_CHECK(cudaEventCreate(&pending->done));
  XF_CUDA_CHECK(cudaEventRecord(ready_, compute_stream()));
  XF_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  XF_CUDA_CHECK(cudaEventRecord(pending->start, stream_));
  return pending;
}

void NcclCommunicator::enqueued(const std::shared_ptr<NcclPending>& pending,
                                std::vector<at::Tensor> keep, const std::string& what, Calls calls,
                                bool ordered_later) {
  XF_CUDA_CHECK(cudaEventRecord(pending->done, stream_));
  if (!ordered_later) XF_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), pending->done, 0));
  pending->keep = std::move(keep);
  Watchdog::Entry entry;
  entry.what = what;
  entry.deadline = Clock::now() + timeout_;
  entry.poll = [this, pending] { return poll(*pending); };
  entry.finish = [this, pending, calls = std::move(calls)](bool completed) {
    if (completed && !calls.empty()) {
      float ms = 0.0f;
      const double seconds = cudaEventElapsedTime(&ms, pending->start, pending->done) == cudaSuccess
                                 ? static_cast<double>(ms) / 1e3
                                 : 0.0;
      count_completed(calls, seconds);
    }
    pending->keep.clear();
  };
  watchdog_->watch(std::move(entry));
}

Watchdog::Status NcclCommunicator::poll(const NcclPending& pending) {
  const cudaError_t query = cudaEventQuery(pending.done);
  if (query == cudaSuccess) return {Watchdog::State::kDone, ""};
  if (query != cudaErrorNotReady) {
    return {Watchdog::State::kFailed, std::string("cudaEventQuery: ") + cudaGetErrorName(query) +
                                          ": " + cudaGetErrorString(query)};
  }
  // The asynchronous error, unless an enqueue holds the communicator (it checks on its own).
  std::unique_lock<std::recursive_mutex> lock(comm_mutex_, std::try_to_lock);
  if (lock.owns_lock() && comm_ != nullptr && !aborted_.load()) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
    if (state != ncclSuccess && state != ncclInProgress) {
      return {Watchdog::State::kFailed, std::string("NCCL reported ") + ncclGetErrorString(state) +
                                            " (" + ncclGetLastError(comm_) + ")"};
    }
  }
  return {Watchdog::State::kPending, ""};
}

void NcclCommunicator::host_wait(const NcclPending& pending, const std::string& what) {
  for (int polls = 0;; ++polls) {
    const cudaError_t query = cudaEventQuery(pending.done);
    if (query == cudaSuccess) return;
    if (query != cudaErrorNotReady) {
      XF_THROW(what, ": CUDA call `cudaEventQuery(done)` failed: ", cudaGetErrorName(query), ": ",
               cudaGetErrorString(query));
    }
    check_usable(what);  // the watchdog aborted it (deadline or error): say why
    backoff(polls);
  }
}

void NcclCommunicator::count_completed(const Calls& calls, double seconds) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  const double share = seconds / static_cast<double>(calls.size());
  for (const auto& [op, bytes] : calls) completed_[op] += OpStats{1, bytes, share};
}

std::map<std::string, OpStats> NcclCommunicator::stats() const {
  if (watchdog_ != nullptr) watchdog_->drain();
  std::map<std::string, OpStats> all = Communicator::stats();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  for (const auto& [op, s] : completed_) all[op] += s;
  return all;
}

void NcclCommunicator::reset_stats() {
  if (watchdog_ != nullptr) watchdog_->drain();
  Communicator::reset_stats();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  completed_.clear();
}

void NcclCommunicator::check_enqueued(ncclResult_t result, const char* call, const char* file,
                                      int line, const std::string& what) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) {
    const std::string detail = comm_ != nullptr ? ncclGetLastError(comm_) : "";
    throw Error(file, line, call,
                ::xfuser::detail::str_cat(call, " failed during ", what, ": ",
                                          ncclGetErrorString(result), " (", detail, ")"));
  }
  check_usable(what);
  const ncclResult_t state = poll_comm(comm_, Clock::now() + timeout_);
  if (state == ncclSuccess) return;
  const std::string detail = ncclGetLastError(comm_);
  abort();
  if (state == ncclInProgress) {
    XF_THROW(what, " timed out after ", timeout_.count(), " ms in ", call,
             "; the NCCL communicator was aborted");
  }
  XF_THROW(what, " failed in ", call, ": ", ncclGetErrorString(state), " (", detail,
           "); the NCCL communicator was aborted");
}

void NcclCommunicator::abort() {
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  if (comm_ == nullptr || aborted_.load()) return;
  // Best effort: the caller (or the watchdog) reports the error that made it abort. The handle
  // stays set (release() must not finalize it); aborted_ keeps everyone off it.
  (void)ncclCommAbort(comm_);
  aborted_ = true;
}

void NcclCommunicator::release() noexcept {
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  if (comm_ != nullptr && !aborted_.load()) {
    // Flush pending operations (bounded by the timeout), then destroy; abort when that fails.
    bool clean = false;
    try {
      const ncclResult_t finalize = ncclCommFinalize(comm_);
      clean = (finalize == ncclSuccess || finalize == ncclInProgress) &&
              poll_comm(comm_, Clock::now() + timeout_) == ncclSuccess;
    } catch (const std::exception&) {
      clean = false;
    }
    if (clean) {
      (void)ncclCommDestroy(comm_);
    } else {
      spdlog::warn("nccl communicator '{}' did not finalize cleanly; aborting it", name_);
      (void)ncclCommAbort(comm_);
    }
  }
  comm_ = nullptr;
  if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  ready_ = nullptr;
  stream_ = nullptr;
  if (previous >= 0) (void)cudaSetDevice(previous);
}

// ---- NcclCommunicator: operations -------------------------------------------------------------
//
// Each operation is enqueued on the communicator's stream and returns: the compute stream waits
// for it (an event), the watchdog watches it, and its count arrives when it completes.

void NcclCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const int64_t bytes = tensor.defined() ? nbytes(tensor) : 0;
  const std::string what = describe("all_reduce", bytes);
  profiling::Span span("comm", "all_reduce");
  trace_args(span, bytes);
  XF_CONTEXT(what);
  check_usable(what);
  check_tensor(tensor, what);
  const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type(), what);
  DeviceGuard guard(device_);
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  void* data = tensor.data_ptr();
  XF_NCCL_CHECK_ASYNC(*this,
                      ncclAllReduce(data, data, static_cast<size_t>(tensor.numel()), dtype,
                                    nccl_reduce_op(op), comm_, stream_),
                      what);
  enqueued(pending, {tensor}, what, {{"all_reduce", bytes}});
}

at::Tensor NcclCommunicator::gather_flat(const at::Tensor& tensor, const std::string& what,
                                         Calls calls) {
  const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type(), what);
  DeviceGuard guard(device_);
  at::Tensor out = at::empty({size() * tensor.numel()}, tensor.options());  // [size * numel]
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  XF_NCCL_CHECK_ASYNC(*this,
                      ncclAllGather(tensor.data_ptr(), out.data_ptr(),
                                    static_cast<size_t>(tensor.numel()), dtype, comm_, stream_),
                      what);
  enqueued(pending, {tensor, out}, what, std::move(calls));
  return out;
}

at::Tensor NcclCommunicator::all_gather(const at::Tensor& tensor, int64_t dim) {
  const int64_t input_bytes = tensor.defined() ? nbytes(tensor) : 0;
  const int64_t bytes = input_bytes * (size() - 1);  // this rank's input, to every other member
  const std::string what = describe("all_gather", input_bytes);
  profiling::Span span("comm", "all_gather");
  trace_args(span, bytes);
  XF_CONTEXT(what);
  check_usable(what);
  check_tensor(tensor, what);
  XF_CHECK(tensor.dim() >= 1, what, ": cannot gather a 0-dim tensor along dim ", dim);
  XF_CHECK(dim >= -tensor.dim() && dim < tensor.dim(), what, ": dim ", dim,
           " is out of range for shape ", tensor.sizes());
  if (dim < 0) dim += tensor.dim();
  at::Tensor flat = gather_flat(tensor, what, {{"all_gather", bytes}});  // [size * numel]
  std::vector<int64_t> stacked{size()};                                  // [size, *shape]
  stacked.insert(stacked.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor parts = flat.view(stacked);
  if (dim == 0) {
    std::vector<int64_t> shape = tensor.sizes().vec();  // [size * s0, s1, ...]
    shape[0] *= size();
    return flat.view(shape);
  }
  return at::cat(parts.unbind(0), dim);  // on the compute stream, ordered after the gather
}

// The pairs as one NCCL group of all-gathers on raw bytes (any dtype, fp8 included), enqueued on
// the communicator's stream after the compute stream's work so far; the compute stream waits
// for them in wait(), so the gathers overlap the kernels queued in between.
std::unique_ptr<Work> NcclCommunicator::all_gather_into(const std::vector<at::Tensor>& inputs,
                                                        const std::vector<at::Tensor>& outputs) {
  check_gather_pairs(*this, inputs, outputs);
  int64_t bytes = 0;
  Calls calls;
  for (const auto& in : inputs) {
    calls.push_back({"all_gather", nbytes(in) * (size() - 1)});
    bytes += calls.back().second;
  }
  const std::string what =
      describe("all_gather", bytes) + " (" + std::to_string(inputs.size()) + " tensors)";
  profiling::Span span("comm", "post all_gather");
  trace_args(span, bytes);
  XF_CONTEXT(what);
  check_usable(what);
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], what);
    check_tensor(outputs[i], what);
    keep.push_back(inputs[i]);
    keep.push_back(outputs[i]);
  }
  DeviceGuard guard(device_);
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  {
    NcclGroup group;
    for (size_t i = 0; i < inputs.size(); ++i) {
      XF_NCCL_CHECK_ASYNC(
          *this,
          ncclAllGather(inputs[i].data_ptr(), outputs[i].data_ptr(),
                        static_cast<size_t>(nbytes(inputs[i])), ncclUint8, comm_, stream_),
          what);
    }
    XF_NCCL_CHECK_ASYNC(*this, group.end(), what);
  }
  enqueued(pending, std::move(keep), what, std::move(calls), /*ordered_later=*/true);
  return std::make_unique<NcclWork>(*this, pending, what);
}

at::Tensor NcclCommunicator::all_to_all(const at::Tensor& input) {
  const int64_t total = input.defined() ? nbytes(input) : 0;
  const int64_t chunk_bytes = total / size();
  const int64_t bytes = chunk_bytes * (size() - 1);  // sent to the other ranks
  const std::string what = describe("all_to_all", bytes);
  profiling::Span span("comm", "all_to_all");
  trace_args(span, bytes);
  XF_CONTEXT(what);
  check_usable(what);
  check_tensor(input, what);
  XF_CHECK(input.dim() >= 1 && input.size(0) % size() == 0, what, ": dim 0 of shape ",
           input.sizes(), " does not split into ", size(), " equal chunks");
  const ncclDataType_t dtype = nccl_dtype(input.scalar_type(), what);
  DeviceGuard guard(device_);
  at::Tensor output = at::empty_like(input);  // same shape: chunk j from rank j
  const size_t count_per_peer = static_cast<size_t>(input.numel() / size());
  const auto* in = static_cast<const char*>(input.data_ptr());
  auto* out = static_cast<char*>(output.data_ptr());
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  NcclGroup group;
  for (int peer = 0; peer < size(); ++peer) {
    XF_NCCL_CHECK_ASYNC(
        *this, ncclSend(in + peer * chunk_bytes, count_per_peer, dtype, peer, comm_, stream_),
        what);
    XF_NCCL_CHECK_ASYNC(
        *this, ncclRecv(out + peer * chunk_bytes, count_per_peer, dtype, peer, comm_, stream_),
        what);
  }
  XF_NCCL_CHECK_ASYNC(*this, group.end(), what);
  enqueued(pending, {input, output}, what, {{"all_to_all", bytes}});
  return output;
}

void NcclCommunicator::broadcast(at::Tensor& tensor, int root) {
  const int64_t size_bytes = tensor.defined() ? nbytes(tensor) : 0;
  const int64_t bytes = rank_ == root ? size_bytes : 0;
  const std::string what = describe("broadcast", size_bytes) + " from root " + std::to_string(root);
  profiling::Span span("comm", "broadcast");
  trace_args(span, bytes);
  if (span) span.arg("root", root);
  XF_CONTEXT(what);
  check_usable(what);
  check_tensor(tensor, what);
  check_peer(root, what);
  const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type(), what);
  DeviceGuard guard(device_);
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  void* data = tensor.data_ptr();
  XF_NCCL_CHECK_ASYNC(
      *this,
      ncclBroadcast(data, data, static_cast<size_t>(tensor.numel()), dtype, root, comm_, stream_),
      what);
  enqueued(pending, {tensor}, what, {{"broadcast", bytes}});
}

std::unique_ptr<NcclWork> NcclCommunicator::point_to_point(bool is_send, const at::Tensor& tensor,
                                                           int peer, const std::string& what) {
  profiling::Span span("comm", is_send ? "post send" : "post recv");
  trace_args(span, tensor.defined() ? nbytes(tensor) : 0, peer);  // message size
  check_usable(what);
  check_tensor(tensor, what);
  check_peer(peer, what);
  const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type(), what);
  DeviceGuard guard(device_);
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  const size_t elements = static_cast<size_t>(tensor.numel());
  if (is_send) {
    XF_NCCL_CHECK_ASYNC(*this, ncclSend(tensor.data_ptr(), elements, dtype, peer, comm_, stream_),
                        what);
  } else {
    XF_NCCL_CHECK_ASYNC(*this, ncclRecv(tensor.data_ptr(), elements, dtype, peer, comm_, stream_),
                        what);
  }
  enqueued(pending, {tensor}, what, {{is_send ? "send" : "recv", is_send ? nbytes(tensor) : 0}},
           /*ordered_later=*/true);
  return std::make_unique<NcclWork>(*this, pending, what);
}

// NCCL has no tags: messages between two ranks match in the order they are issued.
void NcclCommunicator::send(const at::Tensor& tensor, int dst, Tag) {
  const std::string what = describe("send", tensor.defined() ? nbytes(tensor) : 0, dst);
  XF_CONTEXT(what);
  point_to_point(true, tensor, dst, what)->wait();
}

void NcclCommunicator::recv(at::Tensor& tensor, int src, Tag) {
  const std::string what = describe("recv", tensor.defined() ? nbytes(tensor) : 0, src);
  XF_CONTEXT(what);
  point_to_point(false, tensor, src, what)->wait();
}

std::unique_ptr<Work> NcclCommunicator::isend(const at::Tensor& tensor, int dst, Tag) {
  const std::string what = describe("isend", tensor.defined() ? nbytes(tensor) : 0, dst);
  XF_CONTEXT(what);
  return point_to_point(true, tensor, dst, what);
}

std::unique_ptr<Work> NcclCommunicator::irecv(at::Tensor& tensor, int src, Tag) {
  const std::string what = describe("irecv", tensor.defined() ? nbytes(tensor) : 0, src);
  XF_CONTEXT(what);
  return point_to_point(false, tensor, src, what);
}

// One NCCL group: every send and receive is enqueued between ncclGroupStart and ncclGroupEnd, so
// NCCL progresses them together whatever their order (no tags: messages between two ranks match
// in issue order). The group completes as one: a timeout names every operation and peer of the
// batch, since NCCL cannot tell which peer did not answer.
std::unique_ptr<Work> NcclCommunicator::batch_p2p(std::vector<P2POp> ops) {
  int64_t bytes = 0;
  std::string peers;
  for (const auto& op : ops) {
    const bool is_send = op.kind == P2POp::Kind::kSend;
    if (is_send && op.tensor.defined()) bytes += nbytes(op.tensor);
    peers += std::string(peers.empty() ? "" : ", ") +
             (is_send ? "send to rank " : "recv from rank ") + std::to_string(op.peer);
  }
  const std::string what = describe("batch_p2p", bytes) + " [" + peers + "]";
  profiling::Span span("comm", "post batch_p2p");
  trace_args(span, bytes);
  if (span) span.arg("ops", static_cast<int64_t>(ops.size()));
  XF_CONTEXT(what);
  check_usable(what);
  std::vector<at::Tensor> keep;
  Calls calls;
  std::vector<ncclDataType_t> dtypes;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    const std::string op_what = what + " op " + std::to_string(i);
    check_tensor(op.tensor, op_what);
    check_peer(op.peer, op_what);
    dtypes.push_back(nccl_dtype(op.tensor.scalar_type(), op_what));
    keep.push_back(op.tensor);
    const bool is_send = op.kind == P2POp::Kind::kSend;
    calls.emplace_back(is_send ? "send" : "recv", is_send ? nbytes(op.tensor) : 0);
  }
  DeviceGuard guard(device_);
  std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
  auto pending = begin(what);
  if (!ops.empty()) {
    NcclGroup group;
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& op = ops[i];
      const size_t elements = static_cast<size_t>(op.tensor.numel());
      if (op.kind == P2POp::Kind::kSend) {
        XF_NCCL_CHECK_ASYNC(
            *this, ncclSend(op.tensor.data_ptr(), elements, dtypes[i], op.peer, comm_, stream_),
            what);
      } else {
        XF_NCCL_CHECK_ASYNC(
            *this, ncclRecv(op.tensor.data_ptr(), elements, dtypes[i], op.peer, comm_, stream_),
            what);
      }
    }
    XF_NCCL_CHECK_ASYNC(*this, group.end(), what);
  }
  enqueued(pending, std::move(keep), what, std::move(calls), /*ordered_later=*/true);
  return std::make_unique<NcclWork>(*this, pending, what);
}

// The one operation that blocks the host: a barrier is for the host.
void NcclCommunicator::barrier() {
  const std::string what = describe("barrier", 4);
  profiling::Span span("comm", "barrier");
  trace_args(span, 4);
  XF_CONTEXT(what);
  check_usable(what);
  DeviceGuard guard(device_);
  if (!barrier_buffer_.defined()) {
    barrier_buffer_ =
        at::zeros({1}, at::TensorOptions()
                           .dtype(at::kFloat)
                           .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_))));
  }
  std::shared_ptr<NcclPending> pending;
  {
    std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
    pending = begin(what);
    void* data = barrier_buffer_.data_ptr();
    XF_NCCL_CHECK_ASYNC(*this, ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm_, stream_),
                        what);
    enqueued(pending, {barrier_buffer_}, what, {{"barrier", 0}});
  }
  host_wait(*pending, what);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  const std::string what = "nccl split of group '" + name_ + "' into '" + name + "' (color " +
                           std::to_string(color) + ", key " + std::to_string(key) + ")";
  profiling::Span span("comm", "split");
  if (span) span.arg("group", name_).arg("new_group", name);
  XF_CONTEXT(what);
  check_usable(what);
  XF_CHECK(color >= 0, what, ": color must be >= 0");
  const Clock::time_point deadline = Clock::now() + timeout_;
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(device_));

  // Every member's (color, key): [size * 2], in parent rank order.
  at::Tensor mine = at::empty({2}, at::kLong);
  mine.data_ptr<int64_t>()[0] = color;
  mine.data_ptr<int64_t>()[1] = key;
  const at::Tensor all = gather_flat(mine.to(device), what, {}).cpu();
  const int64_t* ck = all.data_ptr<int64_t>();
  std::vector<std::tuple<int64_t, int>> members;  // (key, parent rank), same color
  for (int r = 0; r < size(); ++r) {
    if (ck[2 * r] == color) members.emplace_back(ck[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> world_ranks;
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    const int parent_rank = std::get<1>(members[i]);
    world_ranks.push_back(world_ranks_[parent_rank]);
    if (parent_rank == rank_) new_rank = static_cast<int>(i);
  }
  XF_CHECK(new_rank >= 0, what, ": this rank is missing from its own color group");

  ncclComm_t child = nullptr;
  DeviceGuard guard(device_);
#if XFUSER_NCCL_HAS_SPLIT
  {
    // On a non-blocking communicator the split runs in the background: the parent reports
    // ncclInProgress until it is done, and NCCL writes `child` only then. The lock keeps the
    // watchdog from aborting the parent meanwhile. On an error or past the deadline the parent
    // is aborted (which ends the split's background job) before `child` goes out of scope.
    std::lock_guard<std::recursive_mutex> lock(comm_mutex_);
    auto fail = [&](ncclResult_t state) {
      const std::string detail = ncclGetLastError(comm_);
      abort();
      if (state == ncclInProgress) {
        XF_THROW(what, " timed out after ", timeout_.count(),
                 " ms in ncclCommSplit; the parent NCCL communicator was aborted (are all members "
                 "calling it?)");
      }
      XF_THROW("NCCL call `ncclCommSplit` failed while ", what, ": ", ncclGetErrorString(state),
               " (", detail, "); the parent NCCL communicator was aborted");
    };
    ncclConfig_t config = nonblocking_config();
    const ncclResult_t result = ncclCommSplit(comm_, color, key, &child, &config);
    if (result != ncclSuccess && result != ncclInProgress) fail(result);
    const ncclResult_t state = poll_comm(comm_, deadline);
    if (state != ncclSuccess) fail(state);
    // The parent is ready once the job ended; the child's handle is stored by that job.
    for (int polls = 0; __atomic_load_n(&child, __ATOMIC_ACQUIRE) == nullptr; ++polls) {
      if (Clock::now() > deadline) fail(ncclInProgress);
      backoff(polls);
    }
  }
  child = await_new_comm(child, ncclSuccess, "NCCL call `ncclCommSplit`", timeout_, deadline, what);
#else
  // No ncclCommSplit: the first member of each color creates a unique id, and every member
  // learns its leader's id over this (parent) communicator.
  at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, at::kByte);
  if (new_rank == 0) {
    ncclUniqueId id;
    XF_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  const at::Tensor ids = gather_flat(id_bytes.to(device), what, {}).cpu();  // [size * 128]
  const int leader = std::get<1>(members.front());
  ncclUniqueId id;
  std::memcpy(&id, ids.data_ptr<uint8_t>() + leader * sizeof(ncclUniqueId), sizeof(id));
  const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::max(deadline - Clock::now(), Clock::duration::zero()));
  child = init_comm(static_cast<int>(members.size()), id, new_rank, remaining, what);
#endif
  return std::make_unique<NcclCommunicator>(child, device_, name, timeout_, new_rank,
                                            std::move(world_ranks));
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     const std::string& name,
                                                     std::chrono::milliseconds timeout) {
  const std::string what = "creating NCCL communicator '" + name + "' over " + bootstrap.backend() +
                           " group '" + bootstrap.name() + "' (" +
                           std::to_string(bootstrap.size()) + " ranks)";
  XF_CONTEXT(what);
  nccl_probe();  // before anything: no GPU is a clear error, not a crash
  XF_CHECK(at::hasCUDA(),
           "the NCCL backend needs a libtorch built with CUDA; this one is CPU-only");
  XF_CHECK(timeout.count() > 0, "NCCL communicator '", name, "': timeout must be > 0 ms, got ",
           timeout.count());
  int device = 0;
  XF_CUDA_CHECK(cudaGetDevice(&device));

  // Group rank 0 creates the unique id; the others receive its bytes over the bootstrap group.
  at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, at::kByte);
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    XF_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  bootstrap.broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));

  ncclComm_t comm = init_comm(bootstrap.size(), id, bootstrap.rank(), timeout, what);
  return std::make_unique<NcclCommunicator>(comm, device, name, timeout, bootstrap.rank(),
                                            bootstrap.world_ranks());
}

}  // namespace xfuser::parallel
