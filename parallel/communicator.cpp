#include "parallel/communicator.h"

#include "backends/error.h"
#include "profiling/trace.h"

namespace xfuser::parallel {

void Communicator::count(const std::string& op, int64_t bytes, double seconds) {
  stats_[op] += OpStats{1, bytes, seconds};
}

void Communicator::trace_args(profiling::Span& span, int64_t bytes, int peer) const {
  if (!span) return;
  span.arg("group", name()).arg("backend", backend()).arg("bytes", bytes);
  const auto& members = world_ranks();
  if (peer >= 0) {
    span.arg("peer", peer);
    if (peer < static_cast<int>(members.size())) span.arg("peer_world_rank", members[peer]);
  } else {
    std::vector<int> peers;
    for (int r = 0; r < static_cast<int>(members.size()); ++r) {
      if (r != rank()) peers.push_back(members[r]);
    }
    span.arg("peers", peers);
  }
}

void Communicator::unsupported(const std::string& op) const {
  XF_THROW(backend(), " communicator '", name(), "' does not support ", op);
}

void Communicator::all_reduce(at::Tensor&, ReduceOp) { unsupported("all_reduce"); }
at::Tensor Communicator::all_gather(const at::Tensor&, int64_t) { unsupported("all_gather"); }
at::Tensor Communicator::all_to_all(const at::Tensor&) { unsupported("all_to_all"); }
void Communicator::broadcast(at::Tensor&, int) { unsupported("broadcast"); }
void Communicator::send(const at::Tensor&, int, Tag) { unsupported("send"); }
void Communicator::recv(at::Tensor&, int, Tag) { unsupported("recv"); }
std::unique_ptr<Work> Communicator::isend(const at::Tensor&, int, Tag) { unsupported("isend"); }
std::unique_ptr<Work> Communicator::irecv(at::Tensor&, int, Tag) { unsupported("irecv"); }
std::unique_ptr<Work> Communicator::batch_p2p(std::vector<P2POp>) { unsupported("batch_p2p"); }
void Communicator::barrier() { unsupported("barrier"); }

void check_gather_pairs(const Communicator& comm, const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs) {
  XF_CHECK(inputs.size() == outputs.size(), "all_gather_into on group '", comm.name(),
           "': ", inputs.size(), " inputs but ", outputs.size(), " outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    const at::Tensor& out = outputs[i];
    XF_CHECK(in.defined() && out.defined() && in.is_contiguous() && out.is_contiguous(),
             "all_gather_into on group '", comm.name(), "', pair ", i,
             ": input and output must be defined and contiguous");
    XF_CHECK(out.numel() == in.numel() * comm.size() && out.scalar_type() == in.scalar_type() &&
                 out.device() == in.device(),
             "all_gather_into on group '", comm.name(), "', pair ", i, ": output of ", out.numel(),
             " ", out.scalar_type(), " elements on ", out.device().str(), " for an input of ",
             in.numel(), " ", in.scalar_type(), " elements on ", in.device().str(), " (needs ",
             comm.size(),
             " times the input's elements, same "
             "dtype and device)");
  }
}

std::unique_ptr<Work> Communicator::all_gather_into(const std::vector<at::Tensor>& inputs,
                                                    const std::vector<at::Tensor>& outputs) {
  check_gather_pairs(*this, inputs, outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor out = outputs[i];
    out.view({-1}).copy_(all_gather(inputs[i].view({-1}), 0));
  }
  return std::make_unique<CompletedWork>();
}
std::unique_ptr<Communicator> Communicator::split(int, int, const std::string&) {
  unsupported("split");
}

}  // namespace xfuser::parallel
