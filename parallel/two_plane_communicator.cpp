#include "parallel/two_plane_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "backends/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace xfuser::parallel {
namespace {

// A host-plane operation on host copies of device tensors: `done` copies the received host
// buffers back to the device once the operation has completed (and keeps the host copies of
// the sends alive until then).
class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, std::function<void()> done)
      : inner_(std::move(inner)), done_(std::move(done)) {}

  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (finished_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (done_) done_();
    done_ = nullptr;
  }

  std::unique_ptr<Work> inner_;
  std::function<void()> done_;
  bool finished_ = false;
};

at::Tensor host_copy(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

at::Tensor host_buffer(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU));
}

// CPU tensors (and undefined ones, which the host plane reports) go to the host plane as they are.
bool on_host(const at::Tensor& t) { return !t.defined() || t.is_cpu(); }

// Runs the in-place operation `op` on a host copy of device tensor `t`, then copies it back.
template <typename F>
void through_host(at::Tensor& t, F&& op) {
  at::Tensor h = host_copy(t);
  op(h);
  t.copy_(h);
}

}  // namespace

TwoPlaneCommunicator::TwoPlaneCommunicator(std::shared_ptr<Communicator> host,
                                           std::shared_ptr<Communicator> device)
    : host_(std::move(host)), device_(std::move(device)) {
  XF_CHECK(host_ != nullptr, "TwoPlaneCommunicator: no host-plane communicator");
  if (device_) {
    XF_CHECK(device_->size() == host_->size() && device_->rank() == host_->rank() &&
                 device_->world_ranks() == host_->world_ranks(),
             "group '", host_->name(), "': the device plane '", device_->name(), "' (rank ",
             device_->rank(), " of ", device_->size(), ") does not have the host plane's members (",
             "rank ", host_->rank(), " of ", host_->size(), ")");
  }
}

std::string TwoPlaneCommunicator::backend() const {
  return device_ ? host_->backend() + "+" + device_->backend() : host_->backend();
}

Communicator* TwoPlaneCommunicator::plane_for(const at::Tensor& t) const {
  return t.defined() && t.is_cuda() && device_ ? device_.get() : nullptr;
}

void TwoPlaneCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  if (auto* dev = plane_for(tensor)) return dev->all_reduce(tensor, op);
  if (on_host(tensor)) return host_->all_reduce(tensor, op);
  through_host(tensor, [&](at::Tensor& h) { host_->all_reduce(h, op); });
}

at::Tensor TwoPlaneCommunicator::all_gather(const at::Tensor& tensor, int64_t dim) {
  if (auto* dev = plane_for(tensor)) return dev->all_gather(tensor, dim);
  if (on_host(tensor)) return host_->all_gather(tensor, dim);
  return host_->all_gather(host_copy(tensor), dim).to(tensor.device());
}

at::Tensor TwoPlaneCommunicator::all_to_all(const at::Tensor& input) {
  if (auto* dev = plane_for(input)) return dev->all_to_all(input);
  if (on_host(input)) return host_->all_to_all(input);
  return host_->all_to_all(host_copy(input)).to(input.device());
}

void TwoPlaneCommunicator::broadcast(at::Tensor& tensor, int root) {
  if (auto* dev = plane_for(tensor)) return dev->broadcast(tensor, root);
  if (on_host(tensor)) return host_->broadcast(tensor, root);
  through_host(tensor, [&](at::Tensor& h) { host_->broadcast(h, root); });
}

void TwoPlaneCommunicator::send(const at::Tensor& tensor, int dst, Tag tag) {
  if (auto* dev = plane_for(tensor)) return dev->send(tensor, dst, tag);
  if (on_host(tensor)) return host_->send(tensor, dst, tag);
  host_->send(host_copy(tensor), dst, tag);
}

void TwoPlaneCommunicator::recv(at::Tensor& tensor, int src, Tag tag) {
  if (auto* dev = plane_for(tensor)) return dev->recv(tensor, src, tag);
  if (on_host(tensor)) return host_->recv(tensor, src, tag);
  at::Tensor h = host_buffer(tensor);
  host_->recv(h, src, tag);
  tensor.copy_(h);
}

std::unique_ptr<Work> TwoPlaneCommunicator::isend(const at::Tensor& tensor, int dst, Tag tag) {
  if (auto* dev = plane_for(tensor)) return dev->isend(tensor, dst, tag);
  if (on_host(tensor)) return host_->isend(tensor, dst, tag);
  at::Tensor h = host_copy(tensor);
  auto inner = host_->isend(h, dst, tag);
  return std::make_unique<StagedWork>(std::move(inner), [h]() {});
}

std::unique_ptr<Work> TwoPlaneCommunicator::irecv(at::Tensor& tensor, int src, Tag tag) {
  if (auto* dev = plane_for(tensor)) return dev->irecv(tensor, src, tag);
  if (on_host(tensor)) return host_->irecv(tensor, src, tag);
  at::Tensor h = host_buffer(tensor);
  auto inner = host_->irecv(h, src, tag);
  at::Tensor target = tensor;
  return std::make_unique<StagedWork>(std::move(inner), [h, target]() mutable { target.copy_(h); });
}

std::unique_ptr<Work> TwoPlaneCommunicator::batch_p2p(std::vector<P2POp> ops) {
  bool any_cuda = false, any_cpu = false;
  for (const auto& op : ops) {
    (op.tensor.defined() && op.tensor.is_cuda() ? any_cuda : any_cpu) = true;
  }
  XF_CHECK(!(any_cuda && any_cpu), "batch_p2p on group '", name(),
           "': the batch mixes CPU and CUDA tensors (one batch travels on one plane)");
  if (!any_cuda) return host_->batch_p2p(std::move(ops));
  if (device_) return device_->batch_p2p(std::move(ops));
  // Staged: sends from host copies, receives into host buffers copied back on completion.
  std::vector<P2POp> host_ops;
  std::vector<std::pair<at::Tensor, at::Tensor>> back;  // (device target, host buffer)
  host_ops.reserve(ops.size());
  for (const auto& op : ops) {
    if (op.kind == P2POp::Kind::kSend) {
      host_ops.push_back(P2POp::send(host_copy(op.tensor), op.peer, op.tag));
    } else {
      at::Tensor h = host_buffer(op.tensor);
      back.emplace_back(op.tensor, h);
      host_ops.push_back(P2POp::recv(h, op.peer, op.tag));
    }
  }
  std::vector<at::Tensor> keep;  // the host copies of the sends live until completion
  for (const auto& op : host_ops)
    if (op.kind == P2POp::Kind::kSend) keep.push_back(op.tensor);
  auto inner = host_->batch_p2p(std::move(host_ops));
  return std::make_unique<StagedWork>(std::move(inner), [back, keep]() mutable {
    for (auto& [target, h] : back) target.copy_(h);
  });
}

std::unique_ptr<Work> TwoPlaneCommunicator::all_gather_into(
    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  check_gather_pairs(*this, inputs, outputs);
  if (inputs.empty()) return std::make_unique<CompletedWork>();
  Communicator* dev = plane_for(inputs[0]);
  bool host = on_host(inputs[0]);
  for (const auto& t : inputs) {
    XF_CHECK(plane_for(t) == dev && on_host(t) == host, "all_gather_into on group '", name(),
             "': the pairs mix devices (one operation travels on one plane)");
  }
  if (dev != nullptr) return dev->all_gather_into(inputs, outputs);
  if (host) return host_->all_gather_into(inputs, outputs);
  // Staged: the inputs' host copies gathered into host buffers, copied back on completion.
  std::vector<at::Tensor> host_in, host_out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    host_in.push_back(host_copy(inputs[i]));
    host_out.push_back(host_buffer(outputs[i]));
  }
  auto inner = host_->all_gather_into(host_in, host_out);
  return std::make_unique<StagedWork>(std::move(inner), [outputs, host_in, host_out]() mutable {
    for (size_t i = 0; i < outputs.size(); ++i) outputs[i].copy_(host_out[i]);
  });
}

void TwoPlaneCommunicator::barrier() { host_->barrier(); }

std::unique_ptr<Communicator> TwoPlaneCommunicator::split(int color, int key,
                                                          const std::string& name) {
  std::shared_ptr<Communicator> host = host_->split(color, key, name);
  std::shared_ptr<Communicator> device = device_ ? device_->split(color, key, name) : nullptr;
  return std::make_unique<TwoPlaneCommunicator>(std::move(host), std::move(device));
}

std::map<std::string, OpStats> TwoPlaneCommunicator::stats() const {
  std::map<std::string, OpStats> out = host_->stats();
  if (device_) {
    for (const auto& [op, st] : device_->stats()) out[op] += st;
  }
  return out;
}

void TwoPlaneCommunicator::reset_stats() {
  host_->reset_stats();
  if (device_) device_->reset_stats();
}

std::shared_ptr<Communicator> make_world_communicator(const std::string& comm_backend,
                                                      const c10::Device& device, int local_size,
                                                      int visible_gpus,
                                                      std::chrono::milliseconds timeout) {
  XF_CHECK(comm_backend == "auto" || comm_backend == "nccl" || comm_backend == "mpi",
           "--comm_backend '", comm_backend, "' is not a backend (expected auto, nccl or mpi)");
  auto mpi = std::make_shared<MpiCommunicator>("world", timeout);
  if (!device.is_cuda()) {
    XF_CHECK(comm_backend != "nccl", "--comm_backend nccl needs --device cuda (this run is on ",
             device.str(), "; NCCL moves CUDA tensors only)");
    return mpi;
  }
  // The same facts on every rank: does any rank lack NCCL; do two ranks drive one GPU.
  at::Tensor facts = at::tensor({nccl_compiled_in() ? 0 : 1}, at::kInt);
  mpi->all_reduce(facts, ReduceOp::kMax);
  const bool any_without_nccl = facts[0].item<int>() != 0;
  bool any_shared = false;
  std::string sharing;
  if (!any_without_nccl) {
    // Which physical GPU each rank drives (host name, PCI bus id), from every rank: counting
    // local ranks against visible GPUs would misjudge launchers that give each rank its own
    // CUDA_VISIBLE_DEVICES (one visible GPU per rank, none shared).
    char host[256] = {0};
    (void)gethostname(host, sizeof(host) - 1);
    const std::string mine = std::string(host) + " " + gpu_bus_id(device.index());
    constexpr int64_t kIdBytes = 320;
    at::Tensor id = at::zeros({1, kIdBytes}, at::kByte);
    std::memcpy(id.data_ptr(), mine.data(), std::min<size_t>(mine.size(), kIdBytes - 1));
    const at::Tensor all = mpi->all_gather(id).contiguous();  // [world, kIdBytes]
    std::map<std::string, std::vector<int>> drivers;          // GPU -> world ranks
    for (int64_t r = 0; r < all.size(0); ++r) {
      const char* bytes = reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>());
      drivers[std::string(bytes, strnlen(bytes, kIdBytes))].push_back(
          mpi->world_ranks()[static_cast<size_t>(r)]);
    }
    for (const auto& [gpu, ranks] : drivers) {
      if (ranks.size() < 2 || any_shared) continue;
      any_shared = true;
      sharing = "ranks share a GPU (world ranks";
      for (size_t i = 0; i < ranks.size(); ++i) {
        sharing += (i == 0 ? " " : ", ") + std::to_string(ranks[i]);
      }
      sharing += " drive the GPU at PCI " + gpu.substr(gpu.rfind(' ') + 1) + " of host " +
                 gpu.substr(0, gpu.rfind(' ')) + "; this node: " + std::to_string(local_size) +
                 " ranks, " + std::to_string(visible_gpus) + " visible GPUs)";
    }
  }
  if (comm_backend == "nccl") {
    XF_CHECK(!any_without_nccl,
             "--comm_backend nccl: this build has no NCCL backend (configure against a CUDA "
             "libtorch with XFUSER_WITH_NCCL=ON), or use --comm_backend mpi");
    XF_CHECK(!any_shared, "--comm_backend nccl: ", sharing,
             "; NCCL needs one rank per GPU: launch at most one rank per GPU, or use "
             "--comm_backend mpi (device tensors through host memory)");
  }
  if (comm_backend == "mpi" || any_without_nccl || any_shared) {
    if (comm_backend == "auto" && mpi->rank() == 0) {
      spdlog::warn("device tensors travel over MPI through host memory: {}",
                   any_without_nccl ? "this build has no NCCL backend" : sharing);
    }
    return std::make_shared<TwoPlaneCommunicator>(mpi, nullptr);
  }
  std::shared_ptr<Communicator> nccl = make_nccl_communicator(*mpi, "world", timeout);
  return std::make_shared<TwoPlaneCommunicator>(mpi, std::move(nccl));
}

}  // namespace xfuser::parallel
