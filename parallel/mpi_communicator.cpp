#include "parallel/mpi_communicator.h"

#include <sched.h>

#include <algorithm>
#include <climits>
#include <numeric>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "profiling/trace.h"

namespace xfuser::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

#define XF_MPI_CHECK(call, ...)                                                           \
  do {                                                                                    \
    const int xf_mpi_rc_ = (call);                                                        \
    if (xf_mpi_rc_ != MPI_SUCCESS) {                                                      \
      XF_THROW(#call, " failed: ", mpi_error_string(xf_mpi_rc_), " (", __VA_ARGS__, ")"); \
    }                                                                                     \
  } while (0)

// Requests abandoned after a timeout (or by a Work destroyed while pending), with the tensors
// MPI may still read or write. Never freed: MPI owns them until the process ends.
struct Parked {
  std::vector<MPI_Request> requests;
  std::vector<at::Tensor> tensors;
};

std::vector<Parked>& parked() {
  static auto* list = new std::vector<Parked>();
  return *list;
}

void park(std::vector<MPI_Request>& requests, std::vector<at::Tensor> tensors) {
  parked().push_back(Parked{std::move(requests), std::move(tensors)});
  requests.clear();
}

// A Work dropped before it was waited for: nothing to do when its requests completed; else MPI
// may still touch `tensors`, so they are kept for the rest of the process (park) and the caller
// marks its communicator broken. Returns whether the requests were still pending.
bool park_if_pending(std::vector<MPI_Request>& requests, std::vector<at::Tensor> tensors) {
  if (requests.empty()) return false;
  int flag = 0;
  if (MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE) ==
          MPI_SUCCESS &&
      flag) {
    return false;
  }
  park(requests, std::move(tensors));
  return true;
}

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

MPI_Datatype mpi_type(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kBFloat16:
    case at::kHalf:
      return MPI_UINT16_T;  // moved as 2-byte words; all_reduce converts to float32 first
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kChar:
      return MPI_INT8_T;
    case at::kByte:
      return MPI_UINT8_T;
    case at::kBool:
      return MPI_C_BOOL;
    default:
      XF_THROW(op, ": dtype ", t, " is not supported by the MPI communicator (float32, float64, ",
               "bfloat16, float16, int64, int32, int16, int8, uint8, bool)");
  }
}

MPI_Op mpi_op(at::ScalarType t, ReduceOp op) {
  const bool logical = t == at::kBool;
  switch (op) {
    case ReduceOp::kSum:
      return logical ? MPI_LOR : MPI_SUM;
    case ReduceOp::kMax:
      return logical ? MPI_LOR : MPI_MAX;
    case ReduceOp::kMin:
      return logical ? MPI_LAND : MPI_MIN;
  }
  XF_THROW("unknown ReduceOp ", static_cast<int>(op));
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Posts one non-blocking call per chunk of at most `max_elements` elements of `work`:
// post(pointer, element count, request).
template <typename Post>
std::vector<MPI_Request> post_chunked(const at::Tensor& work, int64_t max_elements, Post post) {
  auto* data = static_cast<char*>(work.data_ptr());
  const int64_t n = work.numel();
  const int64_t esize = work.element_size();
  std::vector<MPI_Request> requests;
  for (int64_t off = 0; off < n; off += max_elements) {
    requests.emplace_back();
    post(data + off * esize, static_cast<int>(std::min(max_elements, n - off)), &requests.back());
  }
  return requests;
}

}  // namespace

// A pending isend/irecv. Holds the tensors until completion; a non-contiguous receive target is
// filled from a contiguous buffer when the receive completes.
class MpiWork : public Work {
 public:
  MpiWork(MpiCommunicator* comm, std::vector<MPI_Request> requests, at::Tensor buffer,
          at::Tensor target, const char* op, int64_t bytes, int peer)
      : comm_(comm),
        requests_(std::move(requests)),
        buffer_(std::move(buffer)),
        target_(std::move(target)),
        op_(op),
        bytes_(bytes),
        peer_(peer) {}

  ~MpiWork() override {
    // Still pending: refuse further use of the communicator (a pending receive could match a
    // later message).
    if (done_ || !park_if_pending(requests_, {buffer_, target_})) return;
    if (comm_->broken_.empty()) comm_->broken_ = std::string(op_) + " (a pending Work was dropped)";
  }

  void wait() override {
    if (done_) return;
    profiling::Span span("comm", is_send() ? "wait send" : "wait recv");
    comm_->trace_args(span, buffer_.defined() ? nbytes(buffer_) : 0, peer_);  // message size
    const auto start = Clock::now();
    comm_->wait_requests(requests_, {buffer_, target_}, op_, bytes_, peer_,
                         start + comm_->timeout_);
    finish(std::chrono::duration<double>(Clock::now() - start).count());
  }

  bool test() override {
    if (done_) return true;
    if (poll()) finish(0.0);
    return done_;
  }

  // For MpiBatchWork: true once every request of this operation has completed (the result is
  // not yet copied or counted: finish() does that).
  bool poll() {
    if (done_ || requests_.empty()) return true;
    int flag = 0;
    XF_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                             MPI_STATUSES_IGNORE),
                 op_, " on group '", comm_->name_, "', peer ", peer_);
    if (flag) requests_.clear();
    return flag != 0;
  }
  // Parks the pending requests (MPI may still touch the buffers) after a timeout.
  void abandon() {
    if (!requests_.empty()) park(requests_, {buffer_, target_});
    done_ = true;
  }
  std::string describe() const {
    std::ostringstream s;
    s << op_ << (is_send() ? " to" : " from") << " peer " << peer_ << " (tag " << tag_ << ", "
      << (buffer_.defined() ? nbytes(buffer_) : 0) << " bytes)";
    return s.str();
  }
  void set_tag(int tag) { tag_ = tag; }

  void finish(double seconds) {
    done_ = true;
    requests_.clear();
    if (target_.defined() && !target_.is_same(buffer_)) target_.copy_(buffer_);
    comm_->count(op_, bytes_, seconds);
  }

  MpiCommunicator* comm_;
  std::vector<MPI_Request> requests_;
  at::Tensor buffer_;
  at::Tensor target_;
  bool is_send() const { return op_[0] == 's'; }

  const char* op_;
  int64_t bytes_;
  int peer_;
  int tag_ = 0;
  bool done_ = false;
};

// The gathers of one all_gather_into, posted as MPI_Iallgather on raw bytes and waited for
// together under one deadline.
class MpiGatherWork : public Work {
 public:
  MpiGatherWork(MpiCommunicator* comm, std::vector<MPI_Request> requests,
                std::vector<at::Tensor> keep, std::vector<int64_t> pair_bytes)
      : comm_(comm),
        requests_(std::move(requests)),
        keep_(std::move(keep)),
        pair_bytes_(std::move(pair_bytes)) {}

  ~MpiGatherWork() override {
    // Still pending: the collective sequence of the group is broken (the members would
    // disagree on the next one).
    if (done_ || !park_if_pending(requests_, keep_)) return;
    if (comm_->broken_.empty()) comm_->broken_ = "all_gather_into (a pending Work was dropped)";
  }

  void wait() override {
    if (done_) return;
    profiling::Span span("comm", "wait all_gather");
    int64_t bytes = 0;
    for (int64_t b : pair_bytes_) bytes += b;
    comm_->trace_args(span, bytes);
    const auto start = Clock::now();
    comm_->wait_requests(requests_, keep_, "all_gather", bytes, -1, start + comm_->timeout_);
    finish(std::chrono::duration<double>(Clock::now() - start).count());
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    XF_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                             MPI_STATUSES_IGNORE),
                 "all_gather on group '", comm_->name_, "'");
    if (flag) {
      requests_.clear();
      finish(0.0);
    }
    return done_;
  }

 private:
  void finish(double seconds) {
    done_ = true;
    requests_.clear();
    keep_.clear();
    const double share = pair_bytes_.empty() ? 0.0 : seconds / pair_bytes_.size();
    for (int64_t b : pair_bytes_) comm_->count("all_gather", b, share);
  }

  MpiCommunicator* comm_;
  std::vector<MPI_Request> requests_;
  std::vector<at::Tensor> keep_;
  std::vector<int64_t> pair_bytes_;
  bool done_ = false;
};

// The operations of one batch_p2p, waited for together under one deadline.
class MpiBatchWork : public Work {
 public:
  MpiBatchWork(MpiCommunicator* comm, std::vector<std::unique_ptr<MpiWork>> ops, int64_t bytes)
      : comm_(comm), ops_(std::move(ops)), bytes_(bytes) {}

  void wait() override {
    if (done_) return;
    profiling::Span span("comm", "wait batch_p2p");
    comm_->trace_args(span, bytes_);
    if (span) span.arg("ops", static_cast<int64_t>(ops_.size()));
    const auto start = Clock::now();
    const auto deadline = start + comm_->timeout_;
    auto sleep = std::chrono::microseconds(20);
    for (int polls = 0; !poll_all(); ++polls) {
      if (Clock::now() >= deadline) timed_out();
      if (polls < 64) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
      }
    }
    finish(std::chrono::duration<double>(Clock::now() - start).count());
  }

  bool test() override {
    if (done_) return true;
    if (poll_all()) finish(0.0);
    return done_;
  }

 private:
  bool poll_all() {
    bool all = true;
    for (auto& op : ops_) all = op->poll() && all;  // poll every one: progress for all
    return all;
  }

  // Every operation's time is its share of the wait (the batch completes as one).
  void finish(double seconds) {
    done_ = true;
    const double share = ops_.empty() ? 0.0 : seconds / static_cast<double>(ops_.size());
    for (auto& op : ops_) op->finish(share);
  }

  [[noreturn]] void timed_out() {
    std::string pending;
    for (auto& op : ops_) {
      if (op->poll()) continue;
      pending += (pending.empty() ? "" : "; ") + op->describe();
    }
    for (auto& op : ops_) op->abandon();
    done_ = true;
    comm_->broken_ = "batch_p2p";
    XF_THROW("timed out after ", comm_->timeout_.count() / 1000.0, "s in batch_p2p on group '",
             comm_->name_, "' (rank ", comm_->rank_, " of ", comm_->size_, ", ", ops_.size(),
             " operations); not completed: ", pending);
  }

  MpiCommunicator* comm_;
  std::vector<std::unique_ptr<MpiWork>> ops_;
  int64_t bytes_;
  bool done_ = false;
};

MpiCommunicator::MpiCommunicator(std::string name, std::chrono::milliseconds timeout)
    : name_(std::move(name)), timeout_(timeout), max_elements_(INT_MAX) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  XF_CHECK(initialized && !finalized, "MPI communicator '", name_,
           "': MPI is not initialised (create a parallel::MpiEnvironment first)");
  XF_CHECK(timeout_.count() > 0, "MPI communicator '", name_, "': timeout must be > 0, got ",
           timeout_.count(), " ms");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  world_ranks_.resize(size_);
  std::iota(world_ranks_.begin(), world_ranks_.end(), 0);
  std::vector<MPI_Request> requests(1);
  XF_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &requests[0]), "creating '", name_, "'");
  wait_requests(requests, {}, "comm_dup", 0, -1, Clock::now() + timeout_);
  XF_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "creating '", name_, "'");
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout,
                                 std::vector<int> world_ranks, int64_t max_elements)
    : comm_(comm),
      name_(std::move(name)),
      timeout_(timeout),
      world_ranks_(std::move(world_ranks)),
      max_elements_(max_elements) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  XF_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "creating '", name_, "'");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A broken communicator keeps parked requests that still reference it: never freed.
  if (comm_ != MPI_COMM_NULL && !finalized && broken_.empty()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::set_max_elements_per_call(int64_t n) {
  XF_CHECK(n >= 1 && n <= INT_MAX, "max_elements_per_call must be in [1, ", INT_MAX, "], got ", n);
  max_elements_ = n;
}

void MpiCommunicator::check_usable(const char* op) const {
  XF_CHECK(broken_.empty(), op, " on group '", name_, "': the communicator is unusable after ",
           broken_, " timed out");
}

void MpiCommunicator::check_tensor(const at::Tensor& t, const char* op) const {
  XF_CHECK(t.defined(), op, " on group '", name_, "': undefined tensor");
  XF_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, op, " on group '", name_,
           "': the MPI communicator needs dense CPU tensors, got one on ", t.device(),
           " (CUDA-aware MPI is not supported; CUDA tensors go through the NCCL backend)");
  mpi_type(t.scalar_type(), op);
}

void MpiCommunicator::check_peer(int peer, const char* op) const {
  XF_CHECK(peer >= 0 && peer < size_, op, " on group '", name_, "': peer rank ", peer,
           " is outside [0, ", size_, ")");
}

void MpiCommunicator::wait_requests(std::vector<MPI_Request>& requests,
                                    std::vector<at::Tensor> keep_alive, const char* op,
                                    int64_t bytes, int peer, Clock::time_point deadline) {
  const int n = static_cast<int>(requests.size());
  if (n == 0) return;
  std::vector<MPI_Status> statuses(n);
  auto sleep = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    int flag = 0;
    const int rc = MPI_Testall(n, requests.data(), &flag, statuses.data());
    if (rc != MPI_SUCCESS) {
      int code = rc;
      if (rc == MPI_ERR_IN_STATUS) {
        for (const auto& s : statuses) {
          if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) code = s.MPI_ERROR;
        }
      }
      XF_THROW(op, " on group '", name_, "' (rank ", rank_, " of ", size_,
               ") failed: ", mpi_error_string(code));
    }
    if (flag) {
      requests.clear();
      return;
    }
    if (Clock::now() >= deadline) break;
    if (polls < 64) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
  }
  park(requests, std::move(keep_alive));
  broken_ = op;
  std::ostringstream peer_text;
  if (peer >= 0) peer_text << ", peer " << peer;
  XF_THROW("timed out after ", timeout_.count() / 1000.0, "s in ", op, " on group '", name_,
           "' (rank ", rank_, " of ", size_, peer_text.str(), ", ", bytes, " bytes)");
}

void MpiCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  static constexpr const char* kOp = "all_reduce";
  profiling::Span span("comm", kOp);
  check_usable(kOp);
  check_tensor(tensor, kOp);
  const auto start = Clock::now();
  const int64_t bytes = nbytes(tensor);
  trace_args(span, bytes);
  at::Tensor work = tensor;
  if (is_half(tensor.scalar_type())) {
    work = tensor.to(at::kFloat).contiguous();  // reduce in float32
  } else if (!tensor.is_contiguous()) {
    work = tensor.contiguous();
  }
  const MPI_Datatype type = mpi_type(work.scalar_type(), kOp);
  const MPI_Op mop = mpi_op(work.scalar_type(), op);
  auto requests = post_chunked(work, max_elements_, [&](char* p, int count, MPI_Request* r) {
    XF_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p, count, type, mop, comm_, r), kOp, " on group '",
                 name_, "', shape ", shape_string(tensor.sizes()));
  });
  wait_requests(requests, {work}, kOp, bytes, -1, start + timeout_);
  if (!work.is_same(tensor)) tensor.copy_(work);
  count(kOp, bytes, std::chrono::duration<double>(Clock::now() - start).count());
}

at::Tensor MpiCommunicator::all_gather(const at::Tensor& tensor, int64_t dim) {
  static constexpr const char* kOp = "all_gather";
  profiling::Span span("comm", kOp);
  check_usable(kOp);
  check_tensor(tensor, kOp);
  const int64_t nd = tensor.dim();
  XF_CHECK(nd >= 1, kOp, " on group '", name_, "': needs a tensor with at least one dimension");
  const int64_t d = dim < 0 ? dim + nd : dim;
  XF_CHECK(d >= 0 && d < nd, kOp, " on group '", name_, "': dim ", dim, " is out of range for ",
           "shape ", shape_string(tensor.sizes()));
  const auto start = Clock::now();
  const at::Tensor in = tensor.contiguous();
  const int64_t n = in.numel();
  XF_CHECK(n <= max_elements_, kOp, " on group '", name_, "': ", n, " elements per rank (shape ",
           shape_string(tensor.sizes()), ") exceed the MPI count limit of ", max_elements_,
           "; gather smaller pieces");
  std::vector<int64_t> buf_sizes{size_};
  buf_sizes.insert(buf_sizes.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor buf = at::empty(buf_sizes, in.options());  // [P, *shape]
  const MPI_Datatype type = mpi_type(in.scalar_type(), kOp);
  std::vector<MPI_Request> requests(1);
  XF_MPI_CHECK(MPI_Iallgather(in.data_ptr(), static_cast<int>(n), type, buf.data_ptr(),
                              static_cast<int>(n), type, comm_, &requests[0]),
               kOp, " on group '", name_, "', shape ", shape_string(tensor.sizes()));
  const int64_t bytes = nbytes(in) * (size_ - 1);
  trace_args(span, bytes);
  wait_requests(requests, {in, buf}, kOp, bytes, -1, start + timeout_);
  std::vector<int64_t> out_sizes(in.sizes().begin(), in.sizes().end());
  out_sizes[d] *= size_;
  // [P, s0, .., sd, ..] -> [s0, .., P, sd, ..] -> [s0, .., P*sd, ..]: rank p's block first.
  at::Tensor out = d == 0 ? buf.view(out_sizes) : buf.movedim(0, d).reshape(out_sizes);
  count(kOp, bytes, std::chrono::duration<double>(Clock::now() - start).count());
  return out;
}

std::unique_ptr<Work> MpiCommunicator::all_gather_into(const std::vector<at::Tensor>& inputs,
                                                       const std::vector<at::Tensor>& outputs) {
  static constexpr const char* kOp = "all_gather";
  profiling::Span span("comm", "post all_gather");
  check_usable(kOp);
  check_gather_pairs(*this, inputs, outputs);
  std::vector<int64_t> pair_bytes;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    // Raw bytes travel: any dtype (fp8 included) needs only dense host memory.
    XF_CHECK(inputs[i].device().is_cpu() && outputs[i].device().is_cpu(), kOp, " on group '", name_,
             "': the MPI communicator needs CPU tensors, pair ", i, " is on ",
             inputs[i].device().str());
    const int64_t n = nbytes(inputs[i]);
    XF_CHECK(n <= max_elements_, kOp, " on group '", name_, "': ", n, " bytes per rank (pair ", i,
             ") exceed the MPI count limit of ", max_elements_, "; gather smaller pieces");
    pair_bytes.push_back(n * (size_ - 1));
    keep.push_back(inputs[i]);
    keep.push_back(outputs[i]);
  }
  int64_t bytes = 0;
  for (int64_t b : pair_bytes) bytes += b;
  trace_args(span, bytes);
  if (span) span.arg("pairs", static_cast<int64_t>(inputs.size()));
  std::vector<MPI_Request> requests(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int n = static_cast<int>(nbytes(inputs[i]));
    XF_MPI_CHECK(MPI_Iallgather(inputs[i].data_ptr(), n, MPI_BYTE, outputs[i].data_ptr(), n,
                                MPI_BYTE, comm_, &requests[i]),
                 kOp, " on group '", name_, "', pair ", i, " of ", n, " bytes");
  }
  return std::make_unique<MpiGatherWork>(this, std::move(requests), std::move(keep),
                                         std::move(pair_bytes));
}

at::Tensor MpiCommunicator::all_to_all(const at::Tensor& input) {
  static constexpr const char* kOp = "all_to_all";
  profiling::Span span("comm", kOp);
  check_usable(kOp);
  check_tensor(input, kOp);
  XF_CHECK(input.dim() >= 1 && input.size(0) % size_ == 0, kOp, " on group '", name_,
           "': dim 0 of shape ", shape_string(input.sizes()),
           " must be divisible by the group size ", size_);
  const auto start = Clock::now();
  const at::Tensor in = input.contiguous();
  const int64_t chunk = in.numel() / size_;
  XF_CHECK(chunk <= max_elements_, kOp, " on group '", name_, "': chunks of ", chunk,
           " elements (shape ", shape_string(input.sizes()), ") exceed the MPI count limit of ",
           max_elements_, "; exchange smaller pieces");
  at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  const MPI_Datatype type = mpi_type(in.scalar_type(), kOp);
  std::vector<MPI_Request> requests(1);
  XF_MPI_CHECK(MPI_Ialltoall(in.data_ptr(), static_cast<int>(chunk), type, out.data_ptr(),
                             static_cast<int>(chunk), type, comm_, &requests[0]),
               kOp, " on group '", name_, "', shape ", shape_string(input.sizes()));
  const int64_t bytes = nbytes(in) / size_ * (size_ - 1);
  trace_args(span, bytes);
  wait_requests(requests, {in, out}, kOp, bytes, -1, start + timeout_);
  count(kOp, bytes, std::chrono::duration<double>(Clock::now() - start).count());
  return out;
}

void MpiCommunicator::broadcast(at::Tensor& tensor, int root) {
  static constexpr const char* kOp = "broadcast";
  profiling::Span span("comm", kOp);
  check_usable(kOp);
  check_tensor(tensor, kOp);
  check_peer(root, kOp);
  const auto start = Clock::now();
  at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const MPI_Datatype type = mpi_type(work.scalar_type(), kOp);
  auto requests = post_chunked(work, max_elements_, [&](char* p, int count, MPI_Request* r) {
    XF_MPI_CHECK(MPI_Ibcast(p, count, type, root, comm_, r), kOp, " on group '", name_, "', shape ",
                 shape_string(tensor.sizes()));
  });
  const int64_t bytes = rank_ == root ? nbytes(tensor) : 0;
  trace_args(span, bytes);
  if (span) span.arg("root", root);
  wait_requests(requests, {work}, kOp, bytes, -1, start + timeout_);
  if (!work.is_same(tensor)) tensor.copy_(work);
  count(kOp, bytes, std::chrono::duration<double>(Clock::now() - start).count());
}

std::unique_ptr<Work> MpiCommunicator::start_p2p(const at::Tensor& tensor, int peer, Tag tag,
                                                 bool is_send) {
  const char* op = is_send ? "send" : "recv";
  profiling::Span span("comm", is_send ? "post send" : "post recv");
  trace_args(span, tensor.defined() ? nbytes(tensor) : 0, peer);  // message size
  if (span) span.arg("tag", static_cast<int>(tag));
  check_usable(op);
  check_tensor(tensor, op);
  check_peer(peer, op);
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  at::Tensor target = is_send ? at::Tensor() : tensor;
  const MPI_Datatype type = mpi_type(buffer.scalar_type(), op);
  auto* data = static_cast<char*>(buffer.data_ptr());
  const int64_t n = buffer.numel();
  const int64_t esize = buffer.element_size();
  std::vector<MPI_Request> requests;
  // Chunks of one message share the tag; MPI's non-overtaking order matches them in order.
  for (int64_t off = 0; off == 0 || off < n; off += max_elements_) {
    const int count = static_cast<int>(std::min(max_elements_, n - off));
    requests.emplace_back();
    if (is_send) {
      XF_MPI_CHECK(MPI_Isend(data + off * esize, count, type, peer, static_cast<int>(tag), comm_,
                             &requests.back()),
                   op, " on group '", name_, "' to peer ", peer, ", shape ",
                   shape_string(tensor.sizes()));
    } else {
      XF_MPI_CHECK(MPI_Irecv(data + off * esize, count, type, peer, static_cast<int>(tag), comm_,
                             &requests.back()),
                   op, " on group '", name_, "' from peer ", peer, ", shape ",
                   shape_string(tensor.sizes()));
    }
    if (n == 0) break;
  }
  return std::make_unique<MpiWork>(this, std::move(requests), std::move(buffer), std::move(target),
                                   op, is_send ? nbytes(tensor) : 0, peer);
}

void MpiCommunicator::send(const at::Tensor& tensor, int dst, Tag tag) {
  start_p2p(tensor, dst, tag, true)->wait();
}

void MpiCommunicator::recv(at::Tensor& tensor, int src, Tag tag) {
  start_p2p(tensor, src, tag, false)->wait();
}

std::unique_ptr<Work> MpiCommunicator::isend(const at::Tensor& tensor, int dst, Tag tag) {
  return start_p2p(tensor, dst, tag, true);
}

std::unique_ptr<Work> MpiCommunicator::irecv(at::Tensor& tensor, int src, Tag tag) {
  return start_p2p(tensor, src, tag, false);
}

std::unique_ptr<Work> MpiCommunicator::batch_p2p(std::vector<P2POp> ops) {
  static constexpr const char* kOp = "batch_p2p";
  profiling::Span span("comm", "post batch_p2p");
  check_usable(kOp);
  // Every operation is checked before any is posted: a bad one leaves nothing pending.
  int64_t bytes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    const bool is_send = op.kind == P2POp::Kind::kSend;
    const std::string what = std::string(kOp) + " op " + std::to_string(i) + " (" +
                             (is_send ? "send to" : "recv from") + " peer " +
                             std::to_string(op.peer) + ")";
    check_tensor(op.tensor, what.c_str());
    check_peer(op.peer, what.c_str());
    if (is_send) bytes += nbytes(op.tensor);
  }
  trace_args(span, bytes);
  if (span) span.arg("ops", static_cast<int64_t>(ops.size()));
  std::vector<std::unique_ptr<MpiWork>> works;
  works.reserve(ops.size());
  for (auto& op : ops) {
    const bool is_send = op.kind == P2POp::Kind::kSend;
    std::unique_ptr<Work> w = start_p2p(op.tensor, op.peer, op.tag, is_send);
    auto* mw = static_cast<MpiWork*>(w.release());  // start_p2p makes MpiWorks
    mw->set_tag(static_cast<int>(op.tag));
    works.emplace_back(mw);
  }
  return std::make_unique<MpiBatchWork>(this, std::move(works), bytes);
}

void MpiCommunicator::barrier() {
  static constexpr const char* kOp = "barrier";
  profiling::Span span("comm", kOp);
  trace_args(span, 0);
  check_usable(kOp);
  const auto start = Clock::now();
  std::vector<MPI_Request> requests(1);
  XF_MPI_CHECK(MPI_Ibarrier(comm_, &requests[0]), kOp, " on group '", name_, "'");
  wait_requests(requests, {}, kOp, 0, -1, start + timeout_);
  count(kOp, 0, std::chrono::duration<double>(Clock::now() - start).count());
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  return split(color, key, name, timeout_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, const std::string& name,
                                                        std::chrono::milliseconds timeout) {
  static constexpr const char* kOp = "split";
  profiling::Span span("comm", kOp);
  trace_args(span, 8 * (size_ - 1));
  if (span) span.arg("new_group", name);
  check_usable(kOp);
  XF_CHECK(color >= 0, kOp, " of group '", name_, "' into '", name, "': color must be >= 0, got ",
           color);
  XF_CHECK(timeout.count() > 0, kOp, " of group '", name_, "' into '", name,
           "': timeout must be > 0, got ", timeout.count(), " ms");
  // Exchange (color, key) first under the timeout, so a missing member is an error, not a hang;
  // MPI_Comm_split then only runs once every member has arrived.
  at::Tensor mine = at::tensor(std::vector<int32_t>{color, key}, at::kInt);
  at::Tensor all = at::empty({2 * size_}, at::kInt);
  std::vector<MPI_Request> requests(1);
  XF_MPI_CHECK(MPI_Iallgather(mine.data_ptr(), 2, MPI_INT32_T, all.data_ptr(), 2, MPI_INT32_T,
                              comm_, &requests[0]),
               kOp, " of group '", name_, "' into '", name, "'");
  wait_requests(requests, {mine, all}, kOp, 8 * (size_ - 1), -1, Clock::now() + timeout_);
  const auto* ck = all.data_ptr<int32_t>();
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (ck[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return ck[2 * a + 1] < ck[2 * b + 1]; });
  std::vector<int> world;
  world.reserve(members.size());
  for (int r : members) world.push_back(world_ranks_[r]);

  MPI_Comm sub = MPI_COMM_NULL;
  XF_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub), kOp, " of group '", name_, "' into '", name,
               "'");
  auto out = std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(sub, name, timeout, std::move(world), max_elements_));
  XF_CHECK(out->size() == static_cast<int>(members.size()) && members[out->rank()] == rank_, kOp,
           " of group '", name_, "' into '", name, "': MPI_Comm_split disagrees with the ",
           "exchanged (color, key) pairs");
  return out;
}

}  // namespace xfuser::parallel
