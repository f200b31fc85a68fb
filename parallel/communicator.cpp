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
std::unique_ptr<Communicator> Communicator::split(int, int, const std::string&) {
  unsupported("split");
}

}  // namespace xfuser::parallel
