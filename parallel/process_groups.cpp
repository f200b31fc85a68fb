#include "parallel/process_groups.h"

#include "backends/error.h"

namespace xfuser::parallel {

ProcessGroups::ProcessGroups(const WorldConfig& config, std::shared_ptr<Communicator> world)
    : config_(config), world_(std::move(world)) {
  XF_CHECK(world_ != nullptr, "ProcessGroups: no world communicator");
  XF_CHECK(world_->size() == config_.world_size(), "ProcessGroups: communicator '", world_->name(),
           "' has ", world_->size(), " ranks but the parallel config is ", config_.to_string());
  coords_ = config_.coords(world_->rank());
  for (MeshDim dim : kAllMeshDims) {
    XF_CONTEXT("creating the ", mesh_dim_name(dim), " group of rank ", world_->rank());
    const auto members = config_.group(dim, world_->rank());
    auto comm =
        world_->split(members.front(), coords_.get(dim), config_.group_name(dim, world_->rank()));
    std::vector<int> expected;
    for (int m : members) expected.push_back(world_->world_ranks()[m]);
    XF_CHECK(comm->size() == config_.degree(dim) && comm->rank() == coords_.get(dim) &&
                 comm->world_ranks() == expected,
             "group '", comm->name(), "' came out with rank ", comm->rank(), " of ", comm->size(),
             ", expected rank ", coords_.get(dim), " of ", config_.degree(dim));
    groups_[dim] = std::move(comm);
  }
  {
    XF_CONTEXT("creating the replica group of rank ", world_->rank());
    std::vector<int> members;
    std::string name = "replica[";
    for (int r = 0; r < config_.world_size(); ++r) {
      if (config_.coords(r).dp != coords_.dp) continue;
      name += (members.empty() ? "" : ",") + std::to_string(r);
      members.push_back(r);
    }
    replica_ = world_->split(members.front(), world_->rank(), name + "]");
    XF_CHECK(replica_->size() == static_cast<int>(members.size()), "group '", replica_->name(),
             "' came out with ", replica_->size(), " ranks, expected ", members.size());
  }
}

void ProcessGroups::create_fsdp_group() {
  if (fsdp_) return;
  XF_CONTEXT("creating the fsdp group of rank ", world_->rank());
  std::vector<int> members;
  std::string name = "fsdp[";
  for (int r = 0; r < config_.world_size(); ++r) {
    const RankCoords c = config_.coords(r);
    if (c.tp != coords_.tp || c.pp != coords_.pp || c.dp != coords_.dp) continue;
    name += (members.empty() ? "" : ",") + std::to_string(r);
    members.push_back(r);
  }
  fsdp_ = world_->split(members.front(), world_->rank(), name + "]");
  XF_CHECK(fsdp_->size() == static_cast<int>(members.size()), "group '", fsdp_->name(),
           "' came out with ", fsdp_->size(), " ranks, expected ", members.size());
}

Communicator& ProcessGroups::group(MeshDim dim) const { return *groups_.at(dim); }

std::map<std::string, std::map<std::string, OpStats>> ProcessGroups::stats() const {
  std::map<std::string, std::map<std::string, OpStats>> out;
  if (!world_->stats().empty()) out[world_->name()] = world_->stats();
  for (const auto& [dim, comm] : groups_) {
    if (!comm->stats().empty()) out[comm->name()] = comm->stats();
  }
  if (!replica_->stats().empty()) out[replica_->name()] = replica_->stats();
  if (fsdp_ && !fsdp_->stats().empty()) out[fsdp_->name()] = fsdp_->stats();
  return out;
}

void ProcessGroups::reset_stats() {
  world_->reset_stats();
  for (auto& [dim, comm] : groups_) comm->reset_stats();
  replica_->reset_stats();
  if (fsdp_) fsdp_->reset_stats();
}

}  // namespace xfuser::parallel
